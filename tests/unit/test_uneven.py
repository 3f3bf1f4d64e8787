"""Evaluation and full-batch gradients over the real rows only (size buckets), on very uneven clients.

Every result is checked against a per-client reference loop in float64 (plain autograd on the client's
own rows) and against the old computation padded to the largest client. Tolerance: the engine runs in
float32 and sums up to 300 rows per client, so its error is a few float32 ulps of the summed terms
(measured <= 2e-7 here); rtol = atol = 1e-5 leaves room for summation order (BLAS blocking) and is
still far below any real difference (a dropped or double-counted row changes a mean by >= 1/300).
"""
import pytest
import torch
import torch.nn.functional as F

from pflkit.data import FederatedDataset
from pflkit.data import federated
from pflkit.data.federated import bucket_width
from pflkit.data.quadratic_clients import QuadraticModel
from pflkit.engine import FunctionalModel, full_gradients, local_sgd, make_generator
from pflkit.engine.full_batch import over_buckets
from pflkit.engine.params import take
from pflkit.eval import evaluate, majority_baseline
from pflkit.models import cnn, logistic, mlp
from uneven_federation import TEST, TRAIN, uneven

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(params=["default", "no-slack"])
def slack(request, monkeypatch):
    """Buckets as configured (small buckets merged up to BUCKET_SLACK_ROWS), and one bucket per size group."""
    if request.param == "no-slack":
        monkeypatch.setattr(federated, "BUCKET_SLACK_ROWS", 0)
    return request.param


MODELS = {
    "logistic": (lambda: logistic((6,), 3), (6,), {}),  # stacked dense path
    "mlp-vmap": (lambda: mlp((6,), 3, hidden=(8, 5)), (6,), {"stacked": False}),  # vmap path
    "cnn": (lambda: cnn((1, 6, 6), 3, channels=(2, 3), hidden=4), (1, 6, 6), {}),
}


def _params(model, n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(n, *v.shape, generator=g) * 0.5 for k, v in model.init(0).items()}


def _ref_client(model, params, j, x, y):
    """float64 per-client (mean loss, accuracy, gradient of the mean loss) with plain autograd."""
    p = {k: v[j].double().requires_grad_(True) for k, v in params.items()}
    module = model.factory().double().eval()
    logits = torch.func.functional_call(module, p, (x.double(),))
    loss = F.cross_entropy(logits, y)
    grads = torch.autograd.grad(loss, list(p.values()))
    acc = (logits.argmax(-1) == y).double().mean()
    return loss.detach(), acc, dict(zip(p, grads))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_evaluate_and_full_gradients_equal_per_client_loop_and_padded(name, slack):
    factory, shape, kw = MODELS[name]
    data = uneven(shape)
    model = FunctionalModel(factory, **kw)
    n = data.num_clients
    params = _params(model, n)
    metrics = evaluate(model, params, data)
    grads, losses = full_gradients(model, params, data)
    assert data._padded == {}  # the padded [N, max_n] tensors were never built
    assert len(data.size_buckets("train")[0]) == (2 if slack == "default" else 4)
    for j in range(n):
        loss, acc, _ = _ref_client(model, params, j, *data.client(j, "test"))
        torch.testing.assert_close(metrics.loss[j], loss, **TOL)
        torch.testing.assert_close(metrics.accuracy[j], acc, **TOL)
        loss, _, g = _ref_client(model, params, j, *data.client(j, "train"))
        torch.testing.assert_close(losses[j].double(), loss, **TOL)
        for k in g:
            torch.testing.assert_close(grads[k][j].double(), g[k], **TOL)
    assert metrics.n.tolist() == list(TEST)
    # the old computation, padded to the largest client
    x, y, mask = data.padded("test")
    sums, correct = model.batched_stats(params, x, y, mask)
    torch.testing.assert_close(metrics.loss, sums.double() / mask.sum(1), **TOL)
    torch.testing.assert_close(metrics.accuracy, correct.double() / mask.sum(1), **TOL)
    x, y, mask = data.padded("train")
    pg, pl = model.batched_full_grad(params, x, y, mask)
    torch.testing.assert_close(losses, pl, **TOL)
    for k in pg:
        torch.testing.assert_close(grads[k], pg[k], **TOL)


def test_full_batch_local_sgd_moves_models_between_uneven_clients(slack):
    """batch_size=None with a [steps, N] schedule (models change client, several on one client)."""
    factory, shape, _ = MODELS["logistic"]
    data = uneven(shape)
    model = FunctionalModel(factory)
    n, steps, lr = 6, 3, 0.4
    schedule = torch.tensor([[0, 3, 3, 1, 4, 2], [3, 3, 0, 2, 1, 4], [2, 1, 4, 0, 3, 3]])
    params = _params(model, n)
    got, losses = local_sgd(model, params, data, schedule, steps=steps, lr=lr, batch_size=None,
                            generator=make_generator(0))
    assert data._padded == {}
    cur = {k: v.clone() for k, v in params.items()}
    for s in range(steps):
        for i in range(n):
            loss, _, g = _ref_client(model, cur, i, *data.client(int(schedule[s, i]), "train"))
            torch.testing.assert_close(losses[s, i].double(), loss, **TOL)
            for k in g:
                cur[k][i] -= lr * g[k].float()
    for k in cur:
        torch.testing.assert_close(got[k], cur[k], **TOL)


