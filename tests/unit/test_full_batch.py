"""Full-batch passes with bounded memory (engine.full_batch): row-bounded calls equal one call, and every
client's exact gradient at one model (full_gradients_at) equals a per-client float64 autograd loop.

Tolerance as in test_uneven.py: float32 sums of up to 300 rows, in another order than the reference."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pflkit.data.quadratic_clients import QuadraticModel
from pflkit.engine import FunctionalModel, broadcast, full_gradients, full_gradients_at, local_sgd, make_generator
from pflkit.engine import full_batch, stacked
from pflkit.engine.full_batch import over_buckets, rows_per_call
from pflkit.eval import evaluate
from pflkit.models import cnn, logistic, mlp
from uneven_federation import uneven

TOL = dict(rtol=1e-5, atol=1e-5)

MODELS = {
    "logistic": (lambda: logistic((6,), 3), (6,), {}),  # stacked dense path
    "mlp": (lambda: mlp((6,), 3, hidden=(8, 5)), (6,), {}),
    "relu-input": (lambda: nn.Sequential(nn.Flatten(), nn.ReLU(), nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)), (6,),
                   {}),
    "mlp-vmap": (lambda: mlp((6,), 3, hidden=(8, 5)), (6,), {"stacked": False}),  # vmap path
    "cnn": (lambda: cnn((1, 6, 6), 3, channels=(2, 3), hidden=4), (1, 6, 6), {}),  # vmap path
    "cnn-stacked": (lambda: cnn((1, 6, 6), 3, channels=(2, 3), hidden=4), (1, 6, 6), {"stacked": "all"}),  # autograd
}
DENSE = ("logistic", "mlp", "relu-input")


def _params(model, n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(n, *v.shape, generator=g) * 0.5 for k, v in model.init(0).items()}


def _close(a, b, tol=TOL):
    if isinstance(a, dict):
        for k in b:
            torch.testing.assert_close(a[k], b[k], **tol)
    else:
        torch.testing.assert_close(a, b, **tol)


def test_rows_per_call_from_the_models_activations():
    data = uneven()
    model = FunctionalModel(MODELS["logistic"][0])
    # input 6 floats + logits 3 floats (Flatten's output is a view of the input: not counted again)
    assert model.activation_bytes((6,)) == (6 + 3) * 4
    assert model.activation_bytes((6,)) == 36  # cached
    assert rows_per_call(model, data, budget=36 * full_batch.ROW_BYTES_FACTOR * 10) == 10
    assert rows_per_call(model, data, budget=1) == 1
    assert rows_per_call(model, data) == full_batch.FULL_BATCH_BYTES // (36 * full_batch.ROW_BYTES_FACTOR)
    m = FunctionalModel(MODELS["mlp"][0])
    assert m.activation_bytes((6,)) == (6 + 8 + 8 + 5 + 5 + 3) * 4  # ReLUs write new tensors
    assert rows_per_call(QuadraticModel(3), uneven((12,)), budget=12 * 4 * full_batch.ROW_BYTES_FACTOR * 3) == 3
    for bad in (0, -5, 1.5, True, "1GB"):
        with pytest.raises(ValueError, match="budget must be a positive number of bytes"):
            rows_per_call(model, data, budget=bad)


@pytest.mark.parametrize("rows", [1, 5, 17, 64, 299, 301])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_bounded_rows_equal_one_call(name, rows):
    """Column slices (a client's rows in several calls, each told the client's whole count) and fewer
    models per call give the results of one unbounded call per bucket."""
    factory, shape, kw = MODELS[name]
    data = uneven(shape)
    model = FunctionalModel(factory, **kw)
    clients = torch.tensor([4, 3, 0, 3, 1, 2, 0])
    params = _params(model, len(clients))
    for fn, split in ((model.batched_full_grad, "train"), (model.batched_stats, "test")):
        whole = over_buckets(fn, params, data, split, clients)
        part = over_buckets(fn, params, data, split, clients, rows=rows)
        for a, b in zip(part, whole):
            _close(a, b)


def test_budget_bounds_full_gradients_evaluation_and_full_batch_steps(monkeypatch):
    factory, shape, _ = MODELS["mlp"]
    data = uneven(shape)
    model = FunctionalModel(factory)
    n = data.num_clients
    params = _params(model, n)
    small = 7 * full_batch.ROW_BYTES_FACTOR * model.activation_bytes(shape)  # 7 rows per call
    calls = []
    real = model.stacked.grad

    def counting(p, x, *args):
        calls.append(x.shape[0] * x.shape[1])
        return real(p, x, *args)

    monkeypatch.setattr(model.stacked, "grad", counting)
    g, loss = full_gradients(model, params, data, budget=small)
    assert calls and max(calls) <= 7
    monkeypatch.undo()
    want_g, want_loss = full_gradients(model, params, data)
    _close(g, want_g)
    _close(loss, want_loss)
    a, b = evaluate(model, params, data, budget=small), evaluate(model, params, data)
    _close(a.loss, b.loss)
    _close(a.accuracy, b.accuracy)
    monkeypatch.setattr(full_batch, "FULL_BATCH_BYTES", small)  # local_sgd's full-batch steps use the default
    got, _ = local_sgd(model, params, data, torch.arange(n), steps=2, lr=0.3, batch_size=None,
                       generator=make_generator(0))
    monkeypatch.undo()
    want, _ = local_sgd(model, params, data, torch.arange(n), steps=2, lr=0.3, batch_size=None,
                        generator=make_generator(0))
    _close(got, want)


def _ref_grad(factory, w, x, y):
    """float64 gradient of one client's mean loss at w, plain autograd."""
    p = {k: v.double().requires_grad_(True) for k, v in w.items()}
    module = factory().double().eval()
    loss = F.cross_entropy(torch.func.functional_call(module, p, (x.double(),)), y)
    return dict(zip(p, torch.autograd.grad(loss, list(p.values()))))


