"""Divergence (issue 16.4, issue 29): besides NaN/Inf, a run whose evaluated loss grows past its limits is
diverged, named with method, seed, round and lr. The rule (pflkit.runner): a loss above
ABORT_MULTIPLE x diverge_factor x the initial loss at any evaluation (round 0 included) stops the run at
once; a loss still above diverge_factor x the initial loss at the last round (it never came back) fails
the run; a spike that comes back below diverge_factor x initial by the last round is not divergence.
The initial loss is the round-0 loss capped at the chance level log(C): a method that takes steps before
its round-0 evaluation (pFedMe, Per-FedAvg, localized FedAvg) with a broken lr cannot move it.
The scripted losses start at 0.5, below log 2 (the synthetic data's chance level), so the round-0 loss
is the reference there."""
import math
import re

import pandas as pd
import pytest
import torch

from pflkit import runner
from pflkit.data.synthetic import perm_synthetic
from pflkit.engine import FunctionalModel
from pflkit.eval import ClientMetrics
from pflkit.algorithms import FedAvg
from pflkit.experiments import curves, perm as P
from pflkit.models import logistic
from pflkit.runner import ABORT_MULTIPLE, DIVERGE_FACTOR, DivergenceError, run, run_methods
from stage_params import build, perfedavg_section, perm_section, pfedme_section

MODEL = FunctionalModel(lambda: logistic((5,), 2))


def _data(seed=0):
    return perm_synthetic(6, 30, 5, 0.2, seed=seed)


def _fedavg(lr=0.1):
    return FedAvg(MODEL, local_steps=2, lr=lr, batch_size=5)


def _tiny_fig1(**overrides):
    settings = dict(
        stage="perm_fig1", results_dir="build/t", figures_dir="build/t", device="cpu", num_clients=6,
        samples_per_client=30, dim=5, test_fraction=0.2, rounds=6, local_steps=2, batch_size=5,
        lr={k: 0.1 for k in curves.CURVE_METHODS}, finetune_steps=2, finetune_lr=0.1,
        methods=list(curves.CURVE_METHODS),
        seeds=[0, 1],
        eval_every=2, perm=perm_section(lam=3.0, alpha_solver="gd", global_lr=0.1, update_every=2),
        perfedavg=perfedavg_section(alpha=0.02),
        pfedme=pfedme_section(personal_lr=0.01, lam=15.0), perm_torchfed={"warmup_rounds": 2},
        perm_alpha=perm_section(lam=3.0, alpha_solver="gd", global_lr=0.1, update_every=2),
        ditto={"lam": 0.1, "personal_steps": None})
    return build("perm_fig1", **{**settings, **overrides})


@pytest.fixture
def scripted_loss(monkeypatch):
    """Make the runner's evaluation report the given losses, one per evaluation (accuracy .5)."""
    def script(losses):
        it, calls = iter(losses), []

        def fake_evaluate(model, params, data):
            calls.append(1)
            n = data.num_clients
            return ClientMetrics(accuracy=torch.full((n,), 0.5, dtype=torch.float64),
                                 loss=torch.full((n,), float(next(it)), dtype=torch.float64),
                                 n=torch.ones(n, dtype=torch.long))
        monkeypatch.setattr(runner, "evaluate", fake_evaluate)
        return calls
    return script


def test_lr_1e6_diverges_naming_method_seed_round_and_lr():
    """The issue's case: the loss grows to ~1e5 (finite), which used to be reported as a result."""
    with pytest.raises(DivergenceError, match=r"^FedAvg diverged at round 1 \(seed 1, lr=1000000\.0\): "
                                              r"loss 1\.\d+e\+05 > 1000 x initial 0\.69\d*; lower the learning rate$"):
        run(_fedavg(1e6), _data(), 10, seed=1)


def test_lr_1e6_in_a_curve_stage_names_perm_seed_round_and_lr():
    cfg = _tiny_fig1(methods=["perm"], lr={"perm": 1e6}, seeds=[1])
    with pytest.raises(DivergenceError, match=r"^PERM diverged at round \d+ \(seed 1, lr=1000000\.0, "
                                              r"global_lr=0\.1\): loss .* > 1000 x initial"):
        P.fig1(cfg, show_progress=False, checkpoint=False)


def test_normal_runs_do_not_diverge():
    """Every Fig. 1 method at the smoke-like tiny scale, two seeds: no DivergenceError."""
    result = P.fig1(_tiny_fig1(), show_progress=False, checkpoint=False)
    loss = result.history[result.history.metric == "loss"]
    first = loss[loss["round"] == 0].set_index(["method", "seed"])["value"]
    last = loss[loss["round"] == 6].set_index(["method", "seed"])["value"]
    assert (last / first).max() < DIVERGE_FACTOR
    run(_fedavg(0.5), _data(), 8, seed=0)


def test_a_spike_that_comes_back_is_not_divergence(scripted_loss):
    scripted_loss([0.5, 25.0, 1.5, 1.0])  # 50 x initial once, 2 x at the end
    h = run(_fedavg(), _data(), 3, seed=0)
    assert h[h.metric == "loss"]["value"].tolist() == [0.5, 25.0, 1.5, 1.0]


def test_a_loss_that_never_comes_back_diverges_at_the_last_round(scripted_loss):
    scripted_loss([0.5, 1.0, 2.5, 5.5])
    with pytest.raises(DivergenceError, match=re.escape(
            "FedAvg diverged at round 3 (seed 4, lr=0.1): loss 5.5 > 10 x initial 0.5 at the last round; "
            "lower the learning rate")):
        run(_fedavg(), _data(), 3, seed=4)


