"""benchmarks/drift.py: the same commit's results on two machines, compared per claim and per headline."""
import json

from repo_files import load

drift = load("benchmarks/drift.py")


def _run(root, margin, headline):
    (root / "results/perm_fig1").mkdir(parents=True)
    (root / "results/perm_fig1/metrics.json").write_text(json.dumps({"claim_perm_best": {"margin": margin}}))
    (root / "results/perm_fig1/headline.json").write_text(json.dumps({"perm_fig1": headline}))


def test_two_runs_give_each_claim_its_drift_and_verdicts_and_each_headline_its_spread(tmp_path):
    _run(tmp_path / "a", 0.02, {"perm": 0.98, "fedavg": 0.5, "final": {"Local": 0.8}})
    _run(tmp_path / "b", -0.01, {"perm": 0.95, "fedavg": 0.5, "final": {"Local": 0.7}})
    (tmp_path / "c/results/perm_fig1").mkdir(parents=True)  # a recorded run: headlines only
    (tmp_path / "c/results/perm_fig1/headline.json").write_text(json.dumps({"perm_fig1": {"perm": 0.99}}))
    out = tmp_path / "out"
    out.mkdir()
    got = drift.main([f"A={tmp_path / 'a'}", f"B={tmp_path / 'b'}", f"C={tmp_path / 'c'}", "--out", str(out)])
    fig1 = got["claims"]["perm-fig1-best"]
    assert abs(fig1["drift"] - 0.03) < 1e-12
    assert fig1["verdicts"] == {"A": "holds", "B": "does not hold"}
    assert abs(got["headlines"]["perm_fig1: perm"]["drift"] - 0.04) < 1e-12
    assert got["headlines"]["perm_fig1: fedavg"]["drift"] == 0
    assert abs(got["headlines"]["perm_fig1: final.Local"]["drift"] - 0.1) < 1e-12  # nested numbers too
    assert json.loads((out / "drift.json").read_text()) == got
    md = (out / "drift.md").read_text()
    assert "| perm-fig1-best | perm_fig1 | 0.03 | holds | does not hold |  |" in md
    assert "1 more headline numbers are identical on every run." in md
