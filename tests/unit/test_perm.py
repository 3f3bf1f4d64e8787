"""PERM: mixing weights (eq. 2), shuffling (Alg. 1), single loop (Alg. 2), and the Fig. 1 claims."""
import pandas as pd
import pytest
import torch

from pflkit.algorithms import FedAvg, LocalizedFedAvg
from pflkit.algorithms.perm import (PERM, discrepancies, mixing_weights, objective, project_simplex, projected_gd,
                                    shuffle_clients, shuffle_steps, water_filling)
from pflkit.data import perm_synthetic
from pflkit.engine import FunctionalModel, broadcast, make_generator
from pflkit.models import logistic, mlp
from pflkit.runner import final_table, run_methods
from stage_params import build, perm_section

from reference import perm as ref


def _instance(seed, n_clients=7):
    g = torch.Generator().manual_seed(seed)
    grads = torch.randn(n_clients, 5, generator=g, dtype=torch.float64)
    n = torch.randint(3, 60, (n_clients,), generator=g).double()
    return discrepancies(grads), n


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("lam", [0.5, 5.0, 50.0, 500.0])
def test_gd_equals_water_filling_and_bisection(seed, lam):
    d, n = _instance(seed)
    exact = water_filling(d, n, lam)
    gd = projected_gd(d, n, lam, steps=20000)
    torch.testing.assert_close(exact.sum(1), torch.ones(len(n), dtype=torch.float64))
    assert (exact >= 0).all()
    torch.testing.assert_close(gd, exact, atol=1e-6, rtol=0)
    for i in range(len(n)):
        torch.testing.assert_close(exact[i], ref.water_filling_bisection(d[i], n, lam), atol=1e-9, rtol=0)
    # no feasible point does better (200 uniform simplex points: normalised exponentials, seeded)
    e = -torch.rand(200, len(n), generator=torch.Generator().manual_seed(seed), dtype=torch.float64).log()
    rand = e / e.sum(1, keepdim=True)
    best = objective(exact, d, n, lam)
    for i in range(len(n)):
        others = objective(rand, d[i].expand(200, -1), n, lam)
        assert (others >= best[i] - 1e-12).all()


def test_alpha_limits_closed_forms():
    d, n = _instance(0)
    # lambda -> infinity: the variance term dominates, alpha_j -> n_j / sum n
    torch.testing.assert_close(water_filling(d, n, 1e9), (n / n.sum()).expand(len(n), -1), atol=1e-6, rtol=0)
    # lambda -> 0: all mass on the smallest discrepancy, D_ii = 0 (alone)
    torch.testing.assert_close(water_filling(d, n, 1e-9), torch.eye(len(n), dtype=torch.float64))


def test_project_simplex_matches_bisection():
    g = torch.Generator().manual_seed(1)
    v = torch.randn(20, 9, generator=g, dtype=torch.float64) * 3
    p = project_simplex(v)
    for i in range(20):
        torch.testing.assert_close(p[i], ref.project_simplex_bisection(v[i]), atol=1e-9, rtol=0)



def test_projection_sorted_by_numpy_equals_the_torch_formulation_bit_for_bit():
    """project_simplex has numpy sort the rows; the torch-only formulation gives the same bits (ties,
    non-contiguous rows, float32 and float64)."""
    g = torch.Generator().manual_seed(0)
    for i in range(200):
        n = int(torch.randint(1, 60, (1,), generator=g))
        v = torch.randn(n, n, generator=g, dtype=torch.float64) * 10.0 ** float(torch.randint(-3, 3, (1,), generator=g))
        if i % 3 == 0:
            v = (v * 4).round() / 4  # ties
        if i % 4 == 0:
            v = v.T  # non-contiguous rows
        if i % 5 == 0:
            v = v.float()
        assert torch.equal(project_simplex(v), ref.project_simplex_sort(v))

