"""The canary (pflkit.canary): how it cuts a profile's configs, and its verdicts on real stage runs."""
from pathlib import Path

import pytest
import yaml

from pflkit import canary
from pflkit.config import load_params, stage_values, validate_stage
from pflkit.paths import project_root

ROOT = project_root()


@pytest.fixture(scope="module")
def params():
    return load_params(ROOT / "params.yaml")


def test_cut_of_the_paper_profile(params):
    """Rounds past PERM's warm-up and first alpha update, one seed, every method, each grid's extremes;
    the model, the lrs, K and the batch size untouched."""
    full = stage_values(params, "perm_fig2", "paper")
    cut = canary.cut_values("perm_fig2", full)
    v = cut.values
    assert full["rounds"] == 300 and v["rounds"] == 25  # warm-up 10 + update_every 10 + 1 = 21 < 25
    assert v["seeds"] == [full["seeds"][0]] and cut.seeds_full == 3
    assert v["methods"] == full["methods"]
    for key in ("model", "lr", "local_steps", "batch_size", "finetune_lr", "perm", "pfedme"):
        assert v[key] == full[key], key
    assert v["num_clients"] == canary.MAX_CLIENTS and cut.clients_full == 50
    assert cut.scale == pytest.approx(300 / 25 * 3 * 50 / canary.MAX_CLIENTS)

    hetero = canary.cut_values("perm_hetero", stage_values(params, "perm_hetero", "paper"))
    assert hetero.values["rounds"] == 20 + 10 + 1  # its warm-up is 20 rounds, updates every 10

    grid = canary.cut_values("charles_fig13", stage_values(params, "charles_fig13", "paper"))
    g = grid.values
    assert g["gammas"] == [0.0, 10.0] and g["etas"] == [0.001, 10.0]
    assert (grid.settings_full, grid.settings_run) == (54, 4)
    assert {t["rounds"] for t in g["tasks"].values()} == {canary.GRID_ROUNDS}
    assert g["tune_window"] == canary.GRID_ROUNDS
    assert g["local_steps"] == 10
    assert g["tasks"]["cifar100"]["width"] == 1.0 and g["tasks"]["cifar100"]["batch_size"] == 20

    short = canary.cut_values("perm_fig2", full, rounds=2, grid_rounds=2)
    assert short.values["rounds"] == 2  # an explicit round count wins over the PERM horizon


def test_canary_params_validate_and_stay_under_build_canary(params):
    cut_params, cuts = canary.canary_params(params, "paper", ["perm_fig4", "perm_fig5", "charles_fig6"])
    target = canary.canary_profile("paper")
    for name in ("perm_fig4", "perm_fig5", "charles_fig6"):
        cfg = validate_stage(cut_params, name, target)
        assert cfg.results_dir == f"build/canary/paper/{name}"
    assert cuts["perm_fig4"].values["alpha_file"] == "build/canary/paper/perm_fig4/models/alpha.npz"
    assert cuts["perm_fig5"].values["alpha_file"] == "build/canary/paper/perm_fig4/models/alpha.npz"
    assert cuts["charles_fig6"].values["eval_samples"] == canary.EVAL_SAMPLES


def test_verdict_texts():
    log = ("stage perm_fig2 failed in cell 7: DivergenceError: Localized FedAvg diverged at round 20 "
           "(seed 0, lr=0.3, finetune_lr=0.3): loss 52.1 > 1e+03 x initial 2.3; lower the learning rate\n")
    assert canary.failure_reason(log, 1).startswith("diverged: Localized FedAvg diverged at round 20 (seed 0, lr=0.3")
    assert canary.failure_reason("stage x failed in cell 3: KeyError: 'a'\n", 1) == "error: KeyError: 'a'"
    assert canary.failure_reason("", -9) == "killed by signal 9"
    assert canary.memory_budget(0, 100) == 100 + canary.MEMORY_FLOOR
    assert canary.memory_budget(2**30, 100, factor=3.0) == 100 + 3 * 2**30


def _params_with(tmp_path: Path, params, lr: dict) -> str:
    p = dict(params)
    p["profiles"] = {**params["profiles"], "smoke": {**params["profiles"]["smoke"],
                                                       "perm_fig1": {**params["profiles"]["smoke"]["perm_fig1"],
                                                                     "lr": lr, "seeds": [0]}}}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(p, sort_keys=False))
    return str(path)


@pytest.mark.slow
def test_canary_fails_naming_stage_method_round_and_setting(tmp_path, params, capsys):
    """A learning rate set to diverge (localized FedAvg at 1e4 on perm_fig1's smoke setting) fails the canary
    with the stage, the method, the round and the learning rates; exit status 1."""
    lr = {**params["profiles"]["smoke"]["perm_fig1"]["lr"], "localized_fedavg": 1.0e4}
    code = canary.run_canary("smoke", ["perm_fig1"], _params_with(tmp_path, params, lr), rounds=2)
    err = capsys.readouterr().err
    assert code == 1
    line = next(x for x in err.splitlines() if x.startswith("  perm_fig1: FAILED"))
    assert "diverged: Localized FedAvg diverged at round " in line
    assert "lr=10000.0" in line and "seed 0" in line
    assert (ROOT / "build/canary/smoke/canary.csv").read_text().count("FAILED") == 1


@pytest.mark.slow
def test_canary_passes_with_the_profile_lrs(tmp_path, params, capsys):
    code = canary.run_canary("smoke", ["perm_fig1"], _params_with(tmp_path, params,
                                                                   params["profiles"]["smoke"]["perm_fig1"]["lr"]),
                             rounds=2)
    out = capsys.readouterr()
    assert code == 0, out.err
    row = next(x for x in out.out.splitlines() if x.startswith("| perm_fig1 "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "ok" and cells[2] == "2/5"
    assert float(cells[5]) > 0  # seconds per round, measured
