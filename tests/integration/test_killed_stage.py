"""A stage killed mid-run (SIGKILL to its whole process tree, papermill kernel included) leaves no
metrics, history or figures; the next run (`dvc repro`) resumes from the checkpoints and produces
exactly what an uninterrupted run produces, then removes the checkpoints."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
STAGE, NOTEBOOK = "perm_fig1", "notebooks/perm/fig1_synthetic.ipynb"
# long enough (6 methods x 2 seeds x 40 rounds) to be killed mid-run, short enough for a test
SMALL = {"num_clients": 6, "samples_per_client": 40, "rounds": 40, "local_steps": 2, "seeds": [0, 1],
         "eval_every": 5, "finetune_steps": 2, "device": "cpu"}
CHECKPOINTS = f"build/checkpoints/{STAGE}"  # where experiments.perm.run_curves checkpoints (every 5 rounds)
OUTPUTS = ("results/perm_fig1/metrics.json", "results/perm_fig1/history.csv", "results/perm_fig1/run.json",
           "models/perm_fig1", "reports/perm/fig1_synthetic.ipynb")

pytestmark = pytest.mark.slow


def _project(tmp_path: Path, name: str) -> Path:
    """A minimal project (as in test_stage.py) with the fig1 stage, notebook and params at a small scale."""
    proj = tmp_path / name
    (proj / "notebooks" / "perm").mkdir(parents=True)
    for twin in (NOTEBOOK, NOTEBOOK.replace(".ipynb", ".py")):
        shutil.copy(ROOT / twin, proj / twin)
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    spec["stages"] = {STAGE: spec["stages"][STAGE]}
    spec["stages"][STAGE]["deps"] = [d for d in spec["stages"][STAGE]["deps"] if not d.startswith("src/")]
    spec.pop("plots", None)
    (proj / "dvc.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params = {"defaults": params["defaults"], STAGE: {**params[STAGE], **SMALL}}
    (proj / "params.yaml").write_text(yaml.safe_dump(params))
    _run([sys.executable, "-m", "pflkit", "data", "perm_synthetic"], proj)  # its prepared data (data stage)
    return proj


def _env():
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PATH": path, "OMP_NUM_THREADS": "1"}


def _run(args, cwd):
    out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=_env(), timeout=600)
    if out.returncode != 0:
        raise AssertionError(f"{args} failed:\n{out.stdout}\n{out.stderr}")
    return out


def _kill_tree(proc: subprocess.Popen):
    """SIGKILL the stage process and every descendant (the papermill kernel runs in its own session)."""
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    proc.kill()
    for child in children:
        try:
            os.kill(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)  # reaped here, so its exit status is the signal
    psutil.wait_procs(children, timeout=30)


def test_killed_stage_leaves_nothing_and_the_rerun_resumes_to_the_same_result(tmp_path):
    proj = _project(tmp_path, "killed")
    stage_cmd = [sys.executable, "-m", "pflkit", "stage", STAGE, NOTEBOOK]
    proc = subprocess.Popen(stage_cmd, cwd=proj, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    marker = proj / CHECKPOINTS / "PERM__seed0.pt"  # Local, FedAvg, Localized FedAvg seed 0 are done by then
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert proc.poll() is None, "the stage ended before it could be killed"
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.05)
    finally:
        _kill_tree(proc)
    assert proc.returncode == -signal.SIGKILL
    for rel in OUTPUTS:
        assert not (proj / rel).exists(), f"a killed stage left {rel}"
    left = sorted(p.name for p in (proj / CHECKPOINTS).iterdir())
    assert "Local__seed0.pt" in left and "PERM__seed0.pt" in left
    # a kill during a checkpoint write may leave a hidden temp file (".<name>.*.tmp.pt"), never a torn .pt

    dvc = shutil.which("dvc", path=str(Path(sys.executable).parent)) or shutil.which("dvc")
    if dvc is not None:  # the next `dvc repro` recovers
        _run(["git", "init", "-q"], proj)
        _run([dvc, "init", "-q"], proj)
        _run([dvc, "config", "core.analytics", "false"], proj)
        _run([dvc, "repro", "-q"], proj)
    else:
        _run(stage_cmd, proj)
    for rel in OUTPUTS:
        assert (proj / rel).exists(), f"the re-run did not write {rel}"
    report = (proj / "reports/perm/fig1_synthetic.ipynb").read_text()
    assert "resuming Local seed 0 from round 40 of 40" in report  # finished runs are read back
    assert "resuming PERM seed 0 from round" in report
    assert not (proj / CHECKPOINTS).exists(), "checkpoints are removed after a complete run"

    ref = _project(tmp_path, "uninterrupted")
    _run(stage_cmd, ref)
    assert "resuming" not in (ref / "reports/perm/fig1_synthetic.ipynb").read_text()
    assert (proj / "results/perm_fig1/history.csv").read_text() == \
        (ref / "results/perm_fig1/history.csv").read_text()
    got, want = (json.loads((p / "results/perm_fig1/metrics.json").read_text()) for p in (proj, ref))
    assert got["final"] == want["final"] and got["dataset"] == want["dataset"] == "perm-synthetic"
