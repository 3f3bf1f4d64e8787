"""The round's robust aggregators (``algorithms.round.aggregate(aggregator=...)``): the coordinate-wise median
and trimmed mean as Flower's FedMedian and FedTrimmedAvg define them, their reference twins, FedAvg with them,
and one poisoned client that moves the mean far but these no further than the honest clients' range."""
import numpy as np
import pytest
import torch

from reference import fedavg as ref_fedavg
from reference import robust as ref

from pflkit.algorithms import FedAvg
from pflkit.algorithms.round import AGGREGATORS, aggregate
from pflkit.engine import FunctionalModel
from pflkit.engine.params import mean
from pflkit.models import logistic


def _outputs(m: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"weight": torch.randn(m, 3, 4, generator=g), "bias": torch.randn(m, 3, generator=g)}


# (aggregator, trim_fraction, participants): odd and even counts, cuts of 0, 1 and 2 a tail
CASES = [("median", 0.2, 5), ("median", 0.2, 6), ("median", 0.2, 1), ("trimmed_mean", 0.2, 5),
         ("trimmed_mean", 0.25, 8), ("trimmed_mean", 0.1, 9), ("trimmed_mean", 0.0, 4), ("trimmed_mean", 0.49, 7)]


@pytest.mark.parametrize("aggregator, fraction, m", CASES)
def test_the_robust_aggregators_equal_their_one_coordinate_at_a_time_twins(aggregator, fraction, m):
    local = _outputs(m, seed=m)
    got = aggregate(local, aggregator=aggregator, trim_fraction=fraction)
    want = ref.combine(aggregator, fraction)([{k: v[j] for k, v in local.items()} for j in range(m)])
    for k in local:
        assert got[k].shape == local[k].shape[1:] and got[k].dtype == local[k].dtype
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-6)


@pytest.mark.parametrize("aggregator, fraction, m", CASES)
def test_the_robust_aggregators_are_flowers_fedmedian_and_fedtrimmedavg(aggregator, fraction, m):
    """Flower's own definitions: FedMedian takes ``numpy.median`` over the replies, FedTrimmedAvg its
    ``trim_mean`` (flwr.serverapp.strategy.fedtrimmedavg)."""
    pytest.importorskip("flwr")
    from flwr.serverapp.strategy.fedtrimmedavg import trim_mean

    local = _outputs(m, seed=m)
    got = aggregate(local, aggregator=aggregator, trim_fraction=fraction)
    for k, v in local.items():
        stacked = v.numpy()
        want = np.median(stacked, axis=0) if aggregator == "median" else trim_mean(stacked, fraction)
        np.testing.assert_allclose(got[k].numpy(), want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("aggregator, fraction", [("median", 0.2), ("trimmed_mean", 0.2), ("trimmed_mean", 0.4)])
def test_fedavg_with_a_robust_aggregator_equals_its_reference_twin(mixed, aggregator, fraction):
    """Three rounds of full-participation FedAvg on the 5 uneven clients: the server's model after each is the
    per-client reference loop's with the coordinate-wise rule (and not the mean's)."""
    factory = lambda: logistic((6,), 3)  # noqa: E731
    alg = FedAvg(FunctionalModel(factory), local_steps=3, lr=0.2, batch_size=4, aggregator=aggregator,
                 trim_fraction=fraction)
    state = alg.init(mixed, seed=5)
    w0 = state.w
    for _ in range(3):
        state = alg.round(state)
    want = ref_fedavg.fedavg(factory, w0, mixed, rounds=3, local_steps=3, lr=0.2, batch_size=4, seed=5,
                             combine=ref.combine(aggregator, fraction))[-1]
    plain = ref_fedavg.fedavg(factory, w0, mixed, rounds=3, local_steps=3, lr=0.2, batch_size=4, seed=5)[-1]
    for k in want:
        torch.testing.assert_close(state.w[k], want[k], rtol=1e-5, atol=1e-6)
        assert (state.w[k] - plain[k]).abs().max() > 1e-4  # the rule changed the result


# (how the one bad client's output is made from its honest one)
POISONS = {"scaled 1e6": lambda v: v * 1e6, "shifted +1e4": lambda v: v + 1e4, "flipped -1e5": lambda v: -1e5 * v,
           "huge constant": lambda v: torch.full_like(v, 3e7)}


@pytest.mark.parametrize("poison", list(POISONS))
@pytest.mark.parametrize("aggregator", ["median", "trimmed_mean"])
def test_one_poisoned_client_moves_the_mean_far_and_a_robust_aggregate_within_the_honest_range(poison, aggregator):
    """Client 2 of 5 sends a poisoned output: the mean moves by more than 1e3, the median and the trimmed mean
    (one cut a tail) stay inside every coordinate's range over the four honest clients, and move less than
    that range's width from their value without the poisoned client's output."""
    honest = _outputs(5, seed=11)
    poisoned = {k: v.clone() for k, v in honest.items()}
    for k in poisoned:
        poisoned[k][2] = POISONS[poison](honest[k][2])
    clean = aggregate(honest, aggregator=aggregator)
    robust = aggregate(poisoned, aggregator=aggregator)
    for k, v in honest.items():
        others = torch.cat([v[:2], v[3:]])
        low, high = others.min(0).values, others.max(0).values
        assert (mean(poisoned)[k] - mean(honest)[k]).abs().max() > 1e3
        assert bool(((robust[k] >= low) & (robust[k] <= high)).all())
        assert float((robust[k] - clean[k]).abs().max()) <= float((high - low).max())


def test_the_mean_is_still_the_default_and_unchanged():
    local = _outputs(5)
    weights = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    for w in (None, weights):
        got, want = aggregate(local, w), mean(local, w)
        assert all(torch.equal(got[k], want[k]) for k in local)
    assert FedAvg(FunctionalModel(lambda: logistic((6,), 3)), local_steps=1, lr=0.1, batch_size=2).aggregator == "mean"
    assert AGGREGATORS == ("mean", "median", "trimmed_mean")


@pytest.mark.parametrize("kwargs, match", [
    (dict(aggregator="krum"), r"aggregator must be one of \('mean', 'median', 'trimmed_mean'\), got 'krum'"),
    (dict(aggregator="trimmed_mean", trim_fraction=0.5), r"trim_fraction must be a number in \[0, 0.5\).*got 0.5"),
    (dict(aggregator="trimmed_mean", trim_fraction=-0.1), r"trim_fraction must be a number in \[0, 0.5\)"),
    (dict(aggregator="median", trim_fraction=True), r"trim_fraction must be a number"),
    (dict(aggregator="median", weighting="samples"), r"aggregator 'median' is unweighted .*weighting must be "
                                                     r"'uniform' with it, got 'samples'"),
])
def test_bad_aggregator_settings_are_refused_naming_the_parameter(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedAvg(FunctionalModel(lambda: logistic((6,), 3)), local_steps=1, lr=0.1, batch_size=2, **kwargs)


def test_a_robust_aggregate_takes_no_weights_or_masks():
    local = _outputs(4)
    with pytest.raises(ValueError, match="aggregator 'median' takes no weights and no masks"):
        aggregate(local, torch.ones(4), aggregator="median")
    with pytest.raises(ValueError, match="aggregator 'trimmed_mean' takes no weights and no masks"):
        aggregate(local, masks={k: torch.ones_like(v) for k, v in local.items()}, aggregator="trimmed_mean")
