"""A cell store travels as docs/running.md says (issue 54): its records in git, its tensors through DVC. A
project runs charles_fig12's smoke grid (8 cells) into its cells/, then ``git add cells``, ``dvc add
cells/tensors``, ``dvc push`` to a remote; a fresh clone, ``dvc pull``: the stage run there computes no cell and
writes the same outputs, byte for byte. A clone without the pull names the command that brings the tensors."""
import subprocess
import sys
from pathlib import Path

import pytest

from cells_driver import cells_of, computed, launch

OUTPUTS = ("history.csv", "diverged.csv", "metrics.json")


def _sh(*cmd, cwd):
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout


def _stage(out: Path, store: Path) -> tuple[dict, int, str]:
    """(the run's cells, or {} when it failed; its exit status; its stderr)."""
    proc = launch(out, store, "local")
    stdout, stderr = proc.communicate(timeout=600)
    return (cells_of(stdout) if proc.returncode == 0 else {}), proc.returncode, stderr


@pytest.mark.slow
def test_push_a_fresh_clone_pull_brings_every_cell_and_none_reruns(tmp_path):
    dvc, git = [sys.executable, "-m", "dvc"], ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    project, remote, clone = tmp_path / "project", tmp_path / "remote", tmp_path / "clone"
    project.mkdir()
    _sh("git", "init", "-q", cwd=project)
    _sh(*dvc, "init", "-q", cwd=project)
    _sh(*dvc, "config", "core.analytics", "false", cwd=project)
    _sh(*dvc, "remote", "add", "-d", "shared", str(remote), cwd=project)
    cells, status, stderr = _stage(tmp_path / "run", project / "cells")
    assert status == 0, stderr[-2000:]
    assert computed(cells) == 8
    _sh(*dvc, "add", "-q", "cells/tensors", cwd=project)  # the recipe: the tensors through DVC, the rest in git
    _sh("git", "add", "-A", cwd=project)
    _sh(*git, "commit", "-qm", "cells", cwd=project)
    _sh(*dvc, "push", "-q", cwd=project)
    tracked = _sh("git", "ls-files", "cells", cwd=project).split()
    assert sum(p.endswith(".json") and "/plan.json" not in p for p in tracked) == 8
    assert "cells/tensors.dvc" in tracked and not any(p.endswith(".pt") for p in tracked)

    _sh("git", "clone", "-q", str(project), str(clone), cwd=tmp_path)
    _, status, stderr = _stage(tmp_path / "unpulled", clone / "cells")  # records without tensors: the error says
    assert status != 0 and "dvc pull" in stderr  # what to run
    _sh(*dvc, "pull", "-q", cwd=clone)
    again, status, stderr = _stage(tmp_path / "pulled", clone / "cells")
    assert status == 0, stderr[-2000:]
    assert computed(again) == 0 and sum(t["cached"] for t in again["tasks"]) == 8
    for name in OUTPUTS:
        assert (tmp_path / "pulled/results" / name).read_bytes() == (tmp_path / "run/results" / name).read_bytes()