def test_alpha_input_errors():
    d, n = _instance(0)
    with pytest.raises(ValueError, match="lambda must be >= 0"):
        water_filling(d, n, -1.0)
    with pytest.raises(ValueError, match="water_filling needs lambda > 0"):
        water_filling(d, n, 0.0)
    model = FunctionalModel(lambda: logistic((2,), 2))
    with pytest.raises(ValueError, match="alpha_solver must be one of"):
        PERM(model, local_steps=1, lr=0.1, batch_size=2, lam=1.0, alpha_solver="cvx")
    with pytest.raises(ValueError, match="needs lam > 0"):
        PERM(model, local_steps=1, lr=0.1, batch_size=2, lam=0.0, alpha_solver="exact")
    with pytest.raises(ValueError, match="update_every must be"):
        PERM(model, local_steps=1, lr=0.1, batch_size=2, lam=1.0, update_every=0)


def test_shuffle_schedule_is_a_latin_square_per_epoch():
    n = 9
    sigma = torch.randperm(n, generator=torch.Generator().manual_seed(3))
    table = torch.stack([shuffle_clients(sigma, j) for j in range(n)])  # [step, model] -> client
    everything = torch.arange(n)
    for j in range(n):  # every client hosts exactly one model per round
        assert torch.equal(table[j].sort().values, everything)
    for i in range(n):  # every model visits every client once per epoch
        assert torch.equal(table[:, i].sort().values, everything)


def test_batched_shuffling_equals_reference(mixed):
    factory = lambda: mlp((6,), 3, hidden=(7,))  # noqa: E731
    model = FunctionalModel(factory)
    n = mixed.num_clients
    g = torch.Generator().manual_seed(0)
    v = {k: torch.randn(n, *p.shape, generator=g) * 0.3 for k, p in model.init(0).items()}
    alpha = torch.distributions.Dirichlet(torch.ones(n)).sample((n,)).double()
    sigma = torch.randperm(n, generator=g)
    got, want = v, v
    for step in range(n):  # a whole epoch
        got = shuffle_steps(model, got, mixed, alpha, sigma, step, local_steps=3, lr=0.1, batch_size=4,
                            generator=make_generator(step))
        want = ref.shuffle_round(factory, want, mixed, alpha, sigma, step, 3, 0.1, 4, make_generator(step))
    for k in got:
        torch.testing.assert_close(got[k], want[k], atol=1e-5, rtol=1e-5)


def test_zero_weight_clients_leave_the_model_unchanged(mixed):
    model = FunctionalModel(lambda: logistic((6,), 3))
    n = mixed.num_clients
    v = broadcast(model.init(0), n)
    alpha = torch.eye(n, dtype=torch.float64)  # everyone alone
    sigma = torch.arange(n)
    out = shuffle_steps(model, v, mixed, alpha, sigma, 1, local_steps=3, lr=0.1, batch_size=4,
                        generator=make_generator(0))
    for k in v:  # step 1: model i sits on client i+1, where its weight is 0
        torch.testing.assert_close(out[k], v[k])


def test_single_loop_bookkeeping():
    data = perm_synthetic(6, 40, 5, seed=0)
    model = FunctionalModel(lambda: logistic((5,), 2))
    algo = PERM(model, local_steps=2, lr=0.1, batch_size=5, lam=10.0, warmup_rounds=2, update_every=3)
    s = algo.init(data, 0)
    assert s.v is None
    s = algo.round(algo.round(s))  # warm-up done: personalization starts with uniform alpha
    torch.testing.assert_close(s.alpha, torch.full((6, 6), 1 / 6, dtype=torch.float64))
    w_before = s.w
    s = algo.round(algo.round(s))
    assert s.shuffle_round == 2 and torch.equal(s.w["1.weight"], w_before["1.weight"])
    s = algo.round(s)  # third shuffle round: global step + alpha update
    assert not torch.equal(s.w["1.weight"], w_before["1.weight"])
    assert not torch.allclose(s.alpha, torch.full((6, 6), 1 / 6, dtype=torch.float64))
    torch.testing.assert_close(s.alpha.sum(1), torch.ones(6, dtype=torch.float64))
    # deterministic for a seed
    t = algo.init(data, 0)
    for _ in range(5):
        t = algo.round(t)
    assert torch.equal(t.v["1.weight"], s.v["1.weight"]) and torch.equal(t.alpha, s.alpha)


SMOKE = dict(num_clients=20, samples_per_client=200, dim=60)