def test_a_blow_up_stops_the_run_at_once(scripted_loss):
    calls = scripted_loss([0.5, 2.0, 0.5 * ABORT_MULTIPLE * DIVERGE_FACTOR * 1.01] + [1.0] * 20)
    algo = _fedavg()
    rounds_run = []
    original = algo.round
    algo.round = lambda s: rounds_run.append(s.round) or original(s)
    with pytest.raises(DivergenceError, match=r"FedAvg diverged at round 2 \(seed 0, lr=0\.1\): "
                                              r"loss 505 > 1000 x initial 0\.5; lower"):
        run(algo, _data(), 20, seed=0)
    assert rounds_run == [0, 1] and len(calls) == 3


def test_diverge_factor_is_a_parameter(scripted_loss):
    scripted_loss([0.5, 1.0, 2.5, 5.5])
    run(_fedavg(), _data(), 3, seed=0, diverge_factor=20)
    scripted_loss([0.5, 1e9, 2.5, 5.5])
    run(_fedavg(), _data(), 3, seed=0, diverge_factor=math.inf)  # inf: only NaN/Inf counts
    scripted_loss([0.5, 1.0, 2.5, 5.5])
    with pytest.raises(DivergenceError, match=r"loss 5.5 > 10 x initial 0.5 at the last round"):
        run_methods({"FedAvg": _fedavg}, lambda s: _data(), [0], 3, show_progress=False)
    scripted_loss([0.5, 1.0, 2.5, 5.5])
    run_methods({"FedAvg": _fedavg}, lambda s: _data(), [0], 3, show_progress=False, diverge_factor=12.0)
    for bad in (1, 0.5, -3, True, float("nan"), "10"):
        with pytest.raises(ValueError, match=r"diverge_factor must be a number > 1"):
            run(_fedavg(), _data(), 3, seed=0, diverge_factor=bad)


def test_a_finished_diverged_run_read_back_from_its_checkpoint_still_fails(tmp_path, scripted_loss):
    scripted_loss([0.5, 1.0, 2.5, 5.5])
    with pytest.raises(DivergenceError, match="at round 3"):
        run(_fedavg(), _data(), 3, seed=0, checkpoint=tmp_path / "c.pt", checkpoint_every=1)
    calls = scripted_loss([])  # nothing is evaluated again: the finished run is read back
    with pytest.raises(DivergenceError, match=r"loss 5.5 > 10 x initial 0.5 at the last round"):
        run(_fedavg(), _data(), 3, seed=0, checkpoint=tmp_path / "c.pt", checkpoint_every=1)
    assert calls == []


def test_lr_sweep_records_loss_growth_as_diverged_and_goes_on():
    cfg = _tiny_fig1(methods=["fedavg"], seeds=[0], rounds=3, eval_every=1)
    table = P.lr_sweep(cfg, [0.1, 1e6], seeds=[0])
    ok, bad = table.to_dict("records")
    assert ok["diverged"] == "" and ok["best"] and not bad["best"]
    assert math.isnan(bad["accuracy"]) and re.search(
        r"FedAvg diverged at round 1 \(seed 0, lr=1000000\.0\): loss .* > 1000 x initial", bad["diverged"])
    assert isinstance(table, pd.DataFrame)


def test_a_round_0_loss_above_chance_is_capped_at_chance(scripted_loss):
    """A run broken before its first evaluation: the reference is log 2, not its own huge round-0 loss."""
    scripted_loss([9e4, 9e4, 9e4])
    with pytest.raises(DivergenceError, match=r"FedAvg diverged at round 0 \(seed 0, lr=0\.1\): loss 9e\+04 > 1000 x "
                                              r"initial 0\.693"):
        run(_fedavg(), _data(), 2, seed=0)
    scripted_loss([0.9, 0.8, 0.7])  # above chance at round 0 but not broken: compared with log 2, it passes
    run(_fedavg(), _data(), 2, seed=0)
    assert runner.reference_loss(0.5, 2) == 0.5 and runner.reference_loss(5.0, 10) == pytest.approx(math.log(10))
    assert runner.reference_loss(float("nan"), 2) == pytest.approx(math.log(2))
    assert runner.reference_loss(3.0, None) == 3.0


# every curve method with a learning rate that breaks it from the first step, pFedMe's personal step
# included (the probe's case: pFedMe at lr 1e6 ran to the end with loss ~93,000 from round 0)
BROKEN = [("local", {"lr": {"local": 1e6}}), ("fedavg", {"lr": {"fedavg": 1e6}}),
          ("localized_fedavg", {"lr": {"localized_fedavg": 1e6}, "finetune_lr": 1e6}),
          ("perm", {"lr": {"perm": 1e6}}), ("perm_alpha", {"lr": {"perm_alpha": 1e6}}),
          ("perm_torchfed", {"lr": {"perm_torchfed": 1e6}}),
          ("perfedavg_fo", {"lr": {"perfedavg_fo": 1e6}}), ("perfedavg_hf", {"lr": {"perfedavg_hf": 1e6}}),
          ("pfedme", {"lr": {"pfedme": 1e6}, "pfedme": pfedme_section(personal_lr=1e6, lam=20.0)}),
          ("ditto", {"lr": {"ditto": 1e6}})]


def test_broken_methods_table_covers_every_method():
    assert sorted(m for m, _ in BROKEN) == sorted(curves.CURVE_METHODS)


@pytest.mark.parametrize("method,overrides", BROKEN, ids=[m for m, _ in BROKEN])
def test_every_method_with_a_broken_lr_diverges(method, overrides):
    cfg = _tiny_fig1(methods=[method], seeds=[0], **overrides)
    name = curves.METHODS[method].name
    with pytest.raises(DivergenceError, match=rf"^{re.escape(name)} diverged at round \d+ \(seed 0, "):
        P.fig1(cfg, show_progress=False, checkpoint=False)