@pytest.mark.parametrize("rows_copy", [True, False])
@pytest.mark.parametrize("budget_rows", [None, 1, 30, 301])
@pytest.mark.parametrize("name", DENSE)
def test_full_gradients_at_equal_the_per_client_reference(name, budget_rows, rows_copy, monkeypatch):
    """One pass over the flat store (chunks crossing client boundaries, with and without the aligned copy
    of the inputs) against each client's own float64 autograd gradient."""
    if not rows_copy:
        monkeypatch.setattr(stacked, "ROWS_COPY_BYTES", 0)
    factory, shape, kw = MODELS[name]
    data = uneven(shape)
    model = FunctionalModel(factory, **kw)
    w = {k: v[0] for k, v in _params(model, 1, seed=4).items()}
    budget = None if budget_rows is None else budget_rows * full_batch.ROW_BYTES_FACTOR * model.activation_bytes(shape)
    got = full_gradients_at(model, w, data, budget=budget)
    assert list(got) == list(w)
    for j in range(data.num_clients):
        want = _ref_grad(factory, w, *data.client(j, "train"))
        for k in want:
            torch.testing.assert_close(got[k][j].double(), want[k], **TOL)
    test_split = full_gradients_at(model, w, data, "test", budget=budget)
    for k, g in full_gradients(model, broadcast(w, data.num_clients), data, "test")[0].items():
        torch.testing.assert_close(test_split[k], g, **TOL)
    assert data._padded == {}


@pytest.mark.parametrize("name", ["mlp-vmap", "cnn"])
def test_full_gradients_at_other_models_broadcast_w(name):
    factory, shape, kw = MODELS[name]
    data = uneven(shape)
    model = FunctionalModel(factory, **kw)
    w = {k: v[0] for k, v in _params(model, 1, seed=4).items()}
    got = full_gradients_at(model, w, data)
    want, _ = full_gradients(model, broadcast(w, data.num_clients), data)
    for k in want:
        assert torch.equal(got[k], want[k])
