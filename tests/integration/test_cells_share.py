"""A cell store travels as docs/running.md says (issue 54): its records in git, its tensors through DVC. A
project runs charles_fig12's smoke grid (8 cells) into its cells/, then ``git add cells``, ``dvc add
cells/tensors``, ``dvc push`` to a remote; a fresh clone, ``dvc pull``: the stage run there computes no cell and
writes the same outputs, byte for byte. A clone without the pull names the command that brings the tensors."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("cells_driver.py")
OUTPUTS = ("history.csv", "diverged.csv", "metrics.json")


def _sh(*cmd, cwd):
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout


def _stage(out: Path, store: Path) -> tuple[dict, subprocess.CompletedProcess]:
    env = {**os.environ, "PFLKIT_EXECUTOR": "local", "PFLKIT_CELLS": str(store), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, str(DRIVER), str(out)], cwd=ROOT, env=env, capture_output=True, text=True)
    return (json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}), done


def _computed(cells: dict) -> int:
    return sum(t["computed"] for t in cells["tasks"])


@pytest.mark.slow
def test_push_a_fresh_clone_pull_brings_every_cell_and_none_reruns(tmp_path):
    dvc, git = [sys.executable, "-m", "dvc"], ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    project, remote, clone = tmp_path / "project", tmp_path / "remote", tmp_path / "clone"
    project.mkdir()
    _sh("git", "init", "-q", cwd=project)
    _sh(*dvc, "init", "-q", cwd=project)
    _sh(*dvc, "config", "core.analytics", "false", cwd=project)
    _sh(*dvc, "remote", "add", "-d", "shared", str(remote), cwd=project)
    cells, done = _stage(tmp_path / "run", project / "cells")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _computed(cells) == 8
    _sh(*dvc, "add", "-q", "cells/tensors", cwd=project)  # the recipe: the tensors through DVC, the rest in git
    _sh("git", "add", "-A", cwd=project)
    _sh(*git, "commit", "-qm", "cells", cwd=project)
    _sh(*dvc, "push", "-q", cwd=project)
    tracked = _sh("git", "ls-files", "cells", cwd=project).split()
    assert sum(p.endswith(".json") and "/plan.json" not in p for p in tracked) == 8
    assert "cells/tensors.dvc" in tracked and not any(p.endswith(".pt") for p in tracked)

    _sh("git", "clone", "-q", str(project), str(clone), cwd=tmp_path)
    _, done = _stage(tmp_path / "unpulled", clone / "cells")  # records without tensors: the error says what to run
    assert done.returncode != 0 and "dvc pull" in done.stderr
    _sh(*dvc, "pull", "-q", cwd=clone)
    again, done = _stage(tmp_path / "pulled", clone / "cells")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _computed(again) == 0 and sum(t["cached"] for t in again["tasks"]) == 8
    for name in OUTPUTS:
        assert (tmp_path / "pulled/results" / name).read_bytes() == (tmp_path / "run/results" / name).read_bytes()