def test_alpha_mass_stays_in_the_own_group():
    """Fig. 1 mechanism: at a FedAvg model, >= 90% of each client's alpha lies in its own group."""
    data = perm_synthetic(SMOKE["num_clients"], SMOKE["samples_per_client"], SMOKE["dim"], seed=0)
    model = FunctionalModel(lambda: logistic((60,), 2))
    fed = FedAvg(model, local_steps=10, lr=0.2, batch_size=20)
    s = fed.init(data, 0)
    for _ in range(5):
        s = fed.round(s)
    same = (data.groups[:, None] == data.groups[None, :]).double()
    for solver in ("exact", "gd"):
        alpha = mixing_weights(model, s.w, data, lam=300.0, solver=solver, steps=200)
        own = (alpha * same).sum(1)
        assert own.min() >= 0.9, own
        assert (alpha > 1e-6).sum(1).float().mean() >= 5  # it mixes, not alone


def test_perm_beats_the_baselines_on_synthetic():
    """Fig. 1 claim at smoke scale, each method with its tuned settings from params.yaml's sweep."""
    from pflkit.algorithms import PerFedAvg, PFedMe
    model = FunctionalModel(lambda: logistic((60,), 2))
    kw = dict(local_steps=10, batch_size=20)
    methods = {"PERM": lambda: PERM(model, lr=1.0, lam=300.0, update_every=5, alpha_steps=50, global_lr=0.5, **kw),
               "Localized FedAvg": lambda: LocalizedFedAvg(model, lr=2.0, finetune_steps=10, finetune_lr=2.0, **kw),
               "Per-FedAvg": lambda: PerFedAvg(model, alpha=1.0, beta=0.02, **kw),
               "pFedMe": lambda: PFedMe(model, lr=0.2, personal_lr=0.05, lam=20.0, **kw)}
    hist = run_methods(methods, lambda s: perm_synthetic(**SMOKE, seed=s), [0, 1], rounds=40, eval_every=40,
                       show_progress=False)
    table = final_table(hist)
    perm_acc = table.loc["PERM", "accuracy_mean"]
    for other in ("Localized FedAvg", "Per-FedAvg", "pFedMe", "Majority class"):
        assert perm_acc > table.loc[other, "accuracy_mean"] + 0.03, table


def test_fig6_alpha_sparse_on_one_class_split_and_diffuse_on_iid():
    """Fig. 6 claim on the real MNIST digits (smoke scale): same lambda, two partitions."""
    from pflkit.experiments.perm import fig6
    cfg = build(
        "perm_fig6", results_dir="build/t", figures_dir="build/t", device="cpu",
        dataset={"name": "mnist", "substitute": None, "allow_download": False, "root": "data/raw"}, num_clients=20,
        schemes={"iid": {"scheme": "iid"}, "one": {"scheme": "classes", "classes_per_client": 1}},
        test_fraction=0.2, hidden=[50], fedavg_rounds=3, local_steps=5, batch_size=20, lr=0.05, lam=2000.0, seed=0)
    result = fig6(cfg)
    panels, record = result.panels, result.metrics
    assert record["dataset"] == "mnist" and record["is_substitute"] is False
    one, iid = panels["one"].summary, panels["iid"].summary
    assert one["same_label_mass_mean"] >= 0.95 and one["same_label_mass_min"] >= 0.9
    assert one["effective_support_mean"] <= 3.0  # 20 clients / 10 classes = 2 per class
    assert iid["effective_support_mean"] >= 15.0  # diffuse over ~all 20 clients


def test_lr_sweep_records_divergence_and_goes_on(monkeypatch):
    from pflkit.experiments import curves, perm as experiment
    from pflkit.experiments.perm import lr_sweep
    dirs = []  # a sweep must not checkpoint into (and later delete) the stage's own build/checkpoints/<stage>

    def spy(*args, **kwargs):
        dirs.append(kwargs.get("checkpoint_dir"))
        return run_methods(*args, **kwargs)
    run_methods = curves.run_methods
    monkeypatch.setattr(curves, "run_methods", spy)
    cfg = build(
        "perm_fig1", results_dir="build/t", figures_dir="build/t", device="cpu", num_clients=4,
        samples_per_client=20, dim=5, test_fraction=0.2, rounds=3, local_steps=5, batch_size=5,
        lr={"fedavg": 0.1}, finetune_steps=1, finetune_lr=0.1, methods=["fedavg"], seeds=[0], eval_every=1)
    table = lr_sweep(cfg, [0.1, float("inf")], seeds=[0])
    assert table["diverged"].tolist()[0] == "" and "diverged at round" in table["diverged"].tolist()[1]
    assert table["best"].tolist() == [True, False]
    assert dirs == [None, None]
    experiment.fig1(cfg, show_progress=False)  # the stage itself checkpoints under its own name
    assert dirs[-1].parts[-2:] == ("checkpoints", "perm_fig1")


