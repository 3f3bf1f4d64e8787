"""The stage table (pflkit.stages), dvc.yaml generated from it, the import walk behind each stage's
deps, and the ``tune`` command's refusal of stages it cannot sweep."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pflkit import stages
from pflkit.__main__ import main
from pflkit.config import StageConfig, registry
from repo_files import load

ROOT = Path(__file__).resolve().parents[2]
dvc_stages = load("scripts/dvc_stages.py")


def test_dvc_yaml_is_generated_from_the_stage_table(capsys):
    assert dvc_stages.main(["--check"]) == 0, capsys.readouterr().err


def test_every_stage_names_its_notebook_paper_and_config():
    assert len(stages.BY_NAME) == len(stages.STAGES), "stage names are unique"
    for s in stages.STAGES:
        assert (ROOT / s.notebook).is_file() and (ROOT / s.ipynb).is_file(), s.name
        assert s.notebook.startswith(f"notebooks/{s.paper}/"), s.name
    configs = registry()
    assert list(configs) == [s.name for s in stages.STAGES]
    assert all(issubclass(c, StageConfig) for c in configs.values())


def test_tunable_stages_are_the_ones_the_sweep_runs():
    from pflkit.experiments import perm
    assert sorted(stages.tunable()) == sorted(perm.FIGURES)


def _fresh(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                          cwd=ROOT).stdout.strip()


def test_registry_has_no_import_side_effects_and_one_lookup_imports_one_module():
    """One stage's lookup imports its paper's module, no other paper's."""
    loaded = "sorted(m for m in sys.modules if m.startswith('pflkit.experiments.'))"
    assert _fresh(f"import sys, pflkit.config, pflkit.experiments; print({loaded})") == "[]"
    assert _fresh(f"import sys; from pflkit.config import stage_config; stage_config('chayti_fig2'); "
                  f"print({loaded})") == "['pflkit.experiments.chayti']"


