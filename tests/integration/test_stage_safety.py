"""The stage runner's guarantees, on a tiny notebook in a scratch project (seconds per run): it executes
the py:percent twin (what DVC tracks), a failure at any point leaves none of the stage's outputs,
unwritable output folders are named before any work, files get the usual mode, per-run temp files,
progress lines on the terminal, the twin's hash for the kernel, and no TCP warning or blank stderr.

The full perm_fig1 notebook under `dvc repro` is covered in test_stage.py (twin vs .ipynb edits too)."""
import errno
import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from pflkit import notebooks
from pflkit.notebooks import StageError, notebook_from_twin, run_stage

ROOT = Path(__file__).resolve().parents[2]
STAGE = "perm_fig1"  # any registered stage: its params section validates, the notebook is ours
NOTEBOOK = "notebooks/perm/tiny.ipynb"
TWIN = NOTEBOOK.replace(".ipynb", ".py")
REPORT = "reports/perm/tiny.ipynb"
OUTPUTS = (REPORT, "results/perm_fig1/out.txt", "results/perm_fig1/metrics.json", "figures/perm/tiny.txt")

TINY = '''# %% tags=["parameters"]
stage = "tiny"
results_dir = "build/smoke/tiny"
figures_dir = "build/smoke/figures"

# %%
import hashlib, os, sys
from pflkit import progress
from pflkit.io import write_json, write_text

progress.note("hello from the kernel")
print("MARKER-ORIGINAL")
print(file=sys.stderr)  # a blank stderr output: not kept
print("   ", file=sys.stderr)
write_text(f"{results_dir}/out.txt", "x\\n")
write_text(f"{figures_dir}/tiny.txt", "y\\n")
write_json(f"{results_dir}/metrics.json", {"twin_sha256": os.environ.get("PFLKIT_TWIN_SHA256")})
'''

pytestmark = pytest.mark.slow


def tiny_project(tmp_path: Path, name: str = "proj") -> Path:
    """dvc.yaml with one stage running the tiny notebook, params.yaml with that stage's section."""
    proj = tmp_path / name
    (proj / "notebooks/perm").mkdir(parents=True)
    (proj / TWIN).write_text(TINY)
    nbformat.write(notebook_from_twin(proj / TWIN), proj / NOTEBOOK)
    stage = {"cmd": f"python -m pflkit stage {STAGE} {NOTEBOOK}", "deps": [TWIN],
             "params": ["defaults", STAGE], "outs": [o for o in OUTPUTS if "metrics" not in o],
             "metrics": [{"results/perm_fig1/metrics.json": {"cache": False}}]}
    (proj / "dvc.yaml").write_text(yaml.safe_dump({"stages": {STAGE: stage}}, sort_keys=False))
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    (proj / "params.yaml").write_text(yaml.safe_dump({"defaults": params["defaults"], STAGE: params[STAGE]}))
    return proj


@pytest.fixture
def proj(tmp_path, monkeypatch):
    proj = tiny_project(tmp_path)
    monkeypatch.chdir(proj)
    return proj


def _outputs_left(proj):
    return [rel for rel in OUTPUTS if (proj / rel).exists()]


def _stderr_texts(nb):
    return ["".join(o.get("text", "")) for c in nb.cells if c.cell_type == "code"
            for o in c.outputs if o.get("name") == "stderr"]


def test_stage_runs_the_twin_sets_the_env_and_keeps_the_report_clean(proj, capfd):
    report = run_stage(STAGE, NOTEBOOK)
    assert report == proj / REPORT and _outputs_left(proj) == list(OUTPUTS)
    text = report.read_text()
    assert "MARKER-ORIGINAL" in text
    nb = nbformat.read(report, as_version=4)
    assert all(t.strip() for t in _stderr_texts(nb)), "blank stderr outputs are dropped"
    assert nb.metadata.papermill.input_path == TWIN
    sha = hashlib.sha256((proj / TWIN).read_bytes()).hexdigest()
    assert json.loads((proj / "results/perm_fig1/metrics.json").read_text()) == {"twin_sha256": sha}
    err = capfd.readouterr().err
    assert f"{STAGE}: running {TWIN} ..." in err
    assert "hello from the kernel" in err and f"[{STAGE} " in err
    assert f"{STAGE}: done in " in err
    assert "without encryption" not in err + text
    assert "PFLKIT_PROGRESS" not in os.environ and "PFLKIT_TWIN_SHA256" not in os.environ
    assert not list((proj / "build/running").iterdir()), "per-run files are removed"

    # an edit made only in the .ipynb is not executed; an edit in the twin is
    nb_in = nbformat.read(proj / NOTEBOOK, as_version=4)
    for cell in nb_in.cells:
        cell.source = cell.source.replace("MARKER-ORIGINAL", "MARKER-IPYNB-ONLY")
    nbformat.write(nb_in, proj / NOTEBOOK)
    assert "MARKER-IPYNB-ONLY" not in run_stage(STAGE, NOTEBOOK).read_text()
    assert any("code differs" in p for p in notebooks.check_twins(proj))
    (proj / TWIN).write_text(TINY.replace("MARKER-ORIGINAL", "MARKER-TWIN"))
    assert "MARKER-TWIN" in run_stage(STAGE, NOTEBOOK).read_text()