def _sweep_cfg(**over):
    return build(
        "perm_fig1", **{"results_dir": "build/t", "figures_dir": "build/t", "device": "cpu", "num_clients": 4,
                        "samples_per_client": 20, "dim": 5, "test_fraction": 0.2, "rounds": 4, "local_steps": 5,
                        "batch_size": 5, "lr": {"fedavg": 0.1, "local": 0.1}, "finetune_steps": 1,
                        "finetune_lr": 0.1, "methods": ["fedavg", "local"], "seeds": [0], "eval_every": 1, **over})


def test_lr_sweep_in_worker_processes_gives_the_sequential_table():
    """jobs=2 runs the cells in spawned workers (1 torch thread each here) and returns the same rows in the same
    order. The trained numbers are compared with rtol 1e-6: a worker's thread count may change a reduction's order;
    on this tiny logistic problem the two tables agreed exactly on 1 and 2 threads, so 1e-6 leaves only
    float-rounding room."""
    from pflkit.experiments.perm import lr_sweep
    cfg = _sweep_cfg()
    one = lr_sweep(cfg, [0.1, 0.5], seeds=[0])
    two = lr_sweep(cfg, [0.1, 0.5], seeds=[0], jobs=2)
    cols = ["method", "lr", "rounds", "seeds", "diverged", "device", "best"]
    assert one[cols].to_dict("records") == two[cols].to_dict("records")
    assert one["method"].tolist() == ["fedavg", "fedavg", "local", "local"] and one["device"].eq("cpu").all()
    pd.testing.assert_frame_equal(one[["accuracy", "loss"]], two[["accuracy", "loss"]], rtol=1e-6)
    assert (one["runtime_s"] >= 0).all()
    with pytest.raises(ValueError, match="jobs must be at least 1, got 0"):
        lr_sweep(cfg, [0.1], jobs=0)


def test_lr_sweep_window_is_the_stages_first_rounds_and_validated():
    """rounds=2 sweeps the first 2 rounds: the same numbers as the stage configured with 2 rounds; a window the
    stage's own rules refuse is refused by name before any cell runs."""
    from pflkit.config import ConfigError
    from pflkit.experiments.perm import lr_sweep
    window = lr_sweep(_sweep_cfg(rounds=6), [0.1], methods=["fedavg"], seeds=[0], rounds=2)
    short = lr_sweep(_sweep_cfg(rounds=2), [0.1], methods=["fedavg"], seeds=[0])
    assert window["rounds"].tolist() == [2]
    assert window[["accuracy", "loss"]].equals(short[["accuracy", "loss"]])  # same process, same ops: exact
    with pytest.raises(ConfigError, match=r"perm_fig1\.rounds"):
        lr_sweep(_sweep_cfg(), [0.1], rounds=0)


def test_periodic_alpha_updates_use_the_configured_solver():
    data = perm_synthetic(6, 40, 5, seed=0)
    model = FunctionalModel(lambda: logistic((5,), 2))
    algo = PERM(model, local_steps=1, lr=0.1, batch_size=5, lam=10.0, alpha_solver="exact", update_every=2)
    s = algo.init(data, 0)
    for _ in range(2):
        s = algo.round(s)
    torch.testing.assert_close(s.alpha, mixing_weights(model, s.w, data, 10.0, solver="exact"))


def test_own_group_mass_on_a_hand_built_alpha():
    from pflkit.experiments.perm import own_group_mass
    groups = torch.tensor([0, 0, 1, 1])
    alpha = torch.tensor([[0.5, 0.5, 0.0, 0.0],
                          [0.2, 0.3, 0.5, 0.0],
                          [0.1, 0.0, 0.0, 0.9],
                          [0.25, 0.25, 0.25, 0.25]])
    assert own_group_mass(alpha, groups).tolist() == pytest.approx([1.0, 0.5, 0.9, 0.5])


