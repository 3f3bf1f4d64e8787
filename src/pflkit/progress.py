"""Progress a user can see: tqdm bars in the notebook, and one line per finished unit of work on
the terminal that runs the stage.

A notebook's kernel has no terminal: ``python -m pflkit stage`` (what ``dvc repro`` calls) sets
``PFLKIT_PROGRESS`` to a file, the kernel appends lines to it with :func:`note`, and the stage runner
echoes each new line to its own stderr as it appears. Outside a stage run (JupyterLab, nbval) the
variable is unset and :func:`note` writes nothing: the tqdm bar is the progress there.
"""
from __future__ import annotations

import os
import time

from tqdm.auto import tqdm


#: the environment variable naming a file the progress lines are appended to (the pipeline's stage runner sets
#: it and echoes the file: :data:`pflkit.stage_env.PROGRESS`); unset: bars on the terminal
ENV = "PFLKIT_PROGRESS"

__all__ = ["ENV", "note", "bar", "Timer", "tqdm"]


def note(message: str) -> None:
    """One progress line for the terminal of a stage run (nothing outside one)."""
    path = os.environ.get(ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(message.rstrip("\n") + "\n")


def bar(total: int, desc: str, disable: bool = False, **kwargs) -> tqdm:
    """The shared progress bar: a widget in JupyterLab (ipywidgets), text in a terminal; cleared when done.
    Off inside a stage run (``PFLKIT_PROGRESS`` set): there the terminal gets :func:`note`'s lines, and the
    executed report in reports/ keeps no progress-bar outputs."""
    return tqdm(total=total, desc=desc, disable=disable or bool(os.environ.get(ENV)), leave=False, **kwargs)


class Timer:
    """Elapsed wall time since creation, formatted for progress lines (``12.3 s``)."""

    def __init__(self):
        self.start = time.perf_counter()

    def __str__(self) -> str:
        return f"{time.perf_counter() - self.start:.1f} s"