def test_full_disk_at_the_report_write_leaves_no_output(proj, monkeypatch):
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        if Path(dst) == proj / REPORT:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(StageError, match=r"No space left on device") as info:
        run_stage(STAGE, NOTEBOOK)
    assert REPORT in str(info.value) and "build/failed/perm_fig1.ipynb" in str(info.value)
    assert _outputs_left(proj) == []
    assert not list(proj.rglob("*.tmp*")), "no temporary report is left"
    failed = nbformat.read(proj / "build/failed/perm_fig1.ipynb", as_version=4)
    assert "MARKER-ORIGINAL" in json.dumps(failed)  # the executed notebook, kept for inspection


def test_full_disk_while_writing_the_report_leaves_no_output(proj, monkeypatch):
    real_write = nbformat.write

    def write(nb, fp, *args, **kwargs):
        if ".tmp" in Path(fp).name and Path(fp).parent == proj / "reports/perm":
            Path(fp).write_text('{"cells": [')  # truncated
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(fp))
        return real_write(nb, fp, *args, **kwargs)

    monkeypatch.setattr(nbformat, "write", write)
    with pytest.raises(StageError, match=r"No space left on device"):
        run_stage(STAGE, NOTEBOOK)
    assert _outputs_left(proj) == [] and not list(proj.rglob("*.tmp*"))
    assert (proj / "build/failed/perm_fig1.ipynb").exists()


def test_a_later_success_removes_the_stale_failed_notebook(proj):
    failed = proj / "build/failed/perm_fig1.ipynb"
    failed.parent.mkdir(parents=True)
    failed.write_text("{}")
    run_stage(STAGE, NOTEBOOK)
    assert not failed.exists()


def test_unwritable_output_folder_is_named_before_any_work(proj, monkeypatch, capfd):
    (proj / "results/perm_fig1").mkdir(parents=True)
    (proj / "results/perm_fig1/out.txt").write_text("old\n")
    real_access = os.access
    blocked = proj / "results/perm_fig1"
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != blocked and real_access(p, mode, **kw))
    with pytest.raises(StageError) as info:
        run_stage(STAGE, NOTEBOOK)
    msg = str(info.value)
    assert "results/perm_fig1: " in msg and "not writable" in msg and "permission denied" in msg
    assert str(proj) not in msg, "folders are named relative to the project"
    assert (proj / "results/perm_fig1/out.txt").read_text() == "old\n", "nothing was removed"
    assert f"{STAGE}: running" not in capfd.readouterr().err, "nothing was run"


def test_output_folder_that_is_a_file_is_named(proj):
    (proj / "figures").write_text("not a folder")
    with pytest.raises(StageError, match=r"figures/perm: cannot create it: figures is a file, not a folder"):
        run_stage(STAGE, NOTEBOOK)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permission bits (the os.access test covers it)")
def test_read_only_folder_on_disk_fails_with_a_message_not_a_traceback(tmp_path):
    proj = tiny_project(tmp_path)
    (proj / "results/perm_fig1").mkdir(parents=True)
    os.chmod(proj / "results/perm_fig1", 0o555)
    try:
        out = _stage_cli(proj)
    finally:
        os.chmod(proj / "results/perm_fig1", 0o755)
    assert out.returncode == 1
    assert "results/perm_fig1: " in out.stderr and "not writable" in out.stderr
    assert "Traceback" not in out.stderr


