"""Per-FedAvg (FO, HF): batched vs reference loop, the HVP, the alpha = 0 limit, personalization gain."""
import numpy as np
import pytest
import torch

from pflkit.algorithms.base import eval_generator
from pflkit.algorithms.fedavg import FedAvg
from pflkit.algorithms.perfedavg import PerFedAvg
from pflkit.data import FederatedDataset, perm_synthetic
from pflkit.engine import FunctionalModel
from pflkit.engine.params import broadcast
from pflkit.eval import evaluate
from pflkit.models import logistic, mlp

from reference import fedavg as ref_fedavg
from reference import perfedavg as ref

FACTORIES = {"logistic": lambda: logistic((6,), 3), "mlp": lambda: mlp((6,), 3, hidden=(8,))}


def _close(a, b, tol=1e-5):
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=tol, rtol=tol)


def _clone(gen: torch.Generator) -> torch.Generator:
    g = torch.Generator()
    g.set_state(gen.get_state())
    return g


@pytest.mark.parametrize("arch", ["logistic", "mlp"])
@pytest.mark.parametrize("variant, hvp, per_round, weighting", [
    ("fo", "finite_difference", None, "uniform"),
    ("hf", "finite_difference", 3, "samples"),
    ("hf", "exact", None, "uniform"),
])
def test_perfedavg_equals_reference(mixed, arch, variant, hvp, per_round, weighting):
    factory = FACTORIES[arch]
    algo = PerFedAvg(FunctionalModel(factory), alpha=0.3, beta=0.2, local_steps=3, batch_size=4,
                     variant=variant, hvp=hvp, clients_per_round=per_round, weighting=weighting)
    s = algo.init(mixed, seed=4)
    w0 = s.w
    for _ in range(3):
        s = algo.round(s)
    want = ref.perfedavg(factory, w0, mixed, rounds=3, tau=3, alpha=0.3, beta=0.2, batch_size=4, seed=4,
                         variant=variant, hvp=hvp, clients_per_round=per_round, weighting=weighting)[-1]
    _close(s.w, want)
    assert max(float((s.w[k] - w0[k]).abs().max()) for k in w0) > 1e-2  # training moved the model
    personal = algo.personalized(s)
    want_p = ref.personalize(factory, s.w, mixed, 0.3, 4, eval_generator(s))
    for j in range(mixed.num_clients):
        _close({k: v[j] for k, v in personal.items()}, want_p[j])


@pytest.mark.parametrize("arch, hvp, tol", [("logistic", "exact", 1e-5), ("mlp", "exact", 1e-5),
                                            ("logistic", "finite_difference", 2e-3)])
def test_hessian_vector_product_matches_double_backward(mixed, arch, hvp, tol):
    factory = FACTORIES[arch]
    model = FunctionalModel(factory)
    algo = PerFedAvg(model, alpha=0.1, beta=0.1, local_steps=1, batch_size=5, variant="hf", hvp=hvp)
    gen = torch.Generator().manual_seed(0)
    n = mixed.num_clients
    params = {k: torch.randn(n, *v.shape, generator=gen) for k, v in model.init(0).items()}
    u = {k: torch.randn(v.shape, generator=gen) for k, v in params.items()}
    idx = mixed.sample_indices(torch.arange(n), 5, gen)
    got = algo.hessian_vector_product(params, mixed.x_train[idx], mixed.y_train[idx], u)
    for j in range(n):
        p_j, u_j = {k: v[j] for k, v in params.items()}, {k: v[j] for k, v in u.items()}
        want = ref.hvp_double_backward(factory, p_j, mixed.x_train[idx[j]], mixed.y_train[idx[j]], u_j)
        scale = max(float(v.abs().max()) for v in want.values())
        assert scale > 1e-3  # a non-trivial product
        for k in want:
            torch.testing.assert_close(got[k][j], want[k], atol=tol * scale, rtol=0)