def _quadratic_data(dim=3, seed=0) -> FederatedDataset:
    g = torch.Generator().manual_seed(seed)

    def client(n):
        root = torch.randn(n, dim, dim, generator=g)
        B = root @ root.transpose(-1, -2) + 0.5 * torch.eye(dim)
        c = torch.randn(n, dim, generator=g)
        return torch.cat([B.reshape(n, -1), c], 1), torch.zeros(n, dtype=torch.long)

    return FederatedDataset.from_client_arrays([client(n) for n in TRAIN], [client(n) for n in TEST], 1, "quad")


def test_quadratic_model_full_gradients_and_stats_over_real_rows(slack):
    data = _quadratic_data()
    model = QuadraticModel(3)
    n = data.num_clients
    g = torch.Generator().manual_seed(3)
    params = {"x": torch.randn(n, 3, generator=g)}
    grads, losses = full_gradients(model, params, data)
    metrics = evaluate(model, params, data)
    assert data._padded == {}
    m64 = QuadraticModel(3, dtype=torch.float64)
    for j in range(n):
        x = params["x"][j].double().requires_grad_(True)
        feats, _ = data.client(j, "train")
        loss = m64.loss({"x": x}, feats.double())
        (gx,) = torch.autograd.grad(loss, [x])
        torch.testing.assert_close(losses[j].double(), loss.detach(), **TOL)
        torch.testing.assert_close(grads["x"][j].double(), gx, **TOL)
        feats, _ = data.client(j, "test")
        torch.testing.assert_close(metrics.loss[j], m64.loss({"x": x.detach()}, feats.double()), **TOL)
    assert (metrics.accuracy == 0).all()


def test_majority_baseline_without_padding():
    data = uneven()
    got = majority_baseline(data)
    assert data._padded == {}
    majority = data.label_counts("train").argmax(1)
    for j in range(data.num_clients):
        _, y = data.client(j, "test")
        assert float(got.accuracy[j]) == pytest.approx(float((y == majority[j]).double().mean()))
    assert got.n.tolist() == list(TEST)


def test_size_buckets_bound_the_padding(slack):
    assert [bucket_width(n) for n in (1, 16, 17, 20, 21, 300)] == [16, 16, 20, 20, 25, 364]
    sizes = torch.unique((torch.rand(200, generator=torch.Generator().manual_seed(0)) * 5000).long() + 1)
    for n in sizes.tolist():
        w = bucket_width(n)
        assert n <= w <= max(16, 1.25 * n + 1)
    data = uneven()
    buckets, where = data.size_buckets("train")
    widths = [b.width for b in buckets]
    assert widths == sorted(set(widths))
    # a bucket is as wide as its largest client: 3, 7 | 17 | 40 | 300, or (merged, 89 <= 256 rows) 3..40 | 300
    assert widths == ([40, 300] if slack == "default" else [7, 17, 40, 300])
    for j, n in enumerate(TRAIN):
        b = buckets[int(where[j, 0])]
        r = int(where[j, 1])
        assert int(b.clients[r]) == j and int(b.mask[r].sum()) == n and n <= b.width
        if slack == "no-slack":
            assert b.width <= bucket_width(n)
        x, y = data.client(j, "train")
        assert torch.equal(b.x[r, :n], x) and torch.equal(b.y[r, :n], y)
    extra = federated.BUCKET_SLACK_ROWS
    assert sum(b.mask.numel() for b in buckets) <= sum(max(16, 1.25 * n + 1) for n in TRAIN) + extra
    # a small federation within the slack is one bucket: the old padded layout
    x, y, mask = data.padded("test")
    test_buckets = data.size_buckets("test")[0]
    if slack == "default":
        assert len(test_buckets) == 1 and torch.equal(test_buckets[0].x, x) and torch.equal(test_buckets[0].mask, mask)
    # the cache is shared by with_batch_order and dropped by .to()
    assert data.with_batch_order("shuffled").size_buckets("train")[0] is buckets
    assert data.to("cpu")._buckets == {}


def test_over_buckets_chunks_and_orders_like_one_call(slack):
    factory, shape, _ = MODELS["logistic"]
    data = uneven(shape)
    model = FunctionalModel(factory)
    clients = torch.tensor([4, 3, 0, 3, 1, 2, 0])
    params = _params(model, len(clients))
    whole = over_buckets(model.batched_full_grad, params, data, "train", clients)
    for chunk in (1, 2, 5):
        part = over_buckets(model.batched_full_grad, params, data, "train", clients, chunk=chunk)
        torch.testing.assert_close(part[1], whole[1], **TOL)
        for k in whole[0]:
            torch.testing.assert_close(part[0][k], whole[0][k], **TOL)
    for i, j in enumerate(clients.tolist()):  # one model alone on its client gives the same result
        alone = full_gradients(model, take(params, torch.tensor([i])),
                               FederatedDataset.from_client_arrays([data.client(j)], [data.client(j, "test")],
                                                                   3, "one"))
        torch.testing.assert_close(alone[1][0], whole[1][i], **TOL)
    with pytest.raises(ValueError, match="one client to each"):
        over_buckets(model.batched_full_grad, params, data, "train", clients[:3])
