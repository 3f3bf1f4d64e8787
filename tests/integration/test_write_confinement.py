"""Issue 29, "Nothing written outside its place": a stage writes only inside its declared outputs. One row per
fault class, each with the message fragment it must give, and each checking that nothing was removed or written:

* a path setting (``alpha_file``) outside perm_fig4's models folder is refused by the config;
* a stage run with another stage's notebook is refused before anything is removed;
* a declared output, or a folder above it, that is a symbolic link is refused before any work; so is an output
  folder whose old contents cannot be removed, or an unwritable build/checkpoints;
* ``pflkit data <key>`` refuses a symbolic-link or read-only data/prepared before the work, and a write failing
  half-way (a full disk) is one line naming the path, with the previous prepared folder left as it was;
* a full build/ never leaves a truncated build/failed/<stage>.ipynb.

Scratch projects as in test_stage_safety.py (a tiny notebook, seconds per run)."""
import builtins
import copy
import errno
import json
import os
import shutil
from pathlib import Path

import nbformat
import pytest
import yaml

from pflkit import notebooks
from pflkit.__main__ import main
from pflkit.config import ConfigError, load_params, validate_stage
from pflkit.notebooks import StageError, notebook_from_twin, run_stage

ROOT = Path(__file__).resolve().parents[2]
STAGE, OTHER = "perm_fig1", "perm_fig6"
NOTEBOOK, OTHER_NOTEBOOK = "notebooks/perm/tiny.ipynb", "notebooks/perm/other.ipynb"
REPORT, OTHER_REPORT = "reports/perm/tiny.ipynb", "reports/perm/other.ipynb"
OUTS = (REPORT, "results/perm_fig1/out.txt", "figures/perm/tiny.txt", "models/perm_fig1")
METRICS = "results/perm_fig1/metrics.json"

TINY = '''# %% tags=["parameters"]
stage = "tiny"
results_dir = "build/smoke/tiny"
figures_dir = "build/smoke/figures"

# %%
print("MARKER-RAN")

# %%
from pflkit.io import write_json, write_text
write_text(f"{results_dir}/out.txt", "x\\n")
write_text(f"{figures_dir}/tiny.txt", "y\\n")
write_json(f"{results_dir}/metrics.json", {"ok": 1})
'''

pytestmark = pytest.mark.slow


def _project(tmp_path: Path, stage_params: dict | None = None) -> Path:
    """dvc.yaml with two stages (ours runs the tiny notebook, OTHER another one), params.yaml with our section."""
    proj = tmp_path / "proj"
    (proj / "notebooks/perm").mkdir(parents=True)
    for rel in (NOTEBOOK, OTHER_NOTEBOOK):
        twin = proj / rel.replace(".ipynb", ".py")
        twin.write_text(TINY)
        nbformat.write(notebook_from_twin(twin), proj / rel)
    ours = {"cmd": f"python -m pflkit stage {STAGE} {NOTEBOOK}", "deps": [NOTEBOOK.replace(".ipynb", ".py")],
            "outs": list(OUTS), "metrics": [{METRICS: {"cache": False}}]}
    other = {"cmd": f"python -m pflkit stage {OTHER} {OTHER_NOTEBOOK}", "outs": [OTHER_REPORT]}
    (proj / "dvc.yaml").write_text(yaml.safe_dump({"stages": {STAGE: ours, OTHER: other}}, sort_keys=False))
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    (proj / "params.yaml").write_text(yaml.safe_dump({"defaults": params["defaults"], STAGE: params[STAGE],
                                                      **(stage_params or {})}))
    return proj


