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
PLOT, PLOT_NOTEBOOK = "perm_fig1_plot", "notebooks/perm/fig1_synthetic_plot.ipynb"
DATA = "data_perm_synthetic"
TWIN, REPORT = NOTEBOOK.replace(".ipynb", ".py"), "reports/perm/fig1_synthetic.ipynb"
SMALL = {"num_clients": 6, "samples_per_client": 40, "rounds": 2, "local_steps": 2, "seeds": [0, 1],
         "eval_every": 1, "finetune_steps": 2, "device": "cpu"}

pytestmark = pytest.mark.slow


def _project(tmp_path: Path, **overrides) -> Path:
    """A minimal project: dvc.yaml with PERM Fig. 1's data, compute and plot stages, params.yaml (small scale),
    both notebooks and their twins."""
    proj = tmp_path / "proj"
    (proj / "notebooks" / "perm").mkdir(parents=True)
    for rel in (NOTEBOOK, PLOT_NOTEBOOK):
        for path in (rel, rel.replace(".ipynb", ".py")):
            shutil.copy(ROOT / path, proj / path)
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    spec["stages"] = {name: spec["stages"][name] for name in (DATA, STAGE, PLOT)}
    for stage in spec["stages"].values():
        stage["deps"] = [d for d in stage["deps"] if not d.startswith("src/")]
    data = spec["stages"][DATA]  # its code stands in for all the src/ deps (a stage without deps always runs)
    data["deps"] = ["src/pflkit/data/synthetic.py"]
    (proj / "src/pflkit/data").mkdir(parents=True)
    shutil.copy(ROOT / data["deps"][0], proj / data["deps"][0])
    data["params"] = [f"{STAGE}"]
    data["outs"] = [o for o in data["outs"] if o.endswith(f"/{STAGE}")]
    spec.pop("plots", None)
    (proj / "dvc.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    section = params[STAGE]
    # a run of 1-2 rounds: PERM's alpha update every round (the cross-key rules refuse one that never comes), and
    # without the variant whose warm-up is 10 rounds
    small = {**SMALL, "perm": {**section["perm"], "update_every": 1},
             "methods": [m for m in section["methods"] if m != "perm_torchfed"]}
    params = {"defaults": params["defaults"], "figures": params["figures"],
              STAGE: {**section, **small, **overrides}}
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


def test_stage_writes_report_metrics_models_and_its_plot_stage_the_figures(tmp_path):
    proj = _project(tmp_path)
    out = _run([sys.executable, "-m", "pflkit", "stage", STAGE, NOTEBOOK], proj, check=False)
    assert out.returncode != 0 and "run `dvc repro data_perm_synthetic`" in out.stderr + out.stdout
    _run([sys.executable, "-m", "pflkit", "data", "perm_synthetic"], proj)
    manifest = json.loads((proj / "data/prepared/perm-synthetic/perm_fig1/manifest.json").read_text())
    assert [r["seed"] for r in manifest["request"]] == [0, 1] and manifest["request"][0]["num_clients"] == 6
    _run([sys.executable, "-m", "pflkit", "stage", STAGE, NOTEBOOK], proj)
    assert not (proj / "figures").exists(), "a compute stage draws no figure"
    models = sorted(p.name for p in (proj / "models/perm_fig1").iterdir())
    assert "PERM__seed1.pt" in models and "index.json" in models and len(models) == 7 * 2 + 1
    _run([sys.executable, "-m", "pflkit", "stage", PLOT, PLOT_NOTEBOOK], proj)
    assert (proj / "reports/perm/fig1_synthetic.ipynb").stat().st_size > 0
    metrics = json.loads((proj / "results/perm_fig1/metrics.json").read_text())
    assert metrics["dataset"] == "perm-synthetic" and metrics["is_substitute"] is False
    run_info = json.loads((proj / "results/perm_fig1/run.json").read_text())
    assert run_info["data"]["num_clients"] == 6 and run_info["config"]["rounds"] == 2
    assert set(metrics["final"]) == {"Local", "FedAvg", "Localized FedAvg", "PERM", "Per-FedAvg (FO)", "pFedMe",
                                     "Ditto", "Majority class"}
    assert 0.0 <= metrics["final"]["FedAvg"]["accuracy_mean"] <= 1.0
    # the runner wrote the stage's headline (its DVC metrics) from metrics.json
    head = json.loads((proj / "results/perm_fig1/headline.json").read_text())["perm_fig1"]
    assert head["dataset"] == "perm-synthetic" and head["substitute"] is False
    assert head["perm_margin"] == pytest.approx(metrics["claim_perm_best"]["margin"], rel=1e-5)
    assert head["accuracy"] == {m: pytest.approx(v["accuracy_mean"], rel=1e-5) for m, v in metrics["final"].items()}
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
    _run([sys.executable, "-m", "pflkit", "data", "perm_synthetic"], proj)
    (proj / "results/perm_fig1").mkdir(parents=True)
    (proj / "results/perm_fig1/metrics.json").write_text("{stale}")
    twin = proj / TWIN  # the stage executes the twin
    twin.write_text(twin.read_text().replace("report.write_result(",
                                             "raise RuntimeError('boom'); report.write_result("))
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


def _ran(out: str) -> set[str]:
    """The stages a `dvc repro` ran (DVC prints "Running stage '<name>':")."""
    return set(re.findall(r"Running stage '([^']+)'", out))


@pytest.fixture(scope="session")
def _reproduced_once(tmp_path_factory) -> tuple[Path, str]:
    """The minimal DVC project after its first `dvc repro` (data, compute and plot stages ran), built once for
    the tests below, which each start from a copy (`_reproduced`): one first run instead of three. Session
    scope: pytest tears a module's fixtures down whenever a worker moves on to another module's test."""
    proj, dvc = _dvc_project(tmp_path_factory.mktemp("reproduced"))
    first = _run([dvc, "repro"], proj).stdout
    assert _ran(first) == {DATA, STAGE, PLOT}, first
    return proj, dvc


@pytest.fixture
def _reproduced(_reproduced_once, tmp_path) -> tuple[Path, str]:
    """A copy of the reproduced project (its git repository, DVC cache and outputs), DVC status clean."""
    built, dvc = _reproduced_once
    proj = tmp_path / "proj"
    shutil.copytree(built, proj, symlinks=True)
    assert json.loads(_run([dvc, "status", "--json"], proj).stdout) == {}
    return proj, dvc


# the tests that start from the reproduced project share one worker, so the first run happens once
_from_reproduced = pytest.mark.xdist_group("perm_fig1_reproduced")


@_from_reproduced
def test_dvc_repro_is_cached_and_interactive_runs_do_not_invalidate(_reproduced):
    proj, dvc = _reproduced
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
    # the experiment is recorded with its parameter and the stage's headline metrics, which DVC compares
    # with the committed run's (headline.json: cache: false, kept in git)
    shown = json.loads(_run([dvc, "exp", "show", "--json"], proj).stdout)
    assert re.search(r'"rounds": 1[,}]', json.dumps(shown)), "the experiment's params (rounds = 1) are not recorded"
    assert '"perm_margin"' in json.dumps(shown), "the experiment's headline metrics are not recorded"
    head = json.loads((proj / "results/perm_fig1/headline.json").read_text())["perm_fig1"]
    diff = json.loads(_run([dvc, "metrics", "diff", "--all", "--json"], proj).stdout)["results/perm_fig1/headline.json"]
    assert diff["perm_fig1.perm_margin"]["new"] == head["perm_margin"] and "old" in diff["perm_fig1.perm_margin"]
    assert set(diff) >= {f"perm_fig1.accuracy.{m}" for m in head["accuracy"]}


@_from_reproduced
def test_dvc_repro_executes_the_twin_dvc_tracks_not_the_stored_ipynb(_reproduced):
    proj, dvc = _reproduced
    # an edit made only in the .ipynb is neither tracked nor executed; `notebooks check` reports it
    nb = nbformat.read(proj / NOTEBOOK, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell('print("MARKER-IPYNB-ONLY")'))
    nbformat.write(nb, proj / NOTEBOOK)
    assert "Running stage" not in _run([dvc, "repro"], proj).stdout
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
    # the ledger reads the stage table from the project's source
    (proj / "src/pflkit").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "src/pflkit/stages.py", proj / "src/pflkit/stages.py")
    claims = [c for c in yaml.safe_load((ROOT / "claims.yaml").read_text()) if c["stage"] == STAGE]
    (proj / "claims.yaml").write_text(yaml.safe_dump(claims))
    _run([sys.executable, "-m", "pflkit", "reproduce", "--profile", "quick", "--stages", f"{STAGE},{PLOT}"], proj)
    run_info = json.loads((proj / "build/quick/perm_fig1/run.json").read_text())
    assert run_info["config"]["rounds"] == 1 and run_info["config"]["seeds"] == [0]
    assert (proj / "build/quick/reports/perm/fig1_synthetic.ipynb").is_file()
    assert (proj / "build/quick/figures/perm/fig1_synthetic.png").is_file()
    assert not (proj / "results").exists() and not (proj / "figures").exists() and not (proj / "reports").exists()
    log = (proj / "build/runtimes.csv").read_text().splitlines()
    assert log[0] == "stage,profile,seconds,device,threads,cpu,finished_utc"
    assert len(log) == 3 and log[1].startswith("perm_fig1,quick,") and ",cpu," in log[1]
    assert log[2].startswith("perm_fig1_plot,quick,")
    assert (proj / "build/quick/perm_fig1/models/PERM__seed0.pt").is_file()
    ledger = (proj / "build/quick/claims.csv").read_text()
    assert ledger.count(",quick,") == len(claims) and "not run" in ledger  # default has not run here

    for args, rc, message in ((["--profile", "default"], 2, "the default profile is what `dvc repro` runs"),
                              (["--profile", "quick", "--stages", "nope"], 2,
                               "reproduce: error: argument --stages: unknown stage 'nope'; stages:"),
                              (["--profile", "nope"], 2, "argument --profile: unknown profile 'nope'")):
        out = _run([sys.executable, "-m", "pflkit", "reproduce", *args], proj, check=False)
        assert out.returncode == rc and message in out.stderr, out.stderr


