"""The dvc.lock check: stale code or params fail it, missing outputs (a fresh clone) do not."""
from pathlib import Path

from repo_files import load

ROOT = Path(__file__).resolve().parents[2]
check = load("scripts/check_dvc_lock.py")


def test_missing_outputs_alone_are_not_stale():
    status = {"perm_fig1": [{"changed outs": {"results/perm_fig1/metrics.json": "not in cache"}}]}
    assert check.stale_stages(status) == {}


def test_changed_code_params_or_command_are_stale():
    status = {
        "perm_fig1": [{"changed deps": {"src/pflkit": "modified",
                                        "params.yaml": {"perm_fig1": "modified"}}},
                      {"changed outs": {"results/perm_fig1/metrics.json": "deleted"}}],
        "charles_fig1": ["changed command"],
        "pipelines/paper/dvc.yaml:claims": ["always changed"],  # declared so: not stale
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


def test_a_profile_stage_that_never_ran_is_allowed_and_one_that_ran_is_checked(tmp_path):
    (tmp_path / "dvc.yaml").write_text("stages:\n  a:\n    cmd: x\n    outs: [results/a/m.json]\n")
    paper = tmp_path / "pipelines" / "paper"
    paper.mkdir(parents=True)
    (paper / "dvc.yaml").write_text("stages:\n  a:\n    cmd: x --profile paper\n    wdir: ../..\n"
                                    "    outs: [build/paper/a/m.json]\n  b:\n    cmd: y\n    wdir: ../..\n")
    (paper / "dvc.lock").write_text("schema: '2.0'\nstages:\n  a:\n    cmd: x --profile paper\n")
    assert check.never_run(tmp_path) == {"pipelines/paper/dvc.yaml:b"}
    assert check.stage_outputs(check.pipeline_files(tmp_path)) == {"results/a/m.json", "build/paper/a/m.json"}
    status = {"pipelines/paper/dvc.yaml:a": [{"changed deps": {"src/pflkit/x.py": "modified"}}],
              "pipelines/paper/dvc.yaml:b": [{"changed deps": {"src/pflkit/x.py": "modified"}}],
              "a": ["changed command"]}
    stale = check.stale_stages(status, unrun=check.never_run(tmp_path))
    # the same stage name in two pipelines is two stages, each named as dvc status names it
    assert stale == {"pipelines/paper/dvc.yaml:a": ["changed deps: src/pflkit/x.py (modified)"],
                     "a": ["changed command"]}


def test_every_profile_pipeline_is_checked():
    files = [p.relative_to(ROOT).as_posix() for p in check.pipeline_files()]
    assert files == ["dvc.yaml", "pipelines/paper/dvc.yaml"]
    assert "build/paper/perm_fig4/metrics.json" in check.stage_outputs()