@pytest.fixture
def proj(tmp_path, monkeypatch):
    proj = _project(tmp_path)
    monkeypatch.chdir(proj)
    return proj


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- 1. path settings
@pytest.mark.parametrize("stage, profile, value", [
    ("perm_fig4", "default", "/tmp/alpha.npz"),
    ("perm_fig4", "default", "../outside/alpha.npz"),
    ("perm_fig4", "default", "models/perm_fig4/../../alpha.npz"),
    ("perm_fig4", "default", "results/perm_fig4/alpha.npz"),
    ("perm_fig4", "default", "models/perm_fig4/alpha.txt"),
    ("perm_fig5", "default", "notebooks/alpha.npz"),
    ("perm_fig4", "smoke", "models/perm_fig4/alpha.npz"),  # the pipeline's output, from a profile's run
    ("perm_fig5", "paper", "/" + "x" * 200 + ".npz"),
])
def test_alpha_file_outside_perm_fig4s_models_folder_is_refused(stage, profile, value):
    params = copy.deepcopy(load_params(ROOT / "params.yaml"))
    target = params["profiles"][profile] if profile != "default" else params
    target.setdefault(stage, {})["alpha_file"] = value
    with pytest.raises(ConfigError) as info:
        validate_stage(params, stage, profile)
    msg = str(info.value)
    folder = "models/perm_fig4/" if profile == "default" else f"build/{profile}/perm_fig4/models/"
    assert f"{stage}.alpha_file: " in msg and f"inside {folder}" in msg, msg
    assert repr(value)[:40] in msg and len(msg) < 400, "the value is named, cut to ~80 characters"


def test_committed_alpha_files_are_valid_for_every_profile():
    params = load_params(ROOT / "params.yaml")
    for profile in ("default", *params["profiles"]):
        for stage in ("perm_fig4", "perm_fig5"):
            validate_stage(params, stage, profile)


def test_a_stage_with_a_bad_alpha_file_runs_nothing(tmp_path, monkeypatch):
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    proj = _project(tmp_path, {"perm_fig5": {**params["perm_fig5"], "alpha_file": str(tmp_path / "alpha.npz")}})
    spec = yaml.safe_load((proj / "dvc.yaml").read_text())
    spec["stages"]["perm_fig5"] = {**spec["stages"][STAGE], "cmd": f"python -m pflkit stage perm_fig5 {NOTEBOOK}"}
    (proj / "dvc.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    monkeypatch.chdir(proj)
    before = _files(tmp_path)
    with pytest.raises(ConfigError, match=r"perm_fig5\.alpha_file: .* inside models/perm_fig4/"):
        run_stage("perm_fig5", NOTEBOOK)
    assert _files(tmp_path) == before, "nothing written anywhere"


# --------------------------------------------------------------------------- 2. the stage/notebook pair
@pytest.mark.parametrize("given", [OTHER_NOTEBOOK, OTHER_NOTEBOOK.replace(".ipynb", ".py"),
                                   "notebooks/perm/../perm/other.ipynb", "notebooks/perm/missing.ipynb"])
def test_another_stages_notebook_is_refused_before_anything_is_removed(proj, given, capfd):
    (proj / OTHER_REPORT).parent.mkdir(parents=True)
    (proj / OTHER_REPORT).write_text("the other stage's executed report\n")
    (proj / "results/perm_fig1").mkdir(parents=True)
    (proj / "results/perm_fig1/out.txt").write_text("old\n")
    before = _files(proj)
    with pytest.raises(StageError) as info:
        run_stage(STAGE, given)
    msg = str(info.value)
    assert f"stage {STAGE}: notebook {given} is not this stage's" in msg and f"runs {NOTEBOOK} for it" in msg, msg
    assert _files(proj) == before, "nothing removed or written (the other stage's report is still there)"
    assert "running" not in capfd.readouterr().err


def test_the_stages_own_twin_or_absolute_path_is_accepted(proj):
    assert run_stage(STAGE, str(proj / NOTEBOOK)) == proj / REPORT
    assert run_stage(STAGE, NOTEBOOK.replace(".ipynb", ".py")) == proj / REPORT


# --------------------------------------------------------------------------- 3. symbolic links, read-only places
@pytest.mark.parametrize("link, expected", [
    ("results/perm_fig1", "results/perm_fig1 is a symbolic link"),
    ("results", "results is a symbolic link"),
    ("reports/perm", "reports/perm is a symbolic link"),
    ("figures", "figures is a symbolic link"),
    ("models/perm_fig1", "models/perm_fig1 is a symbolic link"),
    ("build", "build is a symbolic link"),
    ("results/perm_fig1@inside", "results/perm_fig1 is a symbolic link"),  # even to a folder of the project
])
def test_a_symlinked_output_or_output_folder_is_refused_before_any_work(proj, tmp_path, link, expected, capfd):
    link, _, where = link.partition("@")
    target = proj / "build/elsewhere" if where else tmp_path / "elsewhere"
    target.mkdir(parents=True)
    (target / "keep.txt").write_text("not ours\n")
    (proj / link).parent.mkdir(parents=True, exist_ok=True)
    (proj / link).symlink_to(target, target_is_directory=True)
    outside, inside = _files(tmp_path / "elsewhere") if not where else {}, _files(proj)
    with pytest.raises(StageError) as info:
        run_stage(STAGE, NOTEBOOK)
    msg = str(info.value)
    assert expected in msg and "nothing was run or removed" in msg, msg
    assert "running" not in capfd.readouterr().err, "nothing was run"
    assert _files(proj) == inside and (where or _files(tmp_path / "elsewhere") == outside)


def test_an_output_folder_whose_old_contents_cannot_be_removed_is_refused(proj, monkeypatch, capfd):
    sub = proj / "models/perm_fig1/sub"
    sub.mkdir(parents=True)
    (sub / "model.pt").write_text("old model\n")
    (proj / "results/perm_fig1").mkdir(parents=True)
    (proj / "results/perm_fig1/out.txt").write_text("old\n")
    before = _files(proj)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != sub and real_access(p, mode, **kw))
    with pytest.raises(StageError, match=r"models/perm_fig1/sub: its old contents cannot be removed: .*not writable"):
        run_stage(STAGE, NOTEBOOK)
    assert _files(proj) == before and "running" not in capfd.readouterr().err


