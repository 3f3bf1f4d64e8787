"""The paper profile's own DVC pipeline (pipelines/paper/dvc.yaml, written by scripts/dvc_stages.py): the same
notebook stages with the profile's values, every output under build/paper/, no output shared with dvc.yaml,
and `python -m pflkit reproduce --profile paper` is `dvc repro` of that file (its end-to-end run from a fresh
clone, with a push and a pull: tests/integration/test_dvc_remote.py)."""
from pathlib import Path

import pytest
import yaml

from pflkit import reproduce as reproduce_module
from pflkit import stages
from pflkit.config import ConfigError
from repo_files import load

ROOT = Path(__file__).resolve().parents[2]
PAPER = yaml.safe_load((ROOT / "pipelines/paper/dvc.yaml").read_text())["stages"]
DEFAULT = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())


def _outputs(spec: dict) -> list[str]:
    return [e if isinstance(e, str) else next(iter(e)) for k in ("outs", "metrics", "plots") for e in spec.get(k) or []]


def test_every_notebook_stage_and_the_ledger_run_with_the_profile_from_the_project_root():
    assert list(PAPER) == [s.name for s in stages.STAGES] + ["claims"]
    for s in stages.STAGES:
        spec = PAPER[s.name]
        assert spec["cmd"] == f"{s.cmd} --profile paper"
        assert spec["wdir"] == "../.."
    assert PAPER["claims"]["cmd"] == "python scripts/claims.py --profiles default,paper --out build/paper"
    # the ledger reads whatever results exist: no stage's metrics is its dependency, DVC re-runs it every time
    assert PAPER["claims"]["always_changed"] is True
    assert not [d for d in PAPER["claims"]["deps"] if d.endswith("metrics.json")]


def test_outputs_are_the_default_stages_outputs_moved_under_build_paper():
    for s in stages.STAGES:
        paper, default = _outputs(PAPER[s.name]), _outputs(DEFAULT[s.name])
        assert paper == [stages.profile_path(o, "paper") for o in default], s.name
        assert all(o.startswith("build/paper/") for o in paper)
    every_default = {o for spec in DEFAULT.values() for o in _outputs(spec)}
    every_paper = [o for spec in PAPER.values() for o in _outputs(spec)]
    assert len(every_paper) == len(set(every_paper)) and not every_default & set(every_paper)
    # what perm_fig5 reads is what the paper perm_fig4 writes, the file params.yaml's paper profile names
    assert "build/paper/perm_fig4/models/alpha.npz" in PAPER["perm_fig5"]["deps"]
    assert PARAMS["profiles"]["paper"]["perm_fig5"]["alpha_file"] == "build/paper/perm_fig4/models/alpha.npz"


def test_params_are_the_sections_and_the_profile_overlays_or_the_whole_profile():
    overlay = PARAMS["profiles"]["paper"]
    # profiles.paper lists every section's overlay (empty where the section is the paper's setting), so each
    # stage lists its own two overlays and an edit of one re-runs that stage only (tests/unit/test_tracked_params.py:
    # every key a stage reads is covered)
    paper = ["profiles.paper.defaults"]
    assert PAPER["perm_fig2"]["params"] == ["defaults", "perm_fig2", *paper, "profiles.paper.perm_fig2"]
    assert PAPER["perm_fig1"]["params"] == ["defaults", "perm_fig1", *paper, "profiles.paper.perm_fig1"]
    assert PAPER["perm_fig2_plot"]["params"] == ["defaults", "figures", *paper, "profiles.paper.figures"]
    for name, spec in PAPER.items():
        assert "profiles.paper" not in spec.get("params", []), name  # no stage re-runs on another stage's overlay
        for key in spec.get("params", []):
            if key.startswith("profiles.paper."):
                assert key.split(".", 2)[2] in overlay, (name, key)  # DVC refuses a missing params key


def test_data_comes_from_the_default_pipelines_data_stages():
    data_outs = {o for name, spec in DEFAULT.items() if name.startswith("data_") for o in spec["outs"]}
    assert {d for d in PAPER["perm_fig4"]["deps"] if d.startswith("data/")} <= data_outs
    assert not any(name.startswith("data_") for name in PAPER)


def test_reproduce_of_the_paper_profile_is_dvc_repro_of_its_pipeline(monkeypatch):
    calls = []
    monkeypatch.setattr(reproduce_module.subprocess, "call", lambda cmd, cwd: calls.append(cmd) or 0)
    assert reproduce_module.reproduce("paper", ["charles_fig1", "charles_fig1_plot"]) == 0
    assert [c[1:] for c in calls] == [["repro", "pipelines/paper/dvc.yaml:charles_fig1",
                                       "pipelines/paper/dvc.yaml:charles_fig1_plot"],
                                      ["repro", "pipelines/paper/dvc.yaml:claims"]]  # the ledger, last
    calls.clear()
    assert reproduce_module.reproduce("paper") == 0
    assert [c[1:] for c in calls] == [["repro", "pipelines/paper/dvc.yaml"],
                                      ["repro", "pipelines/paper/dvc.yaml:claims"]]
    calls.clear()
    monkeypatch.setattr(reproduce_module.subprocess, "call", lambda cmd, cwd: calls.append(cmd) or 1)
    assert reproduce_module.reproduce("paper", ["charles_fig1"]) == 1 and len(calls) == 1  # no ledger after a failure


def test_bad_stages_are_refused_before_dvc_starts(monkeypatch):
    monkeypatch.setattr(reproduce_module.subprocess, "call", lambda *a, **k: pytest.fail("dvc ran"))
    with pytest.raises(ConfigError, match="unknown .*charles_fig99"):
        reproduce_module.reproduce("paper", ["charles_fig99"])


def test_the_generator_writes_both_files():
    gen = load("scripts/dvc_stages.py", "dvc_stages_for_profiles")
    texts = gen.outputs_of(gen.load_stages(), PARAMS)
    written = [p.relative_to(ROOT).as_posix() for p in texts]
    assert written[:2] == ["dvc.yaml", "pipelines/paper/dvc.yaml"]
    assert written[2:] and all(w.startswith(".dvc/plots/") and w.endswith(".json") for w in written[2:])  # templates
    assert texts[ROOT / "pipelines/paper/dvc.yaml"] == (ROOT / "pipelines/paper/dvc.yaml").read_text()
