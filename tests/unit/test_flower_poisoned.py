"""A federated server that believes no client: one client of the federation poisons its replies
(tests/reference/poisoned.py: pflkit's own client code, named by its import path, so every engine runs it
and nothing of Flower is patched). Every reply is checked against its job before it touches the aggregate:
a bad one stops the run naming client, node, round, pass and key, or, where ``min_clients`` allows, is
dropped exactly as a client that did not answer; a model scaled far is caught by the in-process divergence
rule, or bounded by a robust aggregator. On the one-process protocol here, and on Flower's simulation
engine (when Flower is installed; `make test` runs this file); the deployment engine's twin is in
tests/integration/test_flower.py (`make test-flower`)."""
import math
import re

import pytest
import torch

from reference.poisoned import DATA, REFUSED, ROUNDS, SEED, poisoned, refusal
from reference.poisoned import model as _model
from reference.poisoned import spec as _spec

from pflkit.algorithms import FedAvg
from pflkit.data import perm_synthetic
from pflkit.divergence import DivergenceError
from pflkit.flower.loopback import run_loopback
from pflkit.flower.server import RejectedReply
from pflkit.runner import run


def _final(history) -> dict:
    return history[history["round"] == ROUNDS].set_index("metric")["value"].to_dict()


@pytest.mark.parametrize("poison", list(REFUSED))
def test_a_bad_reply_stops_a_run_that_needs_every_client_naming_client_round_pass_and_key(poison):
    with pytest.raises(RejectedReply, match=refusal(poison, "in this process: no node") + r".*The run needs every "
                                                                                          r"client"):
        run_loopback(_spec(poisoned(_model(), poison)))


@pytest.mark.parametrize("poison", list(REFUSED))
def test_a_bad_reply_is_dropped_as_a_missing_one_where_min_clients_allows(poison):
    """With min_clients=2 the run goes on without client 1 from round 1's pass, and is, bit for bit, the run in
    which client 1 fell silent at that pass; the server records the refusal (pass, round, step, key, reason)."""
    spec = _spec(poisoned(_model(), poison), min_clients=2)
    history, server = run_loopback(spec)
    key, why = REFUSED[poison]
    got = server.rejected[1]
    assert (got["pass"], got["round"], got["step"], got["key"]) == (1, 1, "poisoned_models", key)
    assert re.match(why, got["reason"])
    assert server.lost == {1: 1} and list(server.rejected) == [1]
    assert server.participation[1]["rejected"] == {1: f"{key}: {got['reason']}"}
    silent, twin = run_loopback(spec, fail_from={1: 1})
    assert silent.equals(history) and all(torch.equal(twin.state.w[k], v) for k, v in server.state.w.items())


def test_a_model_scaled_far_diverges_on_the_protocol_as_in_process_and_a_median_bounds_it():
    """Client 1 sends its local model x 1e4 every round (finite: no reply check can refuse it). With the mean
    the federated run stops at the same round, with the same DivergenceError, as the batched in-process run;
    with the coordinate-wise median it completes, its final loss within 1.5 x the honest median run's."""
    alg = poisoned(_model(), "scale")
    with pytest.raises(DivergenceError) as in_process:
        run(alg, perm_synthetic(**DATA), ROUNDS, SEED, eval_every=2)
    with pytest.raises(DivergenceError) as federated:
        run_loopback(_spec(alg))
    assert str(federated.value) == str(in_process.value)
    assert "Poisoned FedAvg diverged at round 2 (seed 3, lr=0.3): loss" in str(federated.value)
    robust, _ = run_loopback(_spec(poisoned(_model(), "scale", aggregator="median")))
    honest, _ = run_loopback(_spec(FedAvg(_model(), local_steps=3, lr=0.3, batch_size=4, aggregator="median")))
    assert math.isfinite(_final(robust)["loss"]) and _final(robust)["loss"] <= 1.5 * _final(honest)["loss"]