def test_fig1_reports_perm_alpha_per_seed():
    """fig1's metrics carry, per seed, PERM's own-group alpha mass and each group's label-1 share."""
    from pflkit.experiments.perm import fig1
    cfg = build(
        "perm_fig1", stage="perm_fig1_test", results_dir="build/t", figures_dir="build/t", device="cpu", num_clients=6,
        samples_per_client=40, dim=5, test_fraction=0.2, rounds=4, local_steps=5, batch_size=5,
        lr={"perm": 0.5}, finetune_steps=1, finetune_lr=0.1, methods=["perm"], seeds=[0, 1], eval_every=2,
        perm=perm_section(lam=300.0, alpha_solver="exact", global_lr=0.1, update_every=2))
    result = fig1(cfg, show_progress=False, checkpoint=False)
    got = result.metrics["perm_alpha"]
    assert sorted(got) == ["0", "1"]
    for seed, row in got.items():
        data = perm_synthetic(6, 40, 5, 0.2, seed=int(seed))
        counts = data.label_counts().double()
        for g in (0, 1):
            rows = data.groups == g
            assert row["label1_share_by_group"][str(g)] == pytest.approx(
                float(counts[rows, 1].sum() / counts[rows].sum()), abs=1e-4)
        assert 0.0 <= row["own_group_mass_min"] <= row["own_group_mass_mean"] <= 1.0


def test_perm_claim_compares_with_the_best_other_method():
    import pandas as pd
    from pflkit.experiments.curves import perm_claim
    from pflkit.experiments.perm import describe_claim
    table = pd.DataFrame({"accuracy_mean": [0.80, 0.82, 0.70, 0.95]},
                         index=["PERM", "pFedMe", "Per-FedAvg", "Majority class"])
    claim = perm_claim(table)
    assert claim == {"perm": 0.8, "best_other": "pFedMe", "best_other_value": 0.82, "margin": -0.02, "holds": False}
    assert "does NOT hold" in describe_claim(claim)
    table.loc["pFedMe", "accuracy_mean"] = 0.80
    assert perm_claim(table)["holds"] is True  # a tie is not a loss
    assert perm_claim(table.loc[["PERM", "Majority class"]]) is None  # nothing to compare with
    assert perm_claim(table.drop(index="PERM")) is None
    # a baseline beyond the paper (Ditto) is left out of the paper's claim and compared in its own
    table.loc["Ditto", "accuracy_mean"] = 0.9
    assert perm_claim(table)["best_other"] == "pFedMe" and perm_claim(table)["holds"] is True
    assert perm_claim(table, against=["Ditto"]) == {"perm": 0.8, "best_other": "Ditto", "best_other_value": 0.9,
                                                    "margin": -0.1, "holds": False}


def test_perm_claim_measures_the_margins_spread_over_seeds_paired():
    """margin_sd is the sample sd of the per-seed margins (same seed = same data and split): worked by hand."""
    import pandas as pd
    from pflkit.experiments.curves import perm_claim
    from pflkit.runner import final_table
    # final round 3 (round 1 is not final); seed s: PERM, Local = (0.90, 0.80), (0.85, 0.86), (0.95, 0.90)
    finals = {0: (0.90, 0.80), 1: (0.85, 0.86), 2: (0.95, 0.90)}
    rows = [(r, m, seed, "accuracy", v if r == 3 else 0.5) for seed, (p, loc) in finals.items()
            for m, v in (("PERM", p), ("Local", loc)) for r in (1, 3)]
    history = pd.DataFrame(rows, columns=["round", "method", "seed", "metric", "value"])
    claim = perm_claim(final_table(history, ("accuracy",)), history=history)
    margins = [0.10, -0.01, 0.05]
    mean = sum(margins) / 3
    sd = (sum((m - mean) ** 2 for m in margins) / 2) ** 0.5
    assert claim["seeds"] == 3 and claim["margin"] == round(mean, 4)
    assert claim["margin_sd"] == round(sd, 4) == 0.0551
    one = history[history["seed"] == 0]
    claim = perm_claim(final_table(one, ("accuracy",)), history=one)
    assert claim["seeds"] == 1 and "margin_sd" not in claim  # one seed: no spread to measure


