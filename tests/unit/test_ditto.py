"""Ditto (Li et al. 2021): batched vs its reference twin, and the properties that define it -- its global model is
FedAvg's, lambda 0 is training alone, a larger lambda keeps the personal models nearer the global one, and on
clients that disagree its personal models beat the one global model."""
import pytest
import torch

from pflkit.algorithms import Ditto, FedAvg, Local
from pflkit.engine import FunctionalModel
from pflkit.eval import evaluate
from pflkit.io import state_from_payload, state_to_payload
from pflkit.models import logistic, mlp

from reference import ditto as ref

FACTORIES = {"logistic": lambda: logistic((6,), 3), "mlp": lambda: mlp((6,), 3, hidden=(8,))}
HP = dict(lr=0.2, local_steps=3, batch_size=4, personal_lr=0.1, personal_steps=2)


def _ditto(factory, lam=0.5, clients_per_round=None, weighting="uniform", **kw):
    return Ditto(FunctionalModel(factory), lam=lam, clients_per_round=clients_per_round, weighting=weighting,
                 **{**HP, **kw})


def _close(a, b, tol=1e-5):
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=tol, rtol=tol)


@pytest.mark.parametrize("arch", ["logistic", "mlp"])
@pytest.mark.parametrize("per_round, weighting", [(None, "uniform"), (3, "samples")])
def test_ditto_equals_its_reference_twin(mixed, arch, per_round, weighting):
    """Three rounds, the same draws: the global model and every client's personal model (the clients left out of
    a round keep theirs) equal the one-client-at-a-time twin to float32 rounding (1e-5)."""
    factory = FACTORIES[arch]
    algo = _ditto(factory, clients_per_round=per_round, weighting=weighting)
    s = algo.init(mixed, seed=3)
    w0 = s.w
    for _ in range(3):
        s = algo.round(s)
    w, v = ref.ditto(factory, w0, mixed, rounds=3, seed=3, lam=0.5, clients_per_round=per_round,
                     weighting=weighting, **HP)
    _close(s.w, w)
    personal = algo.personalized(s)
    for j in range(mixed.num_clients):
        _close({k: t[j] for k, t in personal.items()}, v[j])
    moved = [max(float((personal[k][j] - w0[k]).abs().max()) for k in w0) for j in range(mixed.num_clients)]
    trained = [m > 1e-3 for m in moved]  # a client's personal model trains in its rounds only, else stays w0
    assert sum(trained) >= (3 if per_round else mixed.num_clients)
    assert all(m == 0.0 for m, t in zip(moved, trained) if not t)


def test_ditto_checkpoints_and_resumes_exactly(mixed):
    """A state written and read back (``pflkit.io``) carries the personal models: two more rounds from it are the
    uninterrupted run's, exactly."""
    algo = _ditto(FACTORIES["logistic"], clients_per_round=3)
    s = algo.round(algo.round(algo.init(mixed, seed=1)))
    back = state_from_payload(algo.init(mixed, seed=1), state_to_payload(s))
    a, b = algo.round(algo.round(s)), algo.round(algo.round(back))
    for k in a.w:
        assert torch.equal(a.w[k], b.w[k]) and torch.equal(a.v[k], b.v[k])


@pytest.mark.parametrize("per_round", [None, 3])
def test_dittos_global_model_is_fedavgs(mixed, per_round):
    """Full-batch steps draw nothing, so Ditto's rounds make FedAvg's draws (the participants) only: its global model
    is FedAvg's, exactly, whatever the personal models do."""
    factory = FACTORIES["mlp"]
    ditto = _ditto(factory, lam=2.0, clients_per_round=per_round, batch_size=None)
    fedavg = FedAvg(FunctionalModel(factory), lr=HP["lr"], local_steps=HP["local_steps"], batch_size=None,
                    clients_per_round=per_round)
    a, b = ditto.init(mixed, 5), fedavg.init(mixed, 5)
    for _ in range(4):
        a, b = ditto.round(a), fedavg.round(b)
    for k in b.w:
        assert torch.equal(a.w[k], b.w[k])
    assert max(float((a.v[k] - a.w[k]).abs().max()) for k in a.w) > 1e-2  # the personal models are their own


def test_lambda_zero_is_training_alone(mixed):
    """lambda = 0, every client every round, full batch: the personal models are Local's (its own steps on its own
    data from the same start), to float32 rounding."""
    factory = FACTORIES["mlp"]
    ditto = _ditto(factory, lam=0.0, batch_size=None, personal_steps=4, personal_lr=0.3)
    alone = Local(FunctionalModel(factory), local_steps=4, lr=0.3, batch_size=None)
    a, b = ditto.init(mixed, 2), alone.init(mixed, 2)
    for _ in range(3):
        a, b = ditto.round(a), alone.round(b)
    _close(a.v, b.params)


def test_a_larger_lambda_keeps_the_personal_models_nearer_the_global_one(mixed):
    """The mean distance |v_k - w| after 5 rounds falls strictly as lambda grows over {0, 1, 5} (eta lambda < 1)."""
    factory = FACTORIES["logistic"]
    gaps = []
    for lam in (0.0, 1.0, 5.0):
        algo = _ditto(factory, lam=lam)
        s = algo.init(mixed, 4)
        for _ in range(5):
            s = algo.round(s)
        gaps.append(float(torch.stack([sum(((s.v[k][j] - s.w[k]) ** 2).sum() for k in s.w).sqrt()
                                       for j in range(mixed.num_clients)]).mean()))
    assert gaps[0] > gaps[1] > gaps[2] > 0, gaps


def test_dittos_personal_models_beat_the_global_model_on_clients_that_disagree(mixed):
    """The fixture's clients disagree (each labels by its own random linear rule): after 15 rounds Ditto's personal
    models score a higher mean personalized accuracy than FedAvg's global model (the same seed, lr and steps)."""
    factory = FACTORIES["logistic"]
    ditto = _ditto(factory, lam=0.1)
    fedavg = FedAvg(FunctionalModel(factory), lr=HP["lr"], local_steps=HP["local_steps"], batch_size=HP["batch_size"])
    a, b = ditto.init(mixed, 0), fedavg.init(mixed, 0)
    for _ in range(15):
        a, b = ditto.round(a), fedavg.round(b)
    got = evaluate(ditto.model, ditto.personalized(a), mixed).summary()["accuracy"]
    base = evaluate(fedavg.model, fedavg.personalized(b), mixed).summary()["accuracy"]
    assert got > base + 0.1, (got, base)


def test_ditto_refuses_bad_settings_naming_them(mixed):
    model = FunctionalModel(FACTORIES["logistic"])
    for bad, match in [({"lam": -1.0}, "lam must be a number >= 0"), ({"personal_lr": 0.0}, "personal_lr"),
                       ({"personal_steps": 0}, "personal_steps")]:
        with pytest.raises(ValueError, match=match):
            Ditto(model, **{**HP, "lam": 0.5, "clients_per_round": None, "weighting": "uniform", **bad})