@_from_reproduced
def test_a_figure_setting_re_runs_only_the_plot_stage(_reproduced):
    """Issue 21: figures apart from training. A figure setting (params.yaml `figures`) re-runs the plot stage
    alone, from the results files, in seconds; the data and training stages are not touched."""
    proj, dvc = _reproduced
    png = proj / "figures/perm/fig1_synthetic.png"
    from PIL import Image
    width = Image.open(png).size[0]
    models = {p.name: p.read_bytes() for p in (proj / "models/perm_fig1").iterdir()}
    params = yaml.safe_load((proj / "params.yaml").read_text())
    params["figures"]["dpi"] = 75
    (proj / "params.yaml").write_text(yaml.safe_dump(params))
    assert set(json.loads(_run([dvc, "status", "--json"], proj).stdout)) == {PLOT}
    again = _run([dvc, "repro"], proj).stdout
    assert _ran(again) == {PLOT}, again
    assert Image.open(png).size[0] < 0.6 * width, "the new DPI is in the figure"
    assert {p.name: p.read_bytes() for p in (proj / "models/perm_fig1").iterdir()} == models
    # editing the plot notebook's code is a figure-only change too
    plot_twin = proj / PLOT_NOTEBOOK.replace(".ipynb", ".py")
    plot_twin.write_text(plot_twin.read_text().replace("personalized accuracy and loss", "accuracy and loss"))
    assert _ran(_run([dvc, "repro"], proj).stdout) == {PLOT}


