"""The library (algorithms, engine, data, models, theory, eval, the run loop) under the pipeline (issue 53): it
imports without pydantic, yaml, papermill or dvc, and the prepared-data layout it names on its own is the one the
pipeline's stage table writes (the import-linter contract itself: tests/unit/test_import_contracts.py)."""
import subprocess
import sys
from pathlib import Path

import pytest

from pflkit import progress, runner, stage_env, stages
from pflkit.data import prepared

ROOT = Path(__file__).resolve().parents[2]

#: (the library's name, the pipeline's name for the same thing)
SAME = [
    ("prepared.PREPARED", prepared.PREPARED, "stages.PREPARED", stages.PREPARED),
    ("prepared.REQUIRE_ENV", prepared.REQUIRE_ENV, "stage_env.REQUIRE_PREPARED", stage_env.REQUIRE_PREPARED),
    ("runner.TWIN_ENV", runner.TWIN_ENV, "stage_env.TWIN_SHA256", stage_env.TWIN_SHA256),
    ("progress.ENV", progress.ENV, "stage_env.PROGRESS", stage_env.PROGRESS),
]


@pytest.mark.parametrize("lib, lib_value, pipe, pipe_value", SAME, ids=[s[0] for s in SAME])
def test_the_library_and_the_pipeline_name_the_same_layout(lib, lib_value, pipe, pipe_value):
    assert lib_value == pipe_value, f"{lib} = {lib_value!r}, {pipe} = {pipe_value!r}"


@pytest.mark.parametrize("data_stage", stages.DATA_STAGES, ids=[d.key for d in stages.DATA_STAGES])
def test_every_folder_a_data_stage_writes_names_that_stage_in_the_librarys_messages(data_stage, tmp_path):
    """``prepared.WRITTEN_BY`` (the library's) maps each data stage's folder to the stage: a damaged file there
    names the stage to re-run, as the stage table declares it."""
    assert prepared.WRITTEN_BY.get(data_stage.dataset) == data_stage.key
    for out in data_stage.out_paths:
        assert prepared._stage_of(tmp_path / out) == data_stage.name, out
    assert set(prepared.WRITTEN_BY) == {d.dataset for d in stages.DATA_STAGES}


#: the packages the library must import without (a stub that refuses them stands in for an install without them)
ABSENT = ("pydantic", "yaml", "papermill", "dvc")
LIBRARY = ("pflkit.algorithms", "pflkit.engine", "pflkit.data", "pflkit.data.prepared", "pflkit.models",
           "pflkit.theory", "pflkit.eval", "pflkit.runner")


def test_the_library_imports_without_pydantic_yaml_papermill_or_dvc():
    """Every library package and module imports with the four refused (what the forbidden contract states for the
    static imports, here for the imports Python runs), and none of them loads a pipeline module."""
    code = "\n".join([
        "import importlib, importlib.abc, sys",
        f"ABSENT = {ABSENT!r}",
        "class Refuse(importlib.abc.MetaPathFinder):",
        "    def find_spec(self, name, path=None, target=None):",
        "        if name.split('.')[0] in ABSENT:",
        "            raise ModuleNotFoundError(f'No module named {name!r} (refused)', name=name)",
        "sys.meta_path.insert(0, Refuse())",
        f"for m in {LIBRARY!r}:",
        "    importlib.import_module(m)",
        "pipeline = ('pflkit.config', 'pflkit.stages', 'pflkit.notebooks', 'pflkit.experiments', 'pflkit.report',",
        "            'pflkit.canary', 'pflkit.data_stages', 'pflkit.model_store', 'pflkit.plotting')",
        "print(sorted(m for m in sys.modules if m.startswith(pipeline)))"])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["[]"], out.stdout