def _one_sample_clients(n=4, dim=5, seed=0):
    """Every client holds ONE training sample, so every minibatch is the same whatever the draws."""
    rng = np.random.default_rng(seed)
    train = [(rng.standard_normal((1, dim)).astype(np.float32), np.array([j % 3])) for j in range(n)]
    test = [(rng.standard_normal((3, dim)).astype(np.float32), np.array([0, 1, 2])) for _ in range(n)]
    return FederatedDataset.from_client_arrays(train, test, 3, "one-sample")


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_alpha_zero_is_fedavg_with_lr_beta(variant):
    """With alpha = 0, temp = w and the Hessian term vanishes: Per-FedAvg is FedAvg with lr beta. On
    one-sample clients all minibatches coincide, so the two must agree although they draw differently."""
    data = _one_sample_clients()
    model = FunctionalModel(lambda: mlp((5,), 3, hidden=(4,)))
    per = PerFedAvg(model, alpha=0.0, beta=0.5, local_steps=4, batch_size=3, variant=variant)
    fed = FedAvg(model, local_steps=4, lr=0.5, batch_size=3)
    sp, sf = per.init(data, 1), fed.init(data, 1)
    for _ in range(3):
        sp, sf = per.round(sp), fed.round(sf)
    _close(sp.w, sf.w, tol=1e-6)
    assert max(float((sf.w[k] - per.init(data, 1).w[k]).abs().max()) for k in sf.w) > 1e-2
    _close(per.personalized(sp), broadcast(sp.w, data.num_clients), tol=0)  # a zero adaptation step


def test_fo_alpha_zero_takes_sgd_steps_on_the_second_batch(mixed):
    """On real minibatches: FO with alpha = 0 is plain SGD (lr beta) on the D' batches of its draw."""
    factory = FACTORIES["logistic"]
    algo = PerFedAvg(FunctionalModel(factory), alpha=0.0, beta=0.3, local_steps=5, batch_size=4)
    s = algo.init(mixed, seed=2)
    gen = _clone(s.generator)
    n = mixed.num_clients
    idx = mixed.sample_indices(torch.arange(n).view(1, 1, n).expand(5, 2, n), 4, gen)
    local = [ref_fedavg.sgd_steps(factory, s.w, mixed, [j] * 5, [0.3] * 5, idx[:, 1, j]) for j in range(n)]
    s = algo.round(s)
    _close(s.w, {k: sum(m[k] for m in local) / n for k in s.w})


def test_personalization_beats_the_global_model():
    """Two groups label the same inputs oppositely (mu = 0): no single model beats chance, one
    adaptation step from the meta-learned model does."""
    model = FunctionalModel(lambda: logistic((20,), 2))
    for variant in ("fo", "hf"):
        algo = PerFedAvg(model, alpha=1.0, beta=0.1, local_steps=10, batch_size=20, variant=variant)
        gains = []
        for seed in (0, 1):
            data = perm_synthetic(10, 150, 20, seed=seed, mu=0.0)
            s = algo.init(data, seed)
            for _ in range(10):
                s = algo.round(s)
            glob = evaluate(model, broadcast(s.w, data.num_clients), data).summary()["accuracy"]
            pers = evaluate(model, algo.personalized(s), data).summary()["accuracy"]
            assert glob < 0.6, (variant, seed, glob)
            gains.append(pers - glob)
        assert min(gains) > 0.08, (variant, gains)


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_same_seed_same_states_and_evaluation_leaves_training_alone(mixed, variant):
    model = FunctionalModel(FACTORIES["mlp"])
    algo = PerFedAvg(model, alpha=0.2, beta=0.1, local_steps=2, batch_size=3, variant=variant,
                     clients_per_round=3)
    a, b = algo.init(mixed, 7), algo.init(mixed, 7)
    a = algo.round(a)
    pa = algo.personalized(a)
    _close(pa, algo.personalized(a), tol=0)
    a, b = algo.round(a), algo.round(algo.round(b))  # b never evaluated
    _close(a.w, b.w, tol=0)
    _close(algo.personalized(a), algo.personalized(b), tol=0)
    c = algo.round(algo.round(algo.init(mixed, 8)))
    assert not torch.equal(c.w["3.weight"], a.w["3.weight"])


@pytest.mark.parametrize("kwargs, match", [
    (dict(alpha=-0.1), "alpha must be a number >= 0, got -0.1"),
    (dict(beta=0.0), "beta must be a number > 0, got 0.0"),
    (dict(local_steps=0), "local_steps must be an integer > 0, got 0"),
    (dict(batch_size=None), "batch_size must be an integer > 0"),
    (dict(batch_size=2.5), "batch_size must be an integer > 0, got 2.5"),
    (dict(variant="so"), r"variant must be one of \('fo', 'hf'\), got 'so'"),
    (dict(hvp="adjoint"), "hvp must be one of"),
    (dict(delta=0), "delta must be a number > 0, got 0"),
    (dict(clients_per_round=0), r"clients_per_round must be an integer > 0, got 0"),
    (dict(weighting="median"), "weighting must be"),
])
def test_bad_hyperparameters_are_rejected(kwargs, match):
    base = dict(alpha=0.1, beta=0.1, local_steps=2, batch_size=4)
    with pytest.raises(ValueError, match=match):
        PerFedAvg(FunctionalModel(FACTORIES["logistic"]), **{**base, **kwargs})
