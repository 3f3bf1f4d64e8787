"""The stage table (pflkit.stages), dvc.yaml generated from it, the import walk behind each stage's
deps, and the ``tune`` command's refusal of stages it cannot sweep."""
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


@pytest.mark.parametrize("stage, rc, why", [("chayti_fig2", 1, "cannot tune stage 'chayti_fig2' (it has no "
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