def test_read_only_folder_cli_message_has_no_traceback(tmp_path):
    proj = tiny_project(tmp_path)
    (proj / "results").write_text("a file where the results folder should be")
    out = _stage_cli(proj)
    assert out.returncode == 1
    assert "results/perm_fig1: cannot create it: results is a file, not a folder" in out.stderr
    assert "Traceback" not in out.stderr and "OSError" not in out.stderr


def _stage_cli(proj, *args):
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "pflkit", "stage", STAGE, NOTEBOOK, *args], cwd=proj,
                          capture_output=True, text=True, env=env, timeout=300)


def test_cli_echoes_progress_lines_on_stderr(tmp_path):
    proj = tiny_project(tmp_path)
    out = _stage_cli(proj)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert any(line.startswith(f"[{STAGE} ") and line.endswith("] hello from the kernel") for line in lines)
    assert f"{STAGE}: running {TWIN} ..." in out.stderr and f"{STAGE}: done in " in out.stderr
    assert "without encryption" not in out.stderr
    assert f"{STAGE}: wrote " in out.stdout


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)], ids=["022", "077"])
def test_report_and_failed_notebook_follow_the_umask(proj, umask, mode):
    old = os.umask(umask)
    try:
        run_stage(STAGE, NOTEBOOK)
        for rel in OUTPUTS:
            assert stat.S_IMODE((proj / rel).stat().st_mode) == mode, rel
        (proj / TWIN).write_text(TINY + "\nraise RuntimeError('boom')\n")
        with pytest.raises(Exception, match="boom"):
            run_stage(STAGE, NOTEBOOK)
        assert stat.S_IMODE((proj / "build/failed/perm_fig1.ipynb").stat().st_mode) == mode
    finally:
        os.umask(old)


def test_each_run_has_its_own_temp_notebook_and_stale_ones_are_removed(proj, monkeypatch):
    seen = []
    real = notebooks.execute_notebook

    def spy(input_path, output_path, **kwargs):
        seen.append(Path(output_path))
        return real(input_path, output_path, **kwargs)

    monkeypatch.setattr(notebooks, "execute_notebook", spy)
    running = proj / "build/running"
    running.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = running / f"{STAGE}.{dead.pid}.abc123.ipynb"
    stale.write_text("{}")
    run_stage(STAGE, NOTEBOOK)
    run_stage(STAGE, NOTEBOOK)
    assert not stale.exists(), "a killed run's temp notebook is removed"
    assert len(set(seen)) == 2 and all(p.parent == running for p in seen)
    assert all(p.name.startswith(f"{STAGE}.{os.getpid()}.") and p.suffix == ".ipynb" for p in seen)
    assert not list(running.iterdir())


KERNEL_CODE = ('import sys\nprint("out", flush=True)\nprint("err", file=sys.stderr, flush=True)\n'
               'print("mid", flush=True)\nprint(file=sys.stderr, flush=True)\n')  # a blank stderr output last


def test_execution_helper_runs_the_kernel_over_ipc_without_the_tcp_warning(tmp_path, capfd):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(KERNEL_CODE)])
    nb.metadata["kernelspec"] = dict(notebooks.KERNELSPEC)
    nbformat.write(nb, tmp_path / "k.ipynb")
    executed = notebooks.execute_notebook(tmp_path / "k.ipynb", tmp_path / "out.ipynb", cwd=tmp_path)
    outputs = executed.cells[0].outputs
    assert [o.text for o in outputs if o.name == "stderr"] == ["err\n"]  # the blank one is dropped
    assert "".join(o.text for o in outputs if o.name == "stdout") == "out\nmid\n"
    err = capfd.readouterr().err
    assert "without encryption" not in err + (tmp_path / "out.ipynb").read_text()
    assert "running over TCP" not in err


def test_refresh_runs_the_kernel_over_ipc_without_the_tcp_warning(tmp_path, capfd):
    twin = tmp_path / "k.py"
    twin.write_text("# %%\n" + KERNEL_CODE)
    out = notebooks.refresh(twin)
    assert "without encryption" not in capfd.readouterr().err + out.read_text()
    assert {o.name for o in nbformat.read(out, as_version=4).cells[0].outputs} == {"stdout"}


def test_ipc_kernel_manager_uses_ipc_in_a_private_folder_removed_afterwards():
    with notebooks.ipc_kernel() as manager:
        km = manager(kernel_name="python3")
        folder = Path(km.ip).parent
        assert km.transport == "ipc" and folder.is_dir() and len(km.ip) < 80
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert not folder.exists()