@pytest.mark.parametrize("lr, match", [(500.0, r"round 4 .*loss 64.4 > 10 x initial 0.693 at the last round"),
                                       (1e5, r"round 2 .*loss 8.22e\+03 > 1000 x initial 0.693;")],
                         ids=["the last round's limit", "a blow-up"])
def test_the_federated_run_applies_the_in_process_divergence_rule_to_a_method_that_diverges_honestly(lr, match):
    """No poison: FedAvg at a huge lr diverges in process; the protocol stops it with the same error (the rule of
    pflkit.divergence: its last-round and its blow-up limits), where before it finished with whatever loss it
    reached."""
    alg = FedAvg(_model(), local_steps=3, lr=lr, batch_size=4)
    with pytest.raises(DivergenceError, match=match) as in_process:
        run(alg, perm_synthetic(**DATA), ROUNDS, SEED, eval_every=2)
    with pytest.raises(DivergenceError, match=match) as federated:
        run_loopback(_spec(alg))
    assert str(federated.value) == str(in_process.value)
    finished, _ = run_loopback(_spec(alg, diverge_factor=None))  # no loss-growth check: it runs to the end
    assert set(finished["round"]) == {0, 2, 4}


@pytest.mark.parametrize("factor, match", [(1.0, "got 1.0"), (float("inf"), "got inf"), ("10", "got '10'"),
                                           (True, "got True")])
def test_a_bad_diverge_factor_is_refused_by_name(factor, match):
    with pytest.raises(ValueError, match=rf"diverge_factor must be None \(no loss-growth check\) or a finite number "
                                         rf"> 1, {match}"):
        _spec(FedAvg(_model(), local_steps=3, lr=0.3, batch_size=4), diverge_factor=factor)


# --------------------------------------------------------------------------- Flower's simulation engine
@pytest.mark.slow  # three Ray starts: about 100 s on 2 cores (`make test-fast` leaves it out)
def test_on_the_simulation_engine_bad_replies_are_dropped_or_stop_the_run_and_a_far_model_is_caught():
    """The same table on Flower's simulation engine (Ray; the ServerApp's error raised by ``simulate``): with
    min_clients=2 every refused poison is dropped, recorded with client, node, round, pass and key, and the
    scaled model is bounded by the median; without it, a bad reply stops the run naming client 1 and its node;
    the scaled model with the mean stops as the in-process run does."""
    pytest.importorskip("ray")
    pytest.importorskip("flwr")
    from pflkit.flower.simulation import simulate

    poisons = list(REFUSED)
    specs = [_spec(poisoned(_model(), p), min_clients=2) for p in poisons]
    specs.append(_spec(poisoned(_model(), "scale", aggregator="median")))
    results = simulate(specs, num_cpus=1, object_store_mb=128)
    for poison, out in zip(poisons, results["runs"]):
        key, why = REFUSED[poison]
        got = out["rejected"]["1"]
        assert (got["pass"], got["round"], got["step"], got["key"]) == (1, 1, "poisoned_models", key), poison
        assert isinstance(got["node"], int) and re.match(why, got["reason"]), (poison, got)
        assert out["lost"] == {"1": 1} and len(out["round_seconds"]) == ROUNDS
    history, _ = run_loopback(specs[-1])
    got = {m: v for r, m, v in zip(results["runs"][-1]["history"]["round"], results["runs"][-1]["history"]["metric"],
                                   results["runs"][-1]["history"]["value"]) if r == ROUNDS}
    assert abs(got["loss"] - _final(history)["loss"]) <= 1e-5  # the bounded run, as on the protocol

    with pytest.raises(RejectedReply, match=refusal("nan", r"node \d+")):
        simulate([_spec(poisoned(_model(), "nan"))], num_cpus=1, object_store_mb=128)
    with pytest.raises(DivergenceError, match=r"Poisoned FedAvg diverged at round 2 \(seed 3, lr=0.3\)"):
        simulate([_spec(poisoned(_model(), "scale"))], num_cpus=1, object_store_mb=128)