def test_alpha_visits_draw_clients_in_proportion_to_alpha():
    from pflkit.algorithms.perm import alpha_visit_clients
    alpha = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0], [0.2, 0.3, 0.5]], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([alpha_visit_clients(alpha, g) for _ in range(20000)])  # [draws, models]
    freq = torch.stack([(draws == j).double().mean(0) for j in range(3)], 1)  # [model, client]
    torch.testing.assert_close(freq, alpha, atol=0.015, rtol=0)
    assert (draws[:, 0] != 2).all() and (draws[:, 1] == 2).all()  # alpha_ij = 0: never visited


def test_alpha_visits_with_identity_alpha_are_local_steps(mixed):
    """visit='alpha' with alpha = I: every model draws its own client and takes K plain steps eta there."""
    from pflkit.algorithms.perm import alpha_visit_steps
    from pflkit.engine.local_sgd import local_sgd
    model = FunctionalModel(lambda: logistic((6,), 3))
    n = mixed.num_clients
    v = broadcast(model.init(0), n)
    alpha = torch.eye(n, dtype=torch.float64)
    got = alpha_visit_steps(model, v, mixed, alpha, local_steps=3, lr=0.1, batch_size=None,
                            generator=make_generator(0))
    want, _ = local_sgd(model, v, mixed, torch.arange(n), steps=3, lr=0.1, batch_size=None,
                        generator=make_generator(0))
    for k in v:
        torch.testing.assert_close(got[k], want[k])


def test_visit_option_is_checked_and_alg1_stays_the_default():
    model = FunctionalModel(lambda: logistic((5,), 2))
    assert PERM(model, local_steps=1, lr=0.1, batch_size=2, lam=1.0).visit == "shuffle"
    with pytest.raises(ValueError, match="visit must be one of"):
        PERM(model, local_steps=1, lr=0.1, batch_size=2, lam=1.0, visit="bogus")
    data = perm_synthetic(6, 40, 5, seed=0)
    algo = PERM(model, local_steps=2, lr=0.1, batch_size=5, lam=10.0, visit="alpha")
    s = algo.init(data, 0)
    for _ in range(7):  # past one epoch: global step and alpha update as with visit='shuffle'
        s = algo.round(s)
    assert s.sigma is None and s.shuffle_round == 7
    torch.testing.assert_close(s.alpha.sum(1), torch.ones(6, dtype=torch.float64))


def test_perm_alpha_is_its_own_method_and_claim():
    import pandas as pd
    from pflkit.config import load_params, validate_stage
    from pflkit.experiments.curves import METHODS, perm_claim
    from pflkit.paths import resolve
    assert METHODS["perm_alpha"].name == "PERM (alpha visits)"
    model = FunctionalModel(lambda: logistic((5,), 2))
    cfg = validate_stage(load_params(resolve("params.yaml")), "perm_fig2")  # a stage that runs perm_alpha
    section = cfg.perm_alpha.model_copy(update={"lam": 7.0})
    cfg = cfg.model_copy(update={"lr": {**cfg.lr, "perm_alpha": 0.2}, "perm_alpha": section})
    a, b = METHODS["perm"].make(model, cfg), METHODS["perm_alpha"].make(model, cfg)
    assert (a.visit, a.lr, a.lam) == ("shuffle", cfg.lr["perm"], cfg.perm.lam)
    assert (b.visit, b.lr, b.lam) == ("alpha", 0.2, 7.0)
    table = pd.DataFrame({"accuracy_mean": [0.7, 0.9, 0.8, 0.4]},
                         index=["PERM", "PERM (alpha visits)", "Local", "Majority class"])
    assert perm_claim(table)["best_other"] == "Local" and not perm_claim(table)["holds"]
    claim = perm_claim(table, perm="PERM (alpha visits)")
    assert claim["best_other"] == "Local" and claim["holds"] and claim["margin"] == 0.1


