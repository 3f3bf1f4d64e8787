"""The claims ledger (scripts/claims.py + claims.yaml): rules, paths, verdicts on crafted results."""
import csv
import importlib.util
import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("claims_ledger", ROOT / "scripts/claims.py")
claims = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(claims)

#: a 1 x 1 PNG, so the page's figure cells have something to load
PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
                    "0000000d4944415478da63f8ffff3f0005fe02fea7d6a4b10000000049454e44ae426082")


@pytest.mark.parametrize("rule, columns, verdict", [
    ("> 0", [[0.1, 2.0]], True), ("> 0", [[0.1, 0.0]], False),
    ("<= 1.5", [[1.5]], True), ("< 1e-9", [[2e-9]], False),
    ("abs < 0.05", [[-0.04, 0.01]], True), ("abs < 0.05", [[-0.06]], False),
    ("between 1.8 2.2", [[1.9]], True), ("between 1.8 2.2", [[2.3]], False),
    ("true", [[True, 1.0]], True), ("true", [[True, False]], False), ("true", [["yes"]], False),
    ("increasing", [[1, 2, 3]], True), ("increasing", [[1, 1, 3]], False),
    ("decreasing", [[3, 2, 1]], True), ("increasing", [[1, 5], [2, 6]], True), ("increasing", [[1, 5], [2, 4]], False),
    ("nondecreasing", [[1.0, 2.0], [1.0, 2.5]], True), ("nondecreasing", [[1.0], [0.5]], False),
    ("within 0.01", [[0.1, 0.5], [0.105, 0.509]], True), ("within 0.01", [[0.1], [0.2]], False),
])
def test_each_rule_decides_both_ways(rule, columns, verdict):
    assert claims.decide(rule, columns) is verdict


def test_a_bad_rule_names_the_allowed_ones():
    with pytest.raises(ValueError, match="unknown rule 'about 2'; allowed: true, < x"):
        claims.check_rule("about 2")


def test_paths_take_keys_globs_and_positions_in_natural_order():
    tree = {"summary": {"zeta=10": {"v": 3}, "zeta=2": {"v": 2}, "zeta=1": {"v": 1}},
            "central": {"|x_T - x*|": 5, "|x_T - x*(a)|": 6}}
    assert claims.lookup(tree, ["summary", "*", "v"]) == [1, 2, 3]  # 2 before 10: numbers compare as numbers
    assert claims.lookup(tree, ["summary", "#-1", "v"]) == [3]
    assert claims.lookup(tree, ["central", "|x_T - x*|"]) == [5]  # an exact key wins over its glob reading
    with pytest.raises(claims.Missing, match="no key 'w'"):
        claims.lookup(tree, ["summary", "*", "w"])


