"""Sharing results through a DVC remote (issue 28): someone runs a section and pushes it; a reader clones the
repository, pulls, and has that section's results, figures and executed notebooks with nothing to re-run,
and the claims ledger reads the pulled results. The remote is a local folder (the same commands serve S3 or
SSH remotes); the section is charles_fig1 (closed forms, seconds), in a copy of this checkout: the default
pipeline's, and the paper profile's (pipelines/paper/dvc.yaml: outputs under build/paper/)."""
import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
from pflkit.stages import pipeline_file, profile_path  # noqa: E402

OUTPUTS = ("results/charles_fig1/metrics.json", "figures/charles/fig1_frontiers_gamma_and_K.png",
           "reports/charles/fig1_frontiers_gamma_and_K.ipynb", "reports/charles/fig1_frontiers_gamma_and_K_plot.ipynb")


def section(profile: str) -> tuple[str, ...]:
    """charles_fig1's two stages as DVC names them in ``profile``'s pipeline file."""
    prefix = "" if profile == "default" else f"{pipeline_file(profile)}:"
    return tuple(f"{prefix}{s}" for s in ("charles_fig1", "charles_fig1_plot"))

pytestmark = pytest.mark.slow


def _run(args, cwd):
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        raise AssertionError(f"{args} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def _copy_of_this_checkout(dest: Path) -> Path:
    """The files git knows here (tracked and new, not ignored), as a fresh repository with one commit."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, listed):
        if (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    _git(dest, "init", "-q")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-qm", "copy")
    return dest


def _git(cwd, *args):
    return _run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd)


@pytest.mark.parametrize("profile", ["default", "paper"])
def test_push_a_section_then_a_fresh_clone_pulls_it_and_nothing_re_runs(tmp_path, profile):
    dvc = shutil.which("dvc", path=str(Path(sys.executable).parent)) or shutil.which("dvc")
    if dvc is None:
        pytest.skip("dvc not installed")
    SECTION = section(profile)
    outputs = [profile_path(rel, profile) for rel in OUTPUTS]
    runner = _copy_of_this_checkout(tmp_path / "runner")
    _run([dvc, "repro", "--single-item", *SECTION], runner)
    _run([dvc, "remote", "add", "--default", "shared", str(tmp_path / "remote")], runner)
    _git(runner, "add", "-A")
    _git(runner, "commit", "-qm", "charles_fig1 run; the team's remote")
    pushed = _run([dvc, "push", *SECTION], runner)
    assert "pushed" in pushed

    reader = tmp_path / "reader"
    _run(["git", "clone", "-q", str(runner), str(reader)], tmp_path)
    assert not (reader / outputs[0]).exists()
    _run([dvc, "pull", *SECTION], reader)
    for rel in outputs:
        assert (reader / rel).read_bytes() == (runner / rel).read_bytes(), rel
    assert json.loads(_run([dvc, "status", "--json", *SECTION], reader)) == {}
    again = _run([dvc, "repro", "--single-item", *SECTION], reader)
    assert "Running stage" not in again  # pulled, so up to date: nothing re-runs
    nb = json.loads((reader / outputs[2]).read_text())
    assert any(cell.get("outputs") for cell in nb["cells"])  # the executed notebook, with its outputs

    if profile == "default":
        _run([sys.executable, "scripts/claims.py"], reader)  # the ledger (and its page) from what was pulled
        table = reader / "results/claims.csv"
    else:  # the paper pipeline's ledger command: both profiles' columns
        _run([sys.executable, "scripts/claims.py", "--profiles", f"default,{profile}", "--out", f"build/{profile}"],
             reader)
        table = reader / f"build/{profile}/claims.csv"
    rows = list(csv.DictReader(table.open()))
    verdicts = {r["verdict"] for r in rows if r["stage"] == "charles_fig1" and r["profile"] == profile}
    assert verdicts and verdicts <= {"holds", "does not hold"}
    assert {r["verdict"] for r in rows if r["stage"] == "perm_fig2" and r["profile"] == profile} == {"not run"}