def test_global_step_takes_the_mean_gradient_kept_by_the_last_alpha_update(monkeypatch):
    """w does not move between an alpha update and the next global step: that step reuses the exact mean
    gradient the alpha update kept in the state (the same bits as a fresh pass), and a pass is taken once w
    changed (after the global step) or nothing was kept (the first update after a uniform alpha)."""
    from pflkit.algorithms import perm as perm_module
    from pflkit.engine import full_gradients_at
    data = perm_synthetic(6, 40, 5, seed=0)
    model = FunctionalModel(lambda: logistic((5,), 2))
    calls = []
    monkeypatch.setattr(perm_module, "full_gradients_at",
                        lambda *args, **kw: calls.append(1) or full_gradients_at(*args, **kw))

    def run(reuse: bool):
        calls.clear()
        algo = PERM(model, local_steps=2, lr=0.1, batch_size=4, lam=0.5, alpha_solver="gd", alpha_steps=5,
                    global_lr=0.3, update_every=2)
        s = algo.init(data, 0)
        for _ in range(7):
            if not reuse:
                s.grad_mean = None
            s = algo.round(s)
        return s, len(calls)

    (a, reused), (b, fresh) = run(True), run(False)
    for k in a.w:
        assert torch.equal(a.w[k], b.w[k]) and not torch.equal(a.w[k], model.init(0)[k])
    assert torch.equal(a.alpha, b.alpha)
    for k in a.v:
        assert torch.equal(a.v[k], b.v[k])
    # 3 updates (rounds 2, 4, 6), each a global step and an alpha update: 6 passes, of which the 2nd and
    # 3rd global steps take the mean the previous alpha update kept
    assert (fresh, reused) == (6, 4)
    assert a.grad_mean is not None and all(torch.equal(a.grad_mean[k], g.mean(0))
                                           for k, g in full_gradients_at(model, a.w, data).items())


@pytest.mark.parametrize("stage", ["perm_fig1", "perm_fig2"])
def test_perm_sampled_alpha_pass_counts_in_the_memory_estimate(stage):
    """perm.alpha_samples = M gathers M rows of every client at once (``local_gradients``): a large M must be
    refused by validation naming that key (found by the params property test: 10^7 rows per client passed
    validation and then asked torch for 160 GiB), and the estimate grows by the rows it gathers."""
    import copy

    from pflkit.config import ConfigError, load_params, validate_stage
    params = load_params("params.yaml")
    base = validate_stage(params, stage, "default")
    assert base.alpha_sampling()[0] == 0  # the sections take the exact pass
    bigger = copy.deepcopy(params)
    bigger[stage]["perm"]["alpha_samples"] = 10 ** 7
    with pytest.raises(ConfigError, match=rf"^{stage}\.perm\.alpha_samples: the stage would need at least"):
        validate_stage(bigger, stage, "default")
    cfg = validate_stage(bigger, stage, "default", machine=False)
    need, key = cfg.memory_estimate()
    assert key == "perm.alpha_samples"
    features = cfg.dim + 1 if stage == "perm_fig1" else 28 * 28  # the synthetic data / the substitute's images
    assert need - base.memory_estimate()[0] >= cfg.num_clients * 10 ** 7 * 4 * features * 0.99


# --------------------------------------------------------------------------- TorchFed's fedshuffle rule
def test_gradient_correlation_equals_its_pairwise_twin():
    from pflkit.algorithms.perm import gradient_correlation
    g = torch.Generator().manual_seed(4)
    grads = {"w": torch.randn(5, 3, 4, generator=g), "b": torch.randn(5, 3, generator=g),
             "one": torch.randn(5, 1, generator=g),  # D = 1: no sample deviation, left out
             "dead": torch.zeros(5, 6)}  # client 0's gradient constant: left out, as the source skips it
    got = gradient_correlation(grads)
    want = ref.gradient_correlation({k: grads[k] for k in ("w", "b")})
    torch.testing.assert_close(got, want, atol=1e-9, rtol=0)
    torch.testing.assert_close(got, got.T)
    assert got.diagonal().min() > 0.999 and got.abs().max() <= 1.0
    with pytest.raises(ValueError, match="non-constant gradient"):
        gradient_correlation({"dead": torch.zeros(5, 6)})