def _project(tmp_path: Path) -> Path:
    """A results tree: perm_fig1 holds, perm_fig4 was crafted to fail, perm_fig5 lacks its key,
    perm_fig6 has not run; a smoke profile ran perm_fig1 only."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"defaults": {}, "profiles": {"smoke": {}}}))
    final = {"PERM": {"accuracy_mean": 0.8, "accuracy_std": 0.01}}
    runs = {"results/perm_fig1": {"claim_perm_best": {"margin": 0.02}, "final": final, "dataset": "perm-synthetic"},
            "results/perm_fig4": {"claim_perm_best": {"margin": -0.1}, "final": final, "dataset": "fashion-mnist",
                                  "is_substitute": True, "paper_dataset": "emnist-byclass"},
            "results/perm_fig5": {"something else": 1.0},
            "build/smoke/perm_fig1": {"claim_perm_best": {"margin": -0.3}, "final": {"PERM": {"accuracy_mean": 0.5}}}}
    for folder, metrics in runs.items():
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "metrics.json").write_text(json.dumps(metrics))
    (tmp_path / "figures" / "perm").mkdir(parents=True)
    for name in ("fig1_synthetic", "fig4_emnist", "fig5_alpha_heatmap", "fig6_mnist_alpha"):
        (tmp_path / "figures" / "perm" / f"{name}.png").write_bytes(PNG)
    entries = [{"id": f"t-{stage}", "paper": "PERM", "figure": f"Fig. {n}", "stage": stage, "claim": "PERM is best",
                "metric": "PERM minus the best other", "value": ["claim_perm_best", "margin"], "rule": "> 0",
                "show": ["final", "PERM", "accuracy_mean"], "sd": ["final", "PERM", "accuracy_std"], "why": "w"}
               for n, stage in ((1, "perm_fig1"), (4, "perm_fig4"), (5, "perm_fig5"), (6, "perm_fig6"))]
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump(entries))
    return tmp_path


def test_crafted_results_give_every_verdict(tmp_path):
    root = _project(tmp_path)
    rows = claims.main(["--claims", str(root / "claims.yaml")], root=root)
    got = {(r["id"], r["profile"]): r for r in rows}
    assert got["t-perm_fig1", "default"]["verdict"] == "holds"
    assert got["t-perm_fig1", "default"]["estimate"] == "0.8 ± 0.01"
    assert got["t-perm_fig4", "default"]["verdict"] == "does not hold"  # the crafted failure fails
    assert got["t-perm_fig4", "default"]["dataset"] == "fashion-mnist (substitute for emnist-byclass)"
    assert got["t-perm_fig4", "default"]["substitute"] is True
    assert got["t-perm_fig5", "default"]["verdict"] == "no value"
    assert got["t-perm_fig6", "default"]["verdict"] == "not run"
    assert got["t-perm_fig1", "smoke"]["verdict"] == "does not hold"
    assert got["t-perm_fig1", "smoke"]["estimate"] == "0.5"  # one seed: no sd
    table = list(csv.DictReader((root / "results/claims.csv").open()))
    assert [(r["id"], r["profile"], r["verdict"]) for r in table][:2] == [
        ("t-perm_fig1", "default", "holds"), ("t-perm_fig1", "smoke", "does not hold")]
    assert "| Fig. 4 | PERM is best | PERM minus the best other: -0.1 (0.8 ± 0.01) | **does not hold** |" in (
        root / "results/claims.md").read_text()
    page = (root / "reports/index.html").read_text()
    assert page.count('src="../figures/perm/fig1_synthetic.png"') == 1 and 'href="perm/fig4_emnist.ipynb"' in page
    assert json.loads((root / "results/claims/perm_fig4.json").read_text()) == {"claims": 1, "holding": 0,
                                                                                "value": -0.1}
    assert json.loads((root / "results/claims/charles_fig1.json").read_text()) == {"claims": 0, "holding": 0}
    with pytest.raises(SystemExit, match="t-perm_fig5: no key 'claim_perm_best'"):
        claims.main(["--claims", str(root / "claims.yaml"), "--check"], root=root)


def test_the_dvc_stage_shows_the_default_profile_only(tmp_path):
    root = _project(tmp_path)
    rows = claims.main(["--claims", str(root / "claims.yaml"), "--profiles", "default"], root=root)
    assert {r["profile"] for r in rows} == {"default"}
    with pytest.raises(SystemExit, match="--profiles: unknown \\['paper'\\]"):
        claims.main(["--claims", str(root / "claims.yaml"), "--profiles", "paper"], root=root)


def test_every_claim_of_claims_yaml_resolves_on_the_smoke_results():
    """claims.yaml against tests/regression/expected (every stage's committed smoke results): every
    path exists and every rule applies, so a renamed metric fails here, not in the ledger."""
    entries = yaml.safe_load((ROOT / "claims.yaml").read_text())
    ids = [c["id"] for c in entries]
    assert len(ids) == len(set(ids)) >= 40
    stages = {s.name for s in claims.load_stages().STAGES if not s.is_plot}
    assert {c["stage"] for c in entries} == stages, "every compute stage has a claim, and only compute stages"
    rows = claims.evaluate(entries, {"smoke": ROOT / "tests/regression/expected"})
    only_default = {c["id"] for c in entries if "smoke" not in c.get("profiles", ["smoke"])}
    assert {r["id"] for r in rows if r["verdict"] == "not run"} == only_default
    problems = [f"{r['id']}: {r['verdict']} {r['value']}" for r in rows if r["verdict"] == "no value"]
    assert not problems, problems
