"""Personalized evaluation, the majority baseline, the runner's history, determinism, divergence."""
import pandas as pd
import pytest
import torch

from pflkit.algorithms import FedAvg, Local
from pflkit.engine import FunctionalModel, broadcast
from pflkit.eval import evaluate, majority_baseline
from pflkit.models import logistic
from pflkit.runner import DivergenceError, final_table, run, run_methods

from reference.fedavg import _module_with

FACTORY = lambda: logistic((6,), 3)  # noqa: E731


def test_evaluate_matches_per_client_loop(mixed):
    model = FunctionalModel(FACTORY)
    g = torch.Generator().manual_seed(0)
    params = {k: torch.randn(mixed.num_clients, *v.shape, generator=g) for k, v in model.init(0).items()}
    m = evaluate(model, params, mixed, chunk=2)
    losses, accs, ns = [], [], []
    for j in range(mixed.num_clients):
        module = _module_with(FACTORY, {k: v[j] for k, v in params.items()})
        x, y = mixed.client(j, "test")
        with torch.no_grad():
            out = module(x)
        losses.append(torch.nn.functional.cross_entropy(out, y).item())
        accs.append((out.argmax(1) == y).double().mean().item())
        ns.append(len(y))
    torch.testing.assert_close(m.loss, torch.tensor(losses, dtype=torch.float64), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(m.accuracy, torch.tensor(accs, dtype=torch.float64))
    s = m.summary()
    assert s["accuracy"] == pytest.approx(sum(accs) / len(accs))
    assert s["accuracy_weighted"] == pytest.approx(sum(a * n for a, n in zip(accs, ns)) / sum(ns))


def test_weighted_and_unweighted_means_differ_for_unequal_clients():
    from pflkit.eval import ClientMetrics
    m = ClientMetrics(torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([0.1, 0.9], dtype=torch.float64),
                      torch.tensor([30, 10]))
    s = m.summary()
    assert s["accuracy"] == 0.5 and s["accuracy_weighted"] == 0.75
    assert s["loss_weighted"] == pytest.approx(0.3)


def test_majority_baseline(mixed):
    base = majority_baseline(mixed)
    majority = mixed.label_counts().argmax(1)
    for j in range(mixed.num_clients):
        _, y = mixed.client(j, "test")
        assert base.accuracy[j] == pytest.approx((y == majority[j]).double().mean().item())


def test_history_is_tidy_and_deterministic(mixed):
    model = FunctionalModel(FACTORY)
    methods = {"Local": lambda: Local(model, local_steps=2, lr=0.1, batch_size=3),
               "FedAvg": lambda: FedAvg(model, local_steps=2, lr=0.1, batch_size=3)}
    h1 = run_methods(methods, lambda s: mixed, [0, 1], rounds=4, eval_every=2, show_progress=False)
    h2 = run_methods(methods, lambda s: mixed, [0, 1], rounds=4, eval_every=2, show_progress=False)
    pd.testing.assert_frame_equal(h1, h2)
    assert list(h1.columns) == ["round", "method", "seed", "metric", "value"]
    assert sorted(h1[h1.method == "FedAvg"]["round"].unique()) == [0, 2, 4]
    assert set(h1.method) == {"Local", "FedAvg", "Majority class"}
    h3 = run_methods(methods, lambda s: mixed, [2], rounds=4, eval_every=2, show_progress=False)
    assert not h3[h3.method == "FedAvg"]["value"].equals(h1[(h1.method == "FedAvg") & (h1.seed == 0)]["value"])
    table = final_table(h1)
    assert {"accuracy_mean", "accuracy_std", "loss_mean", "loss_std"} <= set(table.columns)


def test_divergence_names_method_round_and_lr(mixed):
    model = FunctionalModel(FACTORY)
    with pytest.raises(DivergenceError, match=r"FedAvg diverged at round \d+ \(seed 0, lr=1e\+38\)"):
        run(FedAvg(model, local_steps=5, lr=1e38, batch_size=3), mixed, rounds=5, seed=0)


def test_personalized_count_must_match_clients(mixed):
    model = FunctionalModel(FACTORY)
    with pytest.raises(ValueError, match="one model per client: got 2 models for 5 clients"):
        evaluate(model, broadcast(model.init(0), 2), mixed)


def test_metrics_json_holds_results_only_and_is_byte_identical_across_reruns(tmp_path):
    """Runtimes, environment and config go to run.json: a re-run gives the same metrics.json bytes."""
    import json

    from pflkit.report import write_stage
    first = {"final": {"PERM": {"accuracy_mean": 0.9}}, "runtime_s": 12.3, "environment": {"threads": 1},
             "tasks": {"femnist": {"params": 10, "seconds": 4.0}}, "config": {"rounds": 5}}
    write_stage(str(tmp_path / "a/s"), first, run_info={"stage": "s"})  # two runs of stage s
    write_stage(str(tmp_path / "b/s"), {**first, "runtime_s": 99.0,
                                        "tasks": {"femnist": {"params": 10, "seconds": 7.5}}})
    assert (tmp_path / "a/s/metrics.json").read_bytes() == (tmp_path / "b/s/metrics.json").read_bytes()
    assert json.loads((tmp_path / "a/s/metrics.json").read_text()) == {
        "final": {"PERM": {"accuracy_mean": 0.9}}, "tasks": {"femnist": {"params": 10}},
        "provenance": {"stage": "s", "settings": None}}  # a folder outside results/ and build/: no profile
    run = json.loads((tmp_path / "a/s/run.json").read_text())
    assert run["stage"] == "s" and run["runtime_s"] == 12.3 and run["tasks.femnist.seconds"] == 4.0
    assert run["environment"] == {"threads": 1} and run["config"] == {"rounds": 5}


def test_run_callbacks_add_metrics_at_every_evaluation_without_changing_training(mixed):
    """A callback sees (round, state) at each evaluation and its returned metrics join the history;
    the training trajectory and the built-in metrics are unchanged (exactly)."""
    from pflkit.runner import RoundTimer
    model = FunctionalModel(lambda: logistic((6,), 3))
    algo = FedAvg(model, local_steps=2, lr=0.1, batch_size=3)
    seen = []

    def norm(r, state):
        seen.append(r)
        return {"w_norm": float(sum((v ** 2).sum() for v in state.w.values()) ** 0.5)}

    plain = run(algo, mixed, rounds=4, seed=1, eval_every=2)
    timer = RoundTimer()
    extra = run(algo, mixed, rounds=4, seed=1, eval_every=2, callbacks=[norm, timer])
    assert seen == [0, 2, 4]
    same = extra[~extra["metric"].isin(["w_norm", "seconds_per_round"])].reset_index(drop=True)
    pd.testing.assert_frame_equal(same, plain)
    norms = extra[extra["metric"] == "w_norm"]
    assert list(norms["round"]) == [0, 2, 4] and norms["value"].iloc[-1] != norms["value"].iloc[0]
    timing = extra[extra["metric"] == "seconds_per_round"]
    assert list(timing["round"]) == [2, 4] and (timing["value"] > 0).all()