def test_interpolated_visits_equal_the_model_by_model_twin(mixed):
    from pflkit.algorithms.perm import interpolate_visits, interpolation_weights
    from pflkit.engine.local_sgd import local_sgd
    factory = lambda: mlp((6,), 3, hidden=(7,))  # noqa: E731
    model = FunctionalModel(factory)
    n = mixed.num_clients
    g = torch.Generator().manual_seed(0)
    v = {k: torch.randn(n, *p.shape, generator=g) * 0.3 for k, p in model.init(0).items()}
    alpha = torch.rand(n, n, generator=g, dtype=torch.float64) * 2.4 - 1.2  # negatives and > 1: clipped
    sigma = torch.randperm(n, generator=g)
    got, want = v, v
    for step in range(n):
        clients = shuffle_clients(sigma, step)
        local, _ = local_sgd(model, got, mixed, clients, steps=3, lr=0.1, batch_size=4, generator=make_generator(step))
        got = interpolate_visits(got, local, interpolation_weights(alpha, clients))
        want = ref.interpolate_round(factory, want, mixed, alpha, sigma, step, 3, 0.1, 4, make_generator(step))
    for k in got:
        torch.testing.assert_close(got[k], want[k], atol=1e-5, rtol=1e-5)


def _fedshuffle(model, **kw):
    return PERM(model, local_steps=3, lr=0.5, batch_size=4, lam=1.0, warmup_rounds=2, alpha_init="correlation",
                update_every=None, visit="interpolate", **kw)


def test_interpolated_visit_is_the_local_result_scaled_by_alpha_never_a_larger_step():
    """The property that tells TorchFed's rule from Alg. 1: a visit moves model i by a (u_i - v_i), a in [0, 1],
    where u_i is K plain steps from v_i; Alg. 1 steps eta * alpha_ic * N, larger than the plain step whenever
    alpha_ic > 1 / N (here: by a factor of up to N alpha_max)."""
    from pflkit.engine.local_sgd import local_sgd
    data = perm_synthetic(6, 40, 5, seed=0)
    model = FunctionalModel(lambda: logistic((5,), 2))
    algo = _fedshuffle(model)
    s = algo.init(data, 0)
    for _ in range(2):  # the warm-up: FedAvg, then alpha estimated at its model, v_i = the initial model
        s = algo.round(s)
    assert s.alpha is not None and torch.allclose(s.alpha, s.alpha.T)
    start = broadcast(model.init(0), 6)
    for k in start:
        torch.testing.assert_close(s.v[k], start[k])
    seen = []
    for _ in range(8):
        before, gen = s.v, s.generator.get_state()
        sigma_before = s.sigma
        s = algo.round(s)
        step = (s.shuffle_round - 1) % 6
        clients = shuffle_clients(s.sigma, step)
        g = torch.Generator()
        g.set_state(gen)
        if sigma_before is None:
            torch.randperm(6, generator=g)  # the one permutation is drawn first
        local, _ = local_sgd(model, before, data, clients, steps=3, lr=0.5, batch_size=4, generator=g)
        a = s.alpha[torch.arange(6), clients].clamp(0, 1)
        for k in before:
            moved, plain = (s.v[k] - before[k]).flatten(1), (local[k] - before[k]).flatten(1)
            torch.testing.assert_close(moved, a[:, None].float() * plain, atol=1e-6, rtol=1e-5)
            assert bool((moved.norm(dim=1) <= plain.norm(dim=1) + 1e-6).all())
        seen.append(s.sigma)
    assert all(torch.equal(x, seen[0]) for x in seen)  # one permutation, rolled: never redrawn after an epoch
    alg1 = PERM(model, local_steps=3, lr=0.5, batch_size=4, lam=1.0)
    s1 = alg1.init(data, 0)
    s1.alpha = torch.full((6, 6), 0.02, dtype=torch.float64).fill_diagonal_(0.9)
    from pflkit.algorithms.perm import shuffle_step_sizes
    assert float(shuffle_step_sizes(s1.alpha, torch.arange(6), 0.5).max()) == pytest.approx(0.5 * 0.9 * 6)


def test_correlation_alpha_goes_with_interpolated_visits_only():
    model = FunctionalModel(lambda: logistic((5,), 2))
    with pytest.raises(ValueError, match="alpha_init='correlation'"):
        PERM(model, local_steps=1, lr=0.1, batch_size=2, lam=1.0, alpha_init="correlation")
    with pytest.raises(ValueError, match="visit='interpolate'"):
        PERM(model, local_steps=1, lr=0.1, batch_size=2, lam=1.0, visit="interpolate")
