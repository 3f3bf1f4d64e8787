"""The stage runner end to end in a scratch copy of the project: outputs, figures, failure cleanup,
and DVC's contract (a second `dvc repro` does nothing; interactive re-runs do not invalidate)."""
import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
STAGE, NOTEBOOK = "perm_fig1", "notebooks/perm/fig1_synthetic.ipynb"
TWIN, REPORT = NOTEBOOK.replace(".ipynb", ".py"), "reports/perm/fig1_synthetic.ipynb"
SMALL = {"num_clients": 6, "samples_per_client": 40, "rounds": 2, "local_steps": 2, "seeds": [0, 1],
         "eval_every": 1, "finetune_steps": 2, "device": "cpu"}

pytestmark = pytest.mark.slow


def _project(tmp_path: Path, **overrides) -> Path:
    """A minimal project: dvc.yaml, params.yaml (small scale), the fig1 notebook and its twin."""
    proj = tmp_path / "proj"
    (proj / "notebooks" / "perm").mkdir(parents=True)
    for rel in (NOTEBOOK, NOTEBOOK.replace(".ipynb", ".py")):
        shutil.copy(ROOT / rel, proj / rel)
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    spec["stages"] = {STAGE: spec["stages"][STAGE]}
    spec["stages"][STAGE]["deps"] = [d for d in spec["stages"][STAGE]["deps"] if not d.startswith("src/")]
    spec.pop("plots", None)
    (proj / "dvc.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params = {"defaults": params["defaults"], STAGE: {**params[STAGE], **SMALL, **overrides}}
    (proj / "params.yaml").write_text(yaml.safe_dump(params))
    return proj


def _run(args, cwd, check=True):
    # the stage command says `python`: the one of this environment, as `make` arranges via PATH
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PATH": path}
    out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
    if check and out.returncode != 0:
        raise AssertionError(f"{args} failed:\n{out.stdout}\n{out.stderr}")
    return out


def test_stage_writes_report_metrics_and_figures(tmp_path):
    proj = _project(tmp_path)
    _run([sys.executable, "-m", "pflkit", "stage", STAGE, NOTEBOOK], proj)
    assert (proj / "reports/perm/fig1_synthetic.ipynb").stat().st_size > 0
    metrics = json.loads((proj / "results/perm_fig1/metrics.json").read_text())
    assert metrics["dataset"] == "perm-synthetic" and metrics["is_substitute"] is False
    run_info = json.loads((proj / "results/perm_fig1/run.json").read_text())
    assert run_info["data"]["num_clients"] == 6 and run_info["config"]["rounds"] == 2
    assert set(metrics["final"]) == {"Local", "FedAvg", "Localized FedAvg", "PERM", "Per-FedAvg (FO)", "pFedMe",
                                     "Majority class"}
    assert 0.0 <= metrics["final"]["FedAvg"]["accuracy_mean"] <= 1.0
    history = (proj / "results/perm_fig1/history.csv").read_text().splitlines()
    assert history[0] == "round,method,seed,metric,value"
    png = proj / "figures/perm/fig1_synthetic.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image
    width, height = Image.open(png).size
    assert width > 1000 and height > 400
    svg = (proj / "figures/perm/fig1_synthetic.svg").read_text()
    for text in ("communication round", "personalized test accuracy", "perm-synthetic", "N=6"):
        assert text in svg
    assert not list(proj.rglob("*.tmp*")), "temporary files left behind"


def test_bad_params_fail_before_work_and_leave_nothing(tmp_path):
    proj = _project(tmp_path, rounds=0)
    out = _run([sys.executable, "-m", "pflkit", "stage", STAGE, NOTEBOOK], proj, check=False)
    assert out.returncode == 1
    assert "perm_fig1.rounds" in out.stderr
    assert not (proj / "results").exists() and not (proj / "reports").exists()


def test_failing_notebook_removes_partial_outputs(tmp_path):
    proj = _project(tmp_path)
    (proj / "results/perm_fig1").mkdir(parents=True)
    (proj / "results/perm_fig1/metrics.json").write_text("{stale}")
    twin = proj / TWIN  # the stage executes the twin
    twin.write_text(twin.read_text().replace("report.write_stage(", "raise RuntimeError('boom'); report.write_stage("))
    out = _run([sys.executable, "-m", "pflkit", "stage", STAGE, NOTEBOOK], proj, check=False)
    assert out.returncode != 0 and "boom" in out.stderr + out.stdout
    assert not (proj / "results/perm_fig1/metrics.json").exists()
    assert not (proj / "figures/perm/fig1_synthetic.png").exists()
    assert not (proj / "reports/perm/fig1_synthetic.ipynb").exists()
    assert (proj / "build/failed/perm_fig1.ipynb").exists()


def _dvc_project(tmp_path: Path) -> tuple[Path, str]:
    """The minimal project as a git + DVC repository; returns it and the dvc executable."""
    dvc = shutil.which("dvc", path=str(Path(sys.executable).parent)) or shutil.which("dvc")
    if dvc is None:
        pytest.skip("dvc not installed")
    proj = _project(tmp_path)
    _run(["git", "init", "-q"], proj)
    _run([dvc, "init", "-q"], proj)
    _run([dvc, "config", "core.analytics", "false"], proj)
    return proj, dvc


def test_dvc_repro_is_cached_and_interactive_runs_do_not_invalidate(tmp_path):
    proj, dvc = _dvc_project(tmp_path)
    _run([dvc, "repro", "-q"], proj)
    assert (proj / "results/perm_fig1/metrics.json").exists()
    status = _run([dvc, "status", "--json"], proj).stdout
    assert json.loads(status) == {}
    # re-run the notebook "interactively": new outputs in the .ipynb, same code
    nb = proj / NOTEBOOK
    nb.write_text(nb.read_text().replace('"execution_count": ', '"execution_count": 1000 + '.replace(" + ", "")))
    again = _run([dvc, "repro"], proj).stdout
    assert "didn't change, skipping" in again or "is cached" in again or "up to date" in again.lower()
    assert json.loads(_run([dvc, "status", "--json"], proj).stdout) == {}
    # a parameter change invalidates the stage; `dvc exp run -S` applies one and runs it
    params = yaml.safe_load((proj / "params.yaml").read_text())
    params[STAGE]["rounds"] = 1
    (proj / "params.yaml").write_text(yaml.safe_dump(params))
    assert STAGE in json.loads(_run([dvc, "status", "--json"], proj).stdout)
    params[STAGE]["rounds"] = 2
    (proj / "params.yaml").write_text(yaml.safe_dump(params))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    _run(git + ["add", "-A"], proj)
    _run(git + ["commit", "-qm", "baseline"], proj)
    _run([dvc, "exp", "run", "-S", f"{STAGE}.rounds=1"], proj)
    assert json.loads((proj / "results/perm_fig1/run.json").read_text())["config"]["rounds"] == 1
    # the experiment is recorded with its parameter (DVC's metrics are the claims stage's, not in this project)
    shown = json.loads(_run([dvc, "exp", "show", "--json"], proj).stdout)
    assert re.search(r'"rounds": 1[,}]', json.dumps(shown)), "the experiment's params (rounds = 1) are not recorded"


def test_dvc_repro_executes_the_twin_dvc_tracks_not_the_stored_ipynb(tmp_path):
    proj, dvc = _dvc_project(tmp_path)
    # an edit made only in the .ipynb is neither tracked nor executed; `notebooks check` reports it
    nb = nbformat.read(proj / NOTEBOOK, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell('print("MARKER-IPYNB-ONLY")'))
    nbformat.write(nb, proj / NOTEBOOK)
    _run([dvc, "repro", "-q"], proj)
    assert "MARKER-IPYNB-ONLY" not in (proj / REPORT).read_text()
    check = _run([sys.executable, "-m", "pflkit", "notebooks", "check"], proj, check=False)
    assert check.returncode == 1 and "code differs from fig1_synthetic.py" in check.stdout
    assert json.loads(_run([dvc, "status", "--json"], proj).stdout) == {}
    # an edit in the twin invalidates the stage, and the re-run executes it
    twin = proj / TWIN
    twin.write_text(twin.read_text() + '\n# %%\nprint("MARKER-TWIN")\n')
    assert STAGE in json.loads(_run([dvc, "status", "--json"], proj).stdout)
    _run([dvc, "repro", "-q"], proj)
    report = (proj / REPORT).read_text()
    assert "MARKER-TWIN" in report and "MARKER-IPYNB-ONLY" not in report
    assert json.loads(_run([dvc, "status", "--json"], proj).stdout) == {}


def test_reproduce_runs_a_profile_under_build_records_its_runtime_and_writes_its_ledger(tmp_path):
    """`python -m pflkit reproduce --profile P`: the profile's values, every output under build/P/ (DVC's
    outputs untouched), one line in build/runtimes.csv, and the profile's claims ledger in build/P/."""
    proj = _project(tmp_path)
    params = yaml.safe_load((proj / "params.yaml").read_text())
    params["profiles"] = {"quick": {STAGE: {"rounds": 1, "seeds": [0]}}}
    (proj / "params.yaml").write_text(yaml.safe_dump(params))
    (proj / "scripts").mkdir()
    for script in ("claims.py", "dvc_stages.py"):
        shutil.copy(ROOT / "scripts" / script, proj / "scripts" / script)
    (proj / "src/pflkit").mkdir(parents=True)  # the ledger reads the stage table from the project's source
    shutil.copy(ROOT / "src/pflkit/stages.py", proj / "src/pflkit/stages.py")
    claims = [c for c in yaml.safe_load((ROOT / "claims.yaml").read_text()) if c["stage"] == STAGE]
    (proj / "claims.yaml").write_text(yaml.safe_dump(claims))
    _run([sys.executable, "-m", "pflkit", "reproduce", "--profile", "quick", "--stages", STAGE], proj)
    run_info = json.loads((proj / "build/quick/perm_fig1/run.json").read_text())
    assert run_info["config"]["rounds"] == 1 and run_info["config"]["seeds"] == [0]
    assert (proj / "build/quick/reports/perm/fig1_synthetic.ipynb").is_file()
    assert (proj / "build/quick/figures/perm/fig1_synthetic.png").is_file()
    assert not (proj / "results").exists() and not (proj / "figures").exists() and not (proj / "reports").exists()
    log = (proj / "build/runtimes.csv").read_text().splitlines()
    assert log[0] == "stage,profile,seconds,device,threads,cpu,finished_utc"
    assert len(log) == 2 and log[1].startswith("perm_fig1,quick,") and ",cpu," in log[1]
    ledger = (proj / "build/quick/claims.csv").read_text()
    assert ledger.count(",quick,") == len(claims) and "not run" in ledger  # default has not run here

    for args, message in ((["--profile", "default"], "the default profile is what `dvc repro` runs"),
                          (["--profile", "quick", "--stages", "nope"], "stages: unknown ['nope']; allowed:"),
                          (["--profile", "nope"], "profile: unknown profile 'nope'")):
        out = _run([sys.executable, "-m", "pflkit", "reproduce", *args], proj, check=False)
        assert out.returncode == 1 and message in out.stderr, out.stderr