def test_an_unwritable_checkpoint_folder_is_refused(proj, monkeypatch):
    (proj / "build/checkpoints").mkdir(parents=True)
    real_access = os.access
    blocked = proj / "build/checkpoints"
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != blocked and real_access(p, mode, **kw))
    with pytest.raises(StageError, match=r"build/checkpoints: .*not writable"):
        run_stage(STAGE, NOTEBOOK)
    assert not any((proj / o).exists() for o in (*OUTS, METRICS))


# --------------------------------------------------------------------------- 4. pflkit data <key>
@pytest.mark.parametrize("fault, expected", [
    ("readonly-prepared", "cannot create it: data/prepared is not writable"),
    ("readonly-dataset", ": data/prepared/perm-synthetic is not writable"),
    ("symlink-prepared", ": data/prepared is a symbolic link"),
])
def test_data_refuses_a_read_only_or_symlinked_prepared_folder_before_the_work(tmp_path, monkeypatch, capsys,
                                                                                 fault, expected):
    proj = _project(tmp_path)
    monkeypatch.chdir(proj)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if fault == "symlink-prepared":
        (proj / "data").mkdir()
        (proj / "data/prepared").symlink_to(elsewhere, target_is_directory=True)
    else:
        blocked = proj / ("data/prepared" if fault == "readonly-prepared" else "data/prepared/perm-synthetic")
        blocked.mkdir(parents=True)
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != blocked and real_access(p, mode, **kw))
    work = []
    from pflkit.data import prepared
    monkeypatch.setattr(prepared, "prepare_synthetic", lambda *a, **k: work.append(a))
    assert main(["data", "perm_synthetic"]) == 1
    err = capsys.readouterr().err
    assert "cannot write data/prepared/perm-synthetic/perm_fig1: " in err and expected in err, err
    assert "nothing was prepared" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and not work, "one line, before any work"
    assert not list(elsewhere.iterdir()) and not [p for p in (proj / "data").rglob("*") if p.is_file()]


