"""The pipeline status a user reads (scripts/pipeline_status.py, `make status`): each stage up to date, changed,
not run here (recorded, outputs absent) or never run, from ``dvc status --json`` -- one table of cases, each a
status DVC prints (its exact JSON shapes), and the printed summary."""
import pytest

from repo_files import load

status = load("scripts/pipeline_status.py")

PRODUCED = {"data/prepared/perm-synthetic", "results/perm_fig1", "build/paper/perm_fig1",
            "figures/perm/fig1_synthetic.png"}
PAPER = "pipelines/paper/dvc.yaml:"


@pytest.mark.parametrize("entries, kind", [
    (None, "up to date"),                                                         # not in dvc status at all
    (["always changed"], "up to date"),                                           # the paper ledger, by design
    ([{"changed outs": {"results/perm_fig1": "not in cache"}}], "not run here"),     # a fresh clone
    ([{"changed outs": {"build/paper/perm_fig1": "deleted"}}], "not run here"),      # ran on another machine
    ([{"changed deps": {"data/prepared/perm-synthetic": "deleted"}},              # upstream absent too
      {"changed outs": {"results/perm_fig1": "deleted"}}], "not run here"),
    ([{"changed deps": {"src/pflkit/perm.py": "modified"}}], "changed"),         # code
    ([{"changed deps": {"params.yaml": {"perm_fig1.rounds": "modified"}}}], "changed"),  # a param
    (["changed command"], "changed"),
    ([{"changed outs": {"results/perm_fig1": "modified"}}], "changed"),          # an output edited by hand
    ([{"changed deps": {"data/prepared/perm-synthetic": "modified"}}], "changed"),  # upstream re-made
])
def test_each_status_dvc_prints_is_one_kind(entries, kind):
    got = status.classify({} if entries is None else {"perm_fig1": entries}, ["perm_fig1"], PRODUCED, set())
    assert got == {"perm_fig1": kind}


def test_a_stage_the_lock_never_recorded_is_never_run_whatever_dvc_says():
    dvc = {PAPER + "charles_fig6": [{"changed deps": {"src/pflkit/x.py": "modified"}}]}
    assert status.classify(dvc, [PAPER + "charles_fig6"], PRODUCED, {PAPER + "charles_fig6"}) == {
        PAPER + "charles_fig6": "never run"}


def test_the_summary_is_a_line_per_pipeline_and_kind_with_names_cut_short():
    kinds = {"perm_fig1": "up to date", "perm_fig1_plot": "changed",
             **{f"{PAPER}s{i}": "not run here" for i in range(9)}, PAPER + "charles_fig6": "never run"}
    files = {k: (k.split(":")[0] if ":" in k else "dvc.yaml") for k in kinds}
    assert status.summary(kinds, files) == [
        "dvc.yaml: 2 stages: 1 up to date, 1 changed",
        "  changed (`dvc repro` re-runs them): perm_fig1_plot",
        "pipelines/paper/dvc.yaml: 10 stages: 9 not run here, 1 never run",
        "  not run here (outputs recorded in dvc.lock, not in this workspace: `dvc pull` or `dvc repro`): "
        "s0, s1, s2, s3, s4, s5, ... (3 more)",
        "  never run (no run recorded): charles_fig6"]
