"""Issue 16.2: a checkpoint written by other code is never resumed.

A scratch git + DVC project holds a copy of the pflkit package (first on PYTHONPATH) and a stage that
runs Local and FedAvg through ``run_methods`` with checkpoints kept (as a killed stage leaves them).
Editing ``Local.round`` in that copy makes ``dvc repro`` re-run the stage; the re-run must ignore
the old checkpoints (saying so) and give exactly the numbers of a clean run of the edited code. The
notebook twin's digest (``$PFLKIT_TWIN_SHA256``, set by the stage runner) counts the same way."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

import pflkit

pytestmark = pytest.mark.slow

SCRIPT = '''\
import sys
from pathlib import Path

import pflkit
assert Path(pflkit.__file__).resolve().is_relative_to(Path(__file__).resolve().parent), pflkit.__file__
from pflkit.algorithms import FedAvg, Local
from pflkit.data.synthetic import perm_synthetic
from pflkit.engine import FunctionalModel
from pflkit.models import logistic
from pflkit.runner import run_methods

checkpoints, out = sys.argv[1] or None, Path(sys.argv[2])
model = FunctionalModel(lambda: logistic((5,), 2))
methods = {"Local": lambda: Local(model, local_steps=2, lr=0.5, batch_size=5),
           "FedAvg": lambda: FedAvg(model, local_steps=2, lr=0.1, batch_size=5)}
h = run_methods(methods, lambda s: perm_synthetic(6, 30, 5, 0.2, seed=s), [0, 1], 6, 2, show_progress=False,
                checkpoint_dir=checkpoints, checkpoint_every=2, keep_checkpoints=True)
out.parent.mkdir(parents=True, exist_ok=True)
h.to_csv(out, index=False, float_format="%.17g")
'''
STAGE = {"stages": {"curves": {"cmd": "python run.py build/checkpoints results/history.csv",
                               "deps": ["src/pflkit", "run.py"], "outs": ["results/history.csv"]}}}
LOCAL_ROUND = "steps=self.local_steps, lr=self.lr,"


def _project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    shutil.copytree(Path(pflkit.__file__).parent, proj / "src" / "pflkit",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (proj / "run.py").write_text(SCRIPT)
    (proj / "dvc.yaml").write_text(yaml.safe_dump(STAGE, sort_keys=False))
    (proj / ".gitignore").write_text("build/\n")
    return proj


def _env(proj: Path, **extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PFLKIT_TWIN_SHA256", "PFLKIT_PROGRESS")}
    path = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, "PATH": path, "PYTHONPATH": str(proj / "src"), "PYTHONDONTWRITEBYTECODE": "1",
            "OMP_NUM_THREADS": "1", **extra}


def _run(args, cwd, **extra):
    out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=_env(cwd, **extra), timeout=600)
    if out.returncode != 0:
        raise AssertionError(f"{args} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout + out.stderr


def _edit_local_round(proj: Path):
    """A real behaviour change in Local's client step (own_steps: half the step size), nothing else."""
    src = proj / "src/pflkit/algorithms/fedavg.py"
    text = src.read_text()
    start = re.search(r"^class Local\b", text, re.M).start()
    end = text.index("\nclass ", start + 1)
    block = text[start:end]
    assert block.count(LOCAL_ROUND) == 1, "Local.round changed: update this test's edit"
    src.write_text(text[:start] + block.replace(LOCAL_ROUND, "steps=self.local_steps, lr=self.lr * 0.5,")
                   + text[end:])


def _history(path: Path) -> pd.DataFrame:
    return pd.read_csv(path)


def test_checkpoints_written_by_other_code_are_not_resumed(tmp_path):
    dvc = shutil.which("dvc", path=str(Path(sys.executable).parent)) or shutil.which("dvc")
    if dvc is None:
        pytest.skip("dvc not installed")
    proj = _project(tmp_path)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    _run(["git", "init", "-q"], proj)
    _run([dvc, "init", "-q"], proj)
    _run([dvc, "config", "core.analytics", "false"], proj)
    first = _run([dvc, "repro"], proj)
    assert "resuming" not in first and "ignoring" not in first
    old = _history(proj / "results/history.csv")
    checkpoints = sorted(p.name for p in (proj / "build/checkpoints").iterdir())
    assert checkpoints == ["FedAvg__seed0.pt", "FedAvg__seed1.pt", "Local__seed0.pt", "Local__seed1.pt"]
    _run(git + ["add", "-A"], proj)
    _run(git + ["commit", "-qm", "baseline"], proj)

    # control: the same code resumes (reads the finished runs back)
    same = _run([dvc, "repro", "-f"], proj)
    assert "resuming Local seed 0 from round 6 of 6" in same and "ignoring" not in same
    pd.testing.assert_frame_equal(_history(proj / "results/history.csv"), old)

    # edit Local.round: DVC re-runs the stage, which must start every run afresh
    _edit_local_round(proj)
    assert "curves" in _run([dvc, "status"], proj)
    again = _run([dvc, "repro"], proj)
    for name in checkpoints:  # the stage names them as it was given them: relative to the project
        assert (f"ignoring checkpoint build/checkpoints/{name}: written by other code (the pflkit source has "
                "changed since); starting this run afresh") in again
    assert "resuming" not in again
    new = _history(proj / "results/history.csv")
    _run([sys.executable, "run.py", "", str(tmp_path / "clean.csv")], proj)  # the edited code, no checkpoints
    pd.testing.assert_frame_equal(new, _history(tmp_path / "clean.csv"))
    local = (old.method == "Local") & (old["round"] > 0)
    assert not new[local]["value"].equals(old[local]["value"]), "the edit changes Local's numbers"
    fedavg = old.method == "FedAvg"
    pd.testing.assert_frame_equal(new[fedavg], old[fedavg])  # FedAvg's code did not change its numbers


def test_checkpoints_written_for_another_notebook_twin_are_not_resumed(tmp_path):
    proj = _project(tmp_path)
    cmd = [sys.executable, "run.py", "build/checkpoints", "results/history.csv"]
    first = _run(cmd, proj, PFLKIT_TWIN_SHA256="a" * 64)
    assert "resuming" not in first
    same = _run(cmd, proj, PFLKIT_TWIN_SHA256="a" * 64)
    assert "resuming FedAvg seed 1 from round 6 of 6" in same
    other = _run(cmd, proj, PFLKIT_TWIN_SHA256="b" * 64)
    assert "resuming" not in other
    assert other.count("written by other code (the notebook has changed since); starting this run afresh") == 4
    unset = _run(cmd, proj)  # outside a stage run the twin digest is empty: also other code
    assert "resuming" not in unset and unset.count("the notebook has changed since") == 4
