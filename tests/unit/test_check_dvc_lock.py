"""The dvc.lock check: stale code or params fail it, missing outputs (a fresh clone) do not."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("check_dvc_lock", ROOT / "scripts/check_dvc_lock.py")
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def test_missing_outputs_alone_are_not_stale():
    status = {"perm_fig1": [{"changed outs": {"results/perm_fig1/metrics.json": "not in cache"}}]}
    assert check.stale_stages(status) == {}


def test_changed_code_params_or_command_are_stale():
    status = {
        "perm_fig1": [{"changed deps": {"src/pflkit": "modified",
                                        "params.yaml": {"perm_fig1": "modified"}}},
                      {"changed outs": {"results/perm_fig1/metrics.json": "deleted"}}],
        "charles_fig1": ["changed command"],
    }
    stale = check.stale_stages(status)
    assert sorted(stale) == ["charles_fig1", "perm_fig1"]
    assert stale["perm_fig1"] == ["changed deps: src/pflkit (modified)",
                                  "changed deps: params.yaml (perm_fig1 modified)"]
    assert stale["charles_fig1"] == ["changed command"]


def test_a_dependency_produced_by_another_stage_may_be_missing():
    status = {"perm_fig5": [{"changed deps": {"models/perm_fig4/alpha.npz": "deleted"}}]}
    assert check.stale_stages(status, {"models/perm_fig4/alpha.npz"}) == {}
    assert check.stale_stages(status) != {}
    assert check.is_produced("models/perm_fig4/alpha.npz", check.stage_outputs())  # inside models/perm_fig4
    assert check.stale_stages(status, {"models/perm_fig4"}) == {}
    assert not check.is_produced("models/perm_fig40/x", {"models/perm_fig4"})
