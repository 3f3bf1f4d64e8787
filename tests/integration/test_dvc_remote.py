"""Sharing results through a DVC remote (issues 28, 58): someone runs a section and pushes it; a reader clones the
repository, pulls, and has that section's results, figures and executed notebooks with nothing to re-run,
and the claims ledger reads the pulled results. The remote is a local folder (the same commands serve S3 or
SSH remotes); the section is charles_fig1 (closed forms, seconds), in a copy of this checkout: the default
pipeline's through docs/pipeline.md's recipe, its own commands run as written, and the paper profile's
(pipelines/paper/dvc.yaml: outputs under build/paper/)."""
import csv
import json
import os
import re
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


def recipe(name: str) -> str:
    """docs/pipeline.md's ``<!-- recipe: name -->`` block: its commands, comments dropped."""
    text = (ROOT / "docs" / "pipeline.md").read_text()
    block = re.search(rf"<!-- recipe: {name} -->\n```bash\n(.*?)```", text, re.S)
    assert block, f"docs/pipeline.md has no recipe block {name!r}"
    lines = [re.sub(r"\s+#\s.*$", "", ln).strip() for ln in block.group(1).splitlines()]
    return "\n".join(ln for ln in lines if ln and not ln.startswith("#"))


def _bash(script: str, cwd: Path) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    os.environ.update({k: os.environ.get(k, v) for k, v in env.items()})
    return _run(["bash", "-euo", "pipefail", "-c", script], cwd)


def test_the_sharing_recipe_as_written_from_a_fresh_clone_to_a_second_one(tmp_path):
    """The team's, the runner's and the reader's blocks of docs/pipeline.md, run as written: only the remote's
    folder and <repo> are this test's, the runner shares one section (`dvc repro charles_fig1_plot` for the
    block's whole `dvc repro`, as the docs say one section travels), the reader's set-up is this checkout's
    environment (a new .venv is what `make setup` tests elsewhere) and `make status` is its command
    (``scripts/pipeline_status.py``, as the Makefile says). The committed headline of the section is made to
    differ first, as if it came from another CPU: the runner's commit must carry the re-run's. Then the
    reader's pull exits 0, the section reads up to date (the ledger alone changed, by its notebooks), nothing
    of the section re-runs, and the page shows the pulled verdicts."""
    assert "\t@$(PY) scripts/pipeline_status.py" in (ROOT / "Makefile").read_text()
    runner = _copy_of_this_checkout(tmp_path / "runner")
    headline = runner / "results/charles_fig1/headline.json"
    headline.write_text(headline.read_text().replace('"delta_max": 0.', '"delta_max": 1.'))  # another CPU's
    _git(runner, "commit", "-qam", "charles_fig1's headline from another machine")
    remote = str(tmp_path / "remote")
    _bash(recipe("team").replace("/mnt/team/pflkit-dvc", remote), runner)
    runner_script = recipe("runner")
    assert runner_script.splitlines()[0] == "dvc repro"
    _bash(runner_script.replace("dvc repro\n", "dvc repro charles_fig1_plot\n", 1), runner)  # the section
    assert _run(["git", "status", "--porcelain"], runner) == ""  # everything the run wrote that git keeps: committed
    assert '"delta_max": 0.' in headline.read_text()

    reader_script = recipe("reader")
    setup = "make setup && source .venv/bin/activate"
    assert setup in reader_script and "make status" in reader_script
    reader_script = (reader_script.replace("<repo>", str(runner))
                     .replace(setup, f"export PATH={Path(sys.executable).parent}:$PATH")
                     .replace("make status", f"{sys.executable} scripts/pipeline_status.py"))
    shown = _bash(reader_script, tmp_path)
    reader = tmp_path / "pflkit-reader"
    for rel in OUTPUTS + ("results/charles_fig1/headline.json",):
        assert (reader / rel).read_bytes() == (runner / rel).read_bytes(), rel
    status_lines = [ln for ln in shown.splitlines() if ln.startswith(("dvc.yaml", "  ", "pipelines/"))]
    assert status_lines[0].startswith("dvc.yaml: ") and "up to date" in status_lines[0], shown
    changed = [ln for ln in status_lines if ln.startswith("  changed")]
    # only the ledger, as docs/pipeline.md says, and only for the section's re-run notebooks (new execution times)
    assert changed == ["  changed (`dvc repro` re-runs them): claims"], shown
    ledger = json.loads(_run([shutil.which("dvc", path=str(Path(sys.executable).parent)) or "dvc", "status",
                              "--json", "claims"], reader))["claims"]
    deps = {k for entry in ledger if isinstance(entry, dict) for k, v in entry.get("changed deps", {}).items()
            if v == "modified"}
    assert deps == {OUTPUTS[2], OUTPUTS[3]}, ledger
    not_here = next(ln for ln in status_lines if ln.startswith("  not run here"))
    assert "charles_fig1," not in not_here + "," and "charles_fig1_plot" not in not_here
    again = _run([shutil.which("dvc", path=str(Path(sys.executable).parent)) or "dvc", "repro", "--single-item",
                  *section("default")], reader)
    assert "Running stage" not in again
    rows = list(csv.DictReader((reader / "build/claims/claims.csv").open()))
    assert {r["verdict"] for r in rows if r["stage"] == "charles_fig1"} == {"holds"}
    assert (reader / "build/claims/index.html").is_file()


@pytest.mark.parametrize("profile", ["paper"])
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
    _run([dvc, "pull", "--allow-missing", "-q", *SECTION], reader)
    for rel in outputs:
        assert (reader / rel).read_bytes() == (runner / rel).read_bytes(), rel
    assert json.loads(_run([dvc, "status", "--json", *SECTION], reader)) == {}
    again = _run([dvc, "repro", "--single-item", *SECTION], reader)
    assert "Running stage" not in again  # pulled, so up to date: nothing re-runs
    nb = json.loads((reader / outputs[2]).read_text())
    assert any(cell.get("outputs") for cell in nb["cells"])  # the executed notebook, with its outputs

    _run([sys.executable, "scripts/claims.py"], reader)  # by hand: the pipelines' columns, paper's included
    table = reader / "build/claims/claims.csv"
    rows = list(csv.DictReader(table.open()))
    verdicts = {r["verdict"] for r in rows if r["stage"] == "charles_fig1" and r["profile"] == profile}
    assert verdicts and verdicts <= {"holds", "does not hold"}
    assert {r["verdict"] for r in rows if r["stage"] == "perm_fig2" and r["profile"] == profile} == {"not run"}