def _write(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_import_walk_finds_lazy_relative_parent_package_and_spawned_imports(tmp_path):
    src = tmp_path / "src"
    _write(src / "pkg/__init__.py", "")
    _write(src / "pkg/a.py", "from .sub import b\n\ndef later():\n    from . import lazy\n    import pkg.deep.x\n"
                             "    return [sys.executable, '-m', 'pkg.spawned', '-m', 'x'], ('-m', 'numpy')\n")
    _write(src / "pkg/spawned.py", "")
    _write(src / "pkg/sub/__init__.py", "")
    _write(src / "pkg/sub/b.py", "import os\nfrom ..c import thing\n")
    _write(src / "pkg/c.py", "thing = 1\n")
    _write(src / "pkg/lazy.py", "")
    _write(src / "pkg/deep/__init__.py", "from . import y\n")
    _write(src / "pkg/deep/x.py", "")
    _write(src / "pkg/deep/y.py", "")
    _write(src / "pkg/unused.py", "")
    _write(tmp_path / "nb.py", "import numpy\nfrom pkg import a\n")
    found = dvc_stages.import_closure([tmp_path / "nb.py"], [], src)
    assert sorted(p.relative_to(src).as_posix() for p in found) == [
        "pkg/__init__.py", "pkg/a.py", "pkg/c.py", "pkg/deep/__init__.py", "pkg/deep/x.py", "pkg/deep/y.py",
        "pkg/lazy.py", "pkg/spawned.py", "pkg/sub/__init__.py", "pkg/sub/b.py"]


def test_data_imports_nothing_of_the_engine():
    found = dvc_stages.import_closure([], ["pflkit.data", "pflkit.data.quadratic_users",
                                           "pflkit.data.quadratic_clients"], ROOT / "src")
    assert not [p for p in found if "engine" in p.relative_to(ROOT / "src").parts]


@pytest.mark.parametrize("stage, rc, why", [("chayti_fig2", 2, "cannot tune stage 'chayti_fig2' (it has no "
                                                                "learning-rate sweep); stages it can tune: "),
                                            ("nope", 2, "unknown stage 'nope'; stages: ")])
def test_tune_refuses_a_stage_it_cannot_sweep(stage, rc, why, capsys):
    assert main(["tune", stage, "--params", str(ROOT / "params.yaml")]) == rc
    err = capsys.readouterr().err
    assert why in err
    assert "perm_fig1, perm_fig2, perm_fig4" in err
    assert "Traceback" not in err


def test_tune_a_profile_writes_under_build_not_into_results(capsys, monkeypatch, tmp_path):
    """`tune --profile smoke` sweeps the smoke values (seconds) and writes build/smoke/tuning/, never the
    results/tuning/ table the default profile's sweep keeps."""
    import pflkit.__main__ as cli
    written = []
    monkeypatch.setattr("pflkit.io.write_csv", lambda path, frame: written.append((str(path), frame)) or path)
    assert cli.main(["tune", "perm_fig1", "--profile", "smoke", "--grid", "0.1", "--methods", "fedavg",
                     "--params", str(ROOT / "params.yaml")]) == 0
    (path, frame), = written
    assert path == "build/smoke/tuning/perm_fig1.csv"
    assert list(frame["method"]) == ["fedavg"] and list(frame["lr"]) == [0.1]


# ------------------------------------------------------------------ a data stage's params: the keys it reads
class _Reads:
    """Stands for a stage config while one of its methods runs: records every attribute the method reads (its
    methods and properties run on the recorder too, so what they read is recorded)."""

    def __init__(self, cfg):
        object.__setattr__(self, "_cfg", cfg)
        object.__setattr__(self, "read", set())

    def __getattr__(self, name):
        import inspect
        import types
        attr = inspect.getattr_static(type(self._cfg), name, None)
        if inspect.isfunction(attr):
            return types.MethodType(attr, self)
        if isinstance(attr, property):
            return attr.fget(self)
        self.read.add(name)
        return getattr(self._cfg, name)


def _synthetic_reads(params: dict) -> dict[str, set[str]]:
    """Per consumer of PERM's synthetic data, the params.yaml keys of its section that what
    ``data_perm_synthetic`` prepares for it is made from (``synthetic_requests``, as ``pflkit.data_stages`` calls
    it), recorded; a fixed class value (perm_fig3's sizes) is no params.yaml key."""
    from pflkit.config import validate_stage
    reads = {}
    for stage in stages.SYNTHETIC_CONSUMERS:
        cfg = validate_stage(params, stage, machine=False)
        recorder = _Reads(cfg)
        assert type(cfg).synthetic_requests(recorder) == cfg.synthetic_requests(), stage
        assert not recorder.read & set(params.get("defaults") or {}), stage  # would be a defaults.<key> param
        reads[stage] = recorder.read & set(params[stage])
    return reads


def _covers(param: str, key: str) -> bool:
    """Whether DVC param ``param`` (a dotted params.yaml path) includes ``key``: a change of ``key`` changes it."""
    return key == param or key.startswith(param + ".")


def test_a_data_stage_depends_on_exactly_the_params_keys_it_reads():
    """data_perm_synthetic lists the keys of its consumers' sections that its arrays are made from, and no whole
    section: `dvc exp run perm_fig1_plot -S perm_fig1.rounds=50` does not re-run it (DVC compares each listed
    key's value; no listed key covers perm_fig1.rounds), while a change of perm_fig1.seeds does."""
    import yaml
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    reads = _synthetic_reads(params)
    assert reads["perm_fig1"] == {"num_clients", "samples_per_client", "dim", "test_fraction", "seeds"}
    assert reads["perm_fig3"] == {"num_clients", "workloads"}
    declared = {s: set(keys) for s, keys in stages.SYNTHETIC_KEYS.items()}
    assert declared == reads
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    listed = spec["data_perm_synthetic"]["params"]
    assert sorted(listed) == sorted(f"{s}.{k}" for s, keys in reads.items() for k in keys)
    for name in (d.name for d in stages.DATA_STAGES):  # every data stage: a data.<key> section, or exact keys
        for param in spec[name]["params"]:
            assert param.startswith(f"{stages.DATA_SECTION}.") or param.count(".") == 1, (name, param)
            assert param.split(".")[0] != stages.DATA_SECTION or param == f"data.{name.removeprefix('data_')}"
    data_params = [p for d in stages.DATA_STAGES for p in spec[d.name]["params"]]
    for stage, keys in reads.items():  # every other key of a consumer's section re-runs no data stage
        for key in set(params[stage]) - keys:
            assert not any(_covers(p, f"{stage}.{key}") for p in data_params), f"{stage}.{key}"
    assert not any(_covers(p, "perm_fig1.rounds") for p in data_params)
    assert any(_covers(p, "perm_fig1.seeds") for p in listed)
    for d in stages.DATA_STAGES:  # and the data stages' code deps still follow their consumers' configs
        assert set(dvc_stages.data_code_deps(d, stages.STAGES)) <= set(spec[d.name]["deps"])


def test_dvc_status_of_a_data_stage_ignores_its_consumers_other_keys(tmp_path):
    """DVC's own check, in a scratch project: data_perm_synthetic's params as dvc.yaml lists them (its command a
    no-op), run once; then perm_fig1.rounds changes and `dvc status` has nothing to re-run, perm_fig1.seeds changes
    and it names the stage."""
    import shutil
    import yaml
    dvc = shutil.which("dvc", path=str(Path(sys.executable).parent)) or shutil.which("dvc")
    if dvc is None:
        pytest.skip("dvc not installed")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    listed = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["data_perm_synthetic"]["params"]
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"data_perm_synthetic": {
        "cmd": "true", "params": listed}}}))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))

    def dvc_run(*args):
        out = subprocess.run([dvc, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    dvc_run("init", "--no-scm", "-q")
    dvc_run("repro", "-q")
    params["perm_fig1"]["rounds"] += 1
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert json.loads(dvc_run("status", "--json")) == {}
    params["perm_fig1"]["seeds"] = [*params["perm_fig1"]["seeds"], 99]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert list(json.loads(dvc_run("status", "--json"))) == ["data_perm_synthetic"]


# ------------------------------------------------------------------ `dvc exp show` fits a terminal
def _exp_show_command() -> list[str]:
    """docs/running.md's `dvc exp show` line: its options."""
    import re
    import shlex
    line = next(line for line in (ROOT / "docs/running.md").read_text().splitlines()
                if line.startswith("dvc exp show"))
    return shlex.split(re.sub(r"\s+#.*$", "", line))[3:]


def test_exp_show_drops_dependency_hashes_and_per_method_accuracies_but_keeps_params_and_margins():
    """The documented `--drop` patterns (DVC matches each from the start of a column's name) against the
    columns `dvc exp show` can show: every dependency's path of both pipelines, `Created` and the per-method
    accuracies go; every param and every other headline number stays."""
    import re
    import yaml
    args = _exp_show_command()
    assert "--only-changed" in args
    drop = re.compile("|".join(a for flag, a in zip(args, args[1:]) if flag == "--drop"))
    deps = {d for f in ("dvc.yaml", "pipelines/paper/dvc.yaml")
            for s in yaml.safe_load((ROOT / f).read_text())["stages"].values() for d in s.get("deps", [])}
    assert deps and all(drop.match(d) for d in deps)
    assert drop.match("Created") and not drop.match("Experiment")

    def leaves(tree, prefix=""):
        for key, value in tree.items():
            name = f"{prefix}{key}"
            yield from leaves(value, name + ".") if isinstance(value, dict) else [name]
    params = list(leaves(yaml.safe_load((ROOT / "params.yaml").read_text())))
    assert not [p for p in params if drop.match(p)]
    headline = [m for s in stages.compute_stages()
                for m in leaves(json.loads((ROOT / s.headline_file).read_text()))]
    kept = [m for m in headline if not drop.match(m)]
    assert "perm_fig1.perm_margin" in kept and "perm_fig2.perm_alpha_margin" in kept
    assert {m for m in headline if drop.match(m)} == {m for m in headline if ".accuracy." in m}


def test_exp_show_of_the_documented_experiments_fits_120_columns(tmp_path):
    """The documented command after an experiment like docs/running.md's (perm_fig1's rounds and seeds and a
    figure's dpi at once), on a scratch project with perm_fig1's headline keys and the same kinds of deps: at its
    full width (DVC's pager width: the table is never squeezed) no line is wider than 120 columns."""
    import shutil
    import yaml
    dvc = shutil.which("dvc", path=str(Path(sys.executable).parent)) or shutil.which("dvc")
    git = shutil.which("git")
    if dvc is None or git is None:
        pytest.skip("dvc or git not installed")
    headline = json.loads((ROOT / "results/perm_fig1/headline.json").read_text())
    (tmp_path / "make.py").write_text(
        "import json, os, sys, yaml\n"
        "p = yaml.safe_load(open('params.yaml'))['perm_fig1']\n"
        "h = json.loads(sys.argv[1])\n"
        "acc = h['perm_fig1']['accuracy']\n"
        "h['perm_fig1']['accuracy'] = {m: round(v - 1e-4 * p['rounds'], 6) for m, v in acc.items()}\n"
        "h['perm_fig1']['perm_margin'] = round(h['perm_fig1']['perm_margin'] + 1e-4 * len(p['seeds']), 4)\n"
        "os.makedirs('results/perm_fig1', exist_ok=True)\n"
        "json.dump(h, open('results/perm_fig1/headline.json', 'w'))\n"
        "for f in ('history.csv', 'metrics.json', 'run.json', 'curves_accuracy.csv'):\n"
        "    open(f'results/perm_fig1/{f}', 'w').write(repr(p))\n")
    outs = [f"results/perm_fig1/{f}" for f in ("history.csv", "metrics.json", "run.json", "curves_accuracy.csv")]
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "perm_fig1": {"cmd": f"python make.py '{json.dumps(headline)}'", "deps": ["make.py"],
                      "params": ["perm_fig1"], "outs": outs,
                      "metrics": [{"results/perm_fig1/headline.json": {"cache": False}}]},
        "perm_fig1_plot": {"cmd": "python -c \"open('fig.txt', 'w').write(open('params.yaml').read())\"",
                           "deps": outs, "params": ["figures"], "outs": ["fig.txt"]}}}))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"perm_fig1": {"rounds": 100, "seeds": [0, 1, 2]},
                                                          "figures": {"dpi": 150}}, default_flow_style=False))

    def run(*args):
        out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=180,
                             env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                                  "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})
        assert out.returncode == 0, out.stderr
        return out.stdout

    run(git, "init", "-q")
    run(dvc, "init", "-q")
    run(dvc, "config", "core.analytics", "false")
    run(dvc, "repro", "-q")
    run(git, "add", "-A")
    run(git, "commit", "-qm", "baseline")
    run(dvc, "exp", "run", "-q", "perm_fig1_plot", "-S", "perm_fig1.rounds=50", "-S", "perm_fig1.seeds=[0,1,2,3]",
        "-S", "figures.dpi=300")
    table = run(dvc, "exp", "show", *_exp_show_command())
    assert "perm_fig1.perm_margin" in table and "perm_fig1.rounds" in table and "figures.dpi" in table, table
    assert "results/" not in table and "accuracy" not in table, table
    assert max(len(line.rstrip()) for line in table.splitlines()) <= 120, table
    plain = run(dvc, "exp", "show", "--only-changed")  # what the --drop saves
    assert max(len(line.rstrip()) for line in plain.splitlines()) > 120