def _leaf_femnist(folder: Path, users: int, per_user: int, seed: int = 0):
    """A small LEAF FEMNIST release (train/ and test/ json): random 28x28 images, labels 0..61."""
    import numpy as np
    rng = np.random.default_rng(seed)
    for split, n in (("train", per_user), ("test", max(2, per_user // 4))):
        names = [f"f{u:04d}" for u in range(users)]
        data = {u: {"x": rng.random((n, 784)).round(3).tolist(), "y": rng.integers(0, 62, n).tolist()}
                for u in names}
        (folder / split).mkdir(parents=True, exist_ok=True)
        (folder / split / "all_data_0.json").write_text(json.dumps(
            {"users": names, "num_samples": [n] * users, "user_data": data}))


def test_new_dataset_files_re_run_the_data_stage_and_every_stage_that_reads_it(tmp_path):
    """Issue 21: a changed dataset source re-runs its dependents. The official files of a dataset go in
    data/raw/<dataset>/, a dependency of its data stage: dropping them there (here a LEAF FEMNIST release)
    makes the data stage prepare the real dataset and the figure stage that asked for it re-run on it
    instead of its substitute."""
    dvc = shutil.which("dvc", path=str(Path(sys.executable).parent)) or shutil.which("dvc")
    proj = tmp_path / "proj"
    stage, notebook = "perm_fig4", "notebooks/perm/fig4_emnist"
    (proj / "notebooks/perm").mkdir(parents=True)
    for ext in (".py", ".ipynb"):
        shutil.copy(ROOT / (notebook + ext), proj / (notebook + ext))
    for raw in ("femnist", "fashion-mnist"):  # their placeholder READMEs (the data stages' raw deps)
        shutil.copytree(ROOT / "data/raw" / raw, proj / "data/raw" / raw)
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    stages = {name: spec[name] for name in ("data_femnist", "data_fashion_mnist", stage)}
    for one in stages.values():
        one["deps"] = [d for d in one["deps"] if not d.startswith("src/")]
    stages[stage]["deps"] = [d.replace("emnist-byclass", "femnist") for d in stages[stage]["deps"]]
    (proj / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    smoke = params["profiles"]["smoke"][stage]
    section = {**params[stage], **smoke, "device": "cpu", "pool_size": 600, "methods": ["local", "perm"],
               "alpha_file": "models/perm_fig4/alpha.npz",
               "dataset": {"name": "femnist", "substitute": "fashion-mnist", "allow_download": False,
                           "root": "data/raw"}}
    (proj / "params.yaml").write_text(yaml.safe_dump({"defaults": params["defaults"], "data": params["data"],
                                                      stage: section}))
    _run(["git", "init", "-q"], proj)
    _run([dvc, "init", "-q"], proj)
    _run([dvc, "config", "core.analytics", "false"], proj)
    assert _ran(_run([dvc, "repro"], proj).stdout) == {"data_femnist", "data_fashion_mnist", stage}
    metrics = json.loads((proj / "results/perm_fig4/metrics.json").read_text())
    assert metrics["dataset"] == "fashion-mnist" and metrics["is_substitute"] is True
    assert json.loads(_run([dvc, "status", "--json"], proj).stdout) == {}

    _leaf_femnist(proj / "data/raw/femnist", users=12, per_user=60)
    assert set(json.loads(_run([dvc, "status", "--json"], proj).stdout)) == {"data_femnist"}
    assert _ran(_run([dvc, "repro"], proj).stdout) == {"data_femnist", stage}
    manifest = json.loads((proj / "data/prepared/femnist/manifest.json").read_text())
    assert manifest["available"] and manifest["source"] == "local file" and manifest["sizes"]["train"] == 12 * 60
    metrics = json.loads((proj / "results/perm_fig4/metrics.json").read_text())
    assert metrics["dataset"] == "femnist" and metrics["is_substitute"] is False