class _DiskFull:
    """A ``builtins.open`` whose files under ``folder`` share ``limit`` bytes: a write past it writes what fits,
    then raises OSError(ENOSPC), as a full disk does."""

    def __init__(self, folder: Path, limit: int):
        self.folder, self.limit, self.real = folder.resolve(), limit, builtins.open

    def used(self, exclude: Path) -> int:
        return sum(p.stat().st_size for p in self.folder.rglob("*") if p.is_file() and p != exclude)

    def __call__(self, file, mode="r", *args, **kwargs):
        f = self.real(file, mode, *args, **kwargs)
        path = Path(os.path.abspath(file)) if isinstance(file, (str, os.PathLike)) else None
        if path is None or not any(c in mode for c in "wax") or not path.is_relative_to(self.folder):
            return f
        return _Limited(f, path, self)


class _Limited:
    def __init__(self, f, path: Path, disk: _DiskFull):
        self._f, self._path, self._disk, self._n = f, path, disk, 0

    def write(self, data):
        free = self._disk.limit - self._disk.used(self._path) - self._n
        if len(data) > free:
            self._f.write(data[:max(free, 0)])
            self._f.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self._path))
        self._n += len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __iter__(self):
        return iter(self._f)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


def test_data_on_a_full_disk_is_one_line_and_leaves_the_previous_folder(tmp_path, monkeypatch, capsys):
    proj = _project(tmp_path)
    monkeypatch.chdir(proj)
    assert main(["data", "perm_synthetic"]) == 0
    prepared = proj / "data/prepared"
    before = _files(prepared)
    capsys.readouterr()
    real_write_bytes = Path.write_bytes

    def write_bytes(self, data):
        if self.suffix == ".npy":
            real_write_bytes(self, data[:100])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real_write_bytes(self, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    assert main(["data", "perm_synthetic"]) == 1
    err = capsys.readouterr().err
    assert "cannot write " in err and "data/prepared/perm-synthetic/perm_fig1" in err, err
    assert "No space left on device" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert _files(prepared) == before, "the previous prepared folder is left whole, no temp folder beside it"


# --------------------------------------------------------------------------- 5. build/ full
@pytest.mark.parametrize("factor", [1.3, 4.0, 8.0])
def test_a_full_build_folder_never_leaves_a_truncated_failed_notebook(proj, monkeypatch, factor):
    failed = proj / "build/failed/perm_fig1.ipynb"
    failed.parent.mkdir(parents=True)
    failed.write_text("{}")  # a stale one from an earlier run: never passes for this run's
    initial = len(nbformat.writes(notebook_from_twin(proj / NOTEBOOK.replace(".ipynb", ".py"))))
    monkeypatch.setattr(builtins, "open", _DiskFull(proj / "build", int(factor * initial) + 2))
    with pytest.raises(StageError, match="No space left on device") as info:
        run_stage(STAGE, NOTEBOOK)
    monkeypatch.undo()
    msg = str(info.value)
    assert not any((proj / o).exists() for o in (*OUTS, METRICS)), "no outputs"
    assert not [p for p in (proj / "build").rglob("*") if p.name.endswith(".part")]
    if failed.exists():
        nb = nbformat.read(failed, as_version=4)  # whole: it parses
        nbformat.validate(nb)
        assert "build/failed/perm_fig1.ipynb" in msg and json.loads(failed.read_text())["cells"]
    else:
        assert "could not be kept whole" in msg and "no partial copy" in msg, msg


def test_a_failed_notebook_that_cannot_be_written_whole_is_not_kept(tmp_path):
    tmp = tmp_path / "running/run.ipynb"
    tmp.parent.mkdir()
    tmp.write_text('{"cells": [{"cell_type": "co')  # truncated by a full disk
    failed = tmp_path / "failed/stage.ipynb"
    where = notebooks._keep_failed(tmp, failed, None, tmp_path)
    assert not failed.exists() and "could not be kept whole" in where
    text = json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    where = notebooks._keep_failed(tmp, failed, text, tmp_path)
    assert failed.read_text() == text and where == "the executed notebook is in failed/stage.ipynb"
    shutil.rmtree(tmp_path / "failed")
