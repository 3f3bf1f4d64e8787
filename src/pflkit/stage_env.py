"""The environment variables through which the stage runner (``python -m pflkit stage``,
:mod:`pflkit.notebooks`) talks to the notebook kernel it starts. Defined here once, in a module that imports
nothing, so the runner's process never imports torch to name them."""

#: a file the kernel appends progress lines to; the runner echoes them (:mod:`pflkit.progress`)
PROGRESS = "PFLKIT_PROGRESS"
#: the SHA-256 of the stage's notebook twin, recorded in every checkpoint's identity (:mod:`pflkit.runner`)
TWIN_SHA256 = "PFLKIT_TWIN_SHA256"
#: 1: the stage reads its data only from data/prepared/ (the data stages' outputs DVC tracks), never from the
#: sources: the library's switch, :data:`pflkit.data.prepared.REQUIRE_ENV`, named again here because the library
#: imports no pipeline module and this one imports nothing (tests/unit/test_library_pipeline.py: the same name)
REQUIRE_PREPARED = "PFLKIT_REQUIRE_PREPARED"
