"""A compute stage's headline numbers (its DVC metrics, results/<stage>/headline.json): picked from metrics.json
by the stage table's entries (pflkit.headline), declared in dvc.yaml as git-kept metrics."""
import json
from pathlib import Path

import pytest
import yaml

from pflkit import stages
from pflkit.headline import HeadlineError, headline, main, write_headline
from pflkit.stages import Headline

ROOT = Path(__file__).resolve().parents[2]

METRICS = {
    "dataset": "fashion-mnist", "is_substitute": True, "paper_dataset": "cifar10",
    "final": {"PERM": {"accuracy_mean": 0.98023456789, "loss_mean": 0.05}, "Local": {"accuracy_mean": 0.963},
              "Majority class": {"accuracy_mean": 0.5, "note": "no loss"}},
    "claim_perm_best": {"margin": 0.0172, "holds": True, "best_other": "Local"},
    "summary": {"('gamma = 0.01', 5.0)": {"delta": 0.3}, "('gamma = 0.01', 50.0)": {"delta": 0.7},
                "('K = 100', 5.0)": {"delta": 0.9}},
    "seconds": {"mlp/PERM": {"mean": 2.0}, "mlp/FedAvg": {"mean": 1.0}, "logistic/PERM": {"mean": 0.1}},
}


def test_headline_picks_values_globs_and_reductions():
    entries = (Headline("accuracy", ("final", "*", "accuracy_mean")), Headline("margin", ("claim_perm_best", "margin")),
               Headline("holds", ("claim_perm_best", "holds")),
               Headline("delta_gamma_max", ("summary", "('gamma *", "delta"), "max"),
               Headline("delta_min", ("summary", "*", "delta"), "min"),
               Headline("perm_seconds", ("seconds", "*/PERM", "mean")),
               Headline("loss", ("final", "*", "loss_mean")),
               Headline("absent", ("flower", "*", "accuracy"), "max"), Headline("typo", ("claim_perm_bets", "margin")))
    assert headline(METRICS, entries) == {
        "dataset": "fashion-mnist", "substitute": True,
        "accuracy": {"PERM": 0.980235, "Local": 0.963, "Majority class": 0.5},  # 6 significant digits
        "margin": 0.0172, "holds": True, "delta_gamma_max": 0.7, "delta_min": 0.3,
        "perm_seconds": {"mlp/PERM": 2.0, "logistic/PERM": 0.1}, "loss": {"PERM": 0.05}}


def test_headline_refuses_an_unknown_reduction():
    with pytest.raises(ValueError, match="reduce must be 'max' or 'min', not 'mean'"):
        headline(METRICS, (Headline("x", ("final", "*", "accuracy_mean"), "mean"),))


def test_write_headline_writes_the_stage_tables_entries(tmp_path):
    (tmp_path / "metrics.json").write_text(json.dumps({
        **METRICS, "final": {"PERM": {"accuracy_mean": 0.9}, "FedAvg": {"accuracy_mean": 0.8}},
        "claim_perm_best": {"margin": 0.1}}))
    path = write_headline("perm_fig1", tmp_path)
    assert path == tmp_path / "headline.json"
    assert json.loads(path.read_text()) == {"perm_fig1": {"accuracy": {"FedAvg": 0.8, "PERM": 0.9},
                                                          "dataset": "fashion-mnist", "perm_margin": 0.1,
                                                          "substitute": True}}


def test_write_headline_names_the_file_and_the_stage_to_rerun(tmp_path):
    with pytest.raises(HeadlineError, match=r"metrics.json: cannot read .*run `dvc repro perm_fig1`"):
        write_headline("perm_fig1", tmp_path)
    (tmp_path / "metrics.json").write_text("[1, 2]")
    with pytest.raises(HeadlineError, match=r"not a JSON object; written by stage perm_fig1"):
        write_headline("perm_fig1", tmp_path)
    with pytest.raises(HeadlineError, match="perm_fig1_plot: not a compute stage; the compute stages are: perm_fig1,"):
        write_headline("perm_fig1_plot", tmp_path)


def test_main_rewrites_every_stage_with_results_and_says_which_did_not_run(tmp_path, capsys):
    (tmp_path / "perm_fig1").mkdir()
    (tmp_path / "perm_fig1/metrics.json").write_text(json.dumps(METRICS))
    assert main(["--results", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "perm_fig6: not run" in err and "1 headline file(s) written" in err
    assert json.loads((tmp_path / "perm_fig1/headline.json").read_text())["perm_fig1"]["perm_margin"] == 0.0172


def test_every_compute_stage_declares_its_headline_as_a_git_kept_dvc_metric():
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for stage in stages.compute_stages():
        assert stage.headline, f"{stage.name} has no headline numbers"
        assert spec[stage.name]["metrics"] == [{f"results/{stage.name}/headline.json": {"cache": False}}]
    assert all("metrics" not in spec[s.name] for s in stages.STAGES if s.is_plot)


@pytest.mark.parametrize("stage", [s.name for s in stages.compute_stages()])
def test_recorded_headline_has_every_entry_of_the_table_and_a_few_numbers(stage):
    """The headline files in git are the default pipeline's recorded run: each names every entry of its
    stage's row (a typo in a path would leave one out) and holds a few numbers: at most 14, perm_fig2's nine
    methods' accuracies, three margins and its substitute flag being the most."""
    recorded = json.loads((ROOT / "results" / stage / "headline.json").read_text())
    assert list(recorded) == [stage]
    recorded = recorded[stage]
    names = {h.name for h in stages.get(stage).headline}
    assert names <= set(recorded), f"missing: {names - set(recorded)}; run: python -m pflkit.headline {stage}"

    def count(node):
        return sum(count(v) for v in node.values()) if isinstance(node, dict) else int(not isinstance(node, str))
    assert 1 <= count(recorded) <= 14
