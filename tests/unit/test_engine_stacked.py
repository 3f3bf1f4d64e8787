"""The stacked (bmm / grouped-conv) execution path against vmap(grad) and a per-model autograd loop."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pflkit.engine import FunctionalModel, broadcast, local_sgd, make_generator
from pflkit.engine.stacked import compile_sequential
from pflkit.models import cnn, logistic, mlp

from reference import fedavg as ref

CASES = {
    "logistic": (lambda: logistic((6,), 3), (6,)),
    "mlp": (lambda: mlp((2, 3), 4, hidden=(7, 5)), (2, 3)),
    "cnn": (lambda: cnn((1, 8, 8), 3, channels=(2, 3), hidden=5), (1, 8, 8)),
}


def _problem(name, n=4, b=5):
    factory, shape = CASES[name]
    g = torch.Generator().manual_seed(0)
    fast = FunctionalModel(factory, stacked="all")
    params = {k: v + 0.3 * torch.randn(n, *v.shape, generator=g) for k, v in fast.init(0).items()}
    x = torch.randn(n, b, *shape, generator=g)
    classes = fast.module[-1].out_features
    y = torch.randint(0, classes, (n, b), generator=g)
    mask = torch.rand(n, b, generator=g) < 0.6
    mask[:, 0] = True
    return factory, fast, params, x, y, mask


@pytest.mark.parametrize("name", sorted(CASES))
def test_stacked_gradients_equal_per_model_autograd(name):
    factory, fast, params, x, y, mask = _problem(name)
    assert fast.stacked is not None
    grads, losses = fast.batched_grad(params, x, y)
    full, full_losses = fast.batched_full_grad(params, x, y, mask)
    sums, correct = fast.batched_stats(params, x, y, mask)
    for i in range(x.shape[0]):
        module = ref._module_with(factory, {k: v[i] for k, v in params.items()})
        logits = module(x[i])
        loss = F.cross_entropy(logits, y[i])
        want = torch.autograd.grad(loss, list(module.parameters()), retain_graph=True)
        per = F.cross_entropy(logits, y[i], reduction="none")
        m = mask[i].float()
        masked = (per * m).sum() / m.sum()
        want_full = torch.autograd.grad(masked, list(module.parameters()))
        for (k, _), w, wf in zip(module.named_parameters(), want, want_full):
            torch.testing.assert_close(grads[k][i], w, atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(full[k][i], wf, atol=1e-6, rtol=1e-5)
        assert abs(float(losses[i]) - loss.item()) < 1e-5
        assert abs(float(full_losses[i]) - masked.item()) < 1e-5
        assert abs(float(sums[i]) - (per * m).sum().item()) < 1e-4
        assert int(correct[i]) == int(((logits.argmax(-1) == y[i]).float() * m).sum())


@pytest.mark.parametrize("name", sorted(CASES))
def test_stacked_and_vmap_gradients_agree(name):
    factory, fast, params, x, y, _ = _problem(name)
    slow = FunctionalModel(factory, stacked=False)
    assert slow.stacked is None
    a, la = fast.batched_grad(params, x, y)
    b, lb = slow.batched_grad(params, x, y)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(la, lb)


def test_conv_networks_default_to_vmap_and_dense_ones_to_stacked():
    assert FunctionalModel(CASES["cnn"][0]).stacked is None
    assert FunctionalModel(CASES["mlp"][0]).stacked is not None
    with pytest.raises(ValueError, match="stacked must be"):
        FunctionalModel(CASES["mlp"][0], stacked="conv")


def test_unsupported_modules_fall_back_to_vmap():
    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, x):
            return self.lin(x)

    assert compile_sequential(Custom()) is None
    assert compile_sequential(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))) is None
    assert compile_sequential(nn.Sequential(nn.Linear(3, 4, bias=False))) is None
    assert compile_sequential(nn.Sequential(nn.Linear(3, 4), nn.ReLU())) is None  # logits not from Linear
    model = FunctionalModel(lambda: nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)))
    assert model.stacked is None
    g, loss = model.batched_grad(broadcast(model.init(0), 2), torch.randn(2, 5, 3), torch.zeros(2, 5, dtype=torch.long))
    assert g["0.weight"].shape == (2, 4, 3) and loss.shape == (2,)


def test_inside_torch_func_transforms_the_vmap_path_is_used():
    """Per-FedAvg differentiates through model.loss with torch.func; grads of grads stay exact."""
    factory, fast, params, x, y, _ = _problem("mlp")
    p0 = {k: v[0] for k, v in params.items()}
    hvp = torch.func.jvp(lambda p: torch.func.grad(fast.loss)(p, x[0], y[0]), (p0,), (p0,))[1]
    slow = FunctionalModel(factory, stacked=False)
    want = torch.func.jvp(lambda p: torch.func.grad(slow.loss)(p, x[0], y[0]), (p0,), (p0,))[1]
    for k in hvp:
        torch.testing.assert_close(hvp[k], want[k])
    # with parameters that require grad, autograd must see the computation too
    leaves = {k: v.clone().requires_grad_() for k, v in params.items()}
    grads, _ = fast.batched_grad(leaves, x, y)
    total = sum(g.square().sum() for g in grads.values())
    assert total.requires_grad


def test_local_sgd_cnn_equals_reference():
    """A CNN on image-shaped federated data through local_sgd, against the per-client loop."""
    from pflkit.data import FederatedDataset
    g = torch.Generator().manual_seed(0)
    clients = [(torch.randn(6 + j, 1, 8, 8, generator=g), torch.randint(0, 3, (6 + j,), generator=g))
               for j in range(3)]
    data = FederatedDataset.from_client_arrays(clients, clients, 3, "tiny-images")
    factory = CASES["cnn"][0]
    model = FunctionalModel(factory, stacked="all")
    start = broadcast(model.init(0), 3)
    schedule = torch.tensor([[0, 1, 2], [2, 0, 1], [1, 2, 0]])
    lrs = torch.full((3, 3), 0.2)
    got, _ = local_sgd(model, start, data, schedule, steps=3, lr=lrs, batch_size=4, generator=make_generator(5))
    want = ref.local_sgd(factory, start, data, schedule, lrs, 4, make_generator(5))
    for k in got:
        torch.testing.assert_close(got[k], want[k], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got["0.weight"], start["0.weight"])


# ----------------------------------------------------------------------------- K steps at once (sgd_steps)
DENSE_CASES = {
    "logistic": lambda: logistic((6,), 3),
    "mlp": lambda: mlp((2, 3), 4, hidden=(7, 5)),
    "relu-input": lambda: nn.Sequential(nn.Flatten(), nn.ReLU(), nn.Linear(6, 5), nn.Linear(5, 3)),
}


def _federation(shape, classes, sizes=(7, 23, 3, 41, 12), seed=0):
    from pflkit.data import FederatedDataset
    g = torch.Generator().manual_seed(seed)
    clients = [(torch.randn(m, *shape, generator=g), torch.randint(0, classes, (m,), generator=g)) for m in sizes]
    return FederatedDataset.from_client_arrays(clients, clients, classes, "tiny")


@pytest.mark.parametrize("rows_copy", [True, False])
@pytest.mark.parametrize("lr_shape", ["scalar", "per-model", "per-step-and-model"])
@pytest.mark.parametrize("name", sorted(DENSE_CASES))
def test_k_steps_at_once_equal_one_step_at_a_time(name, lr_shape, rows_copy, monkeypatch):
    """The K-step path (fast_steps=True, the default) against sgd_step_ per step on the same draws,
    gathering from the aligned copy of the inputs and (copy over its byte limit) from x_train itself."""
    from pflkit.engine import stacked as stacked_module
    if not rows_copy:
        monkeypatch.setattr(stacked_module, "ROWS_COPY_BYTES", 0)
    factory = DENSE_CASES[name]
    fast, slow = FunctionalModel(factory), FunctionalModel(factory, fast_steps=False)
    classes = fast.module[-1].out_features
    shape = (2, 3) if name == "mlp" else (6,)
    data = _federation(shape, classes)
    n, steps = 6, 7
    g = torch.Generator().manual_seed(1)
    start = {k: v + 0.3 * torch.randn(n, *v.shape, generator=g) for k, v in fast.init(0).items()}
    schedule = torch.randint(0, data.num_clients, (steps, n), generator=g)
    lr = {"scalar": 0.3, "per-model": torch.rand(n, generator=g) + 0.1,
          "per-step-and-model": torch.rand(steps, n, generator=g) + 0.1}[lr_shape]
    got, got_losses = local_sgd(fast, start, data, schedule, steps=steps, lr=lr, batch_size=4,
                                generator=make_generator(5))
    want, want_losses = local_sgd(slow, start, data, schedule, steps=steps, lr=lr, batch_size=4,
                                  generator=make_generator(5))
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=1e-6, rtol=1e-6)
        assert got[k].is_contiguous() and not torch.equal(got[k], start[k])
    torch.testing.assert_close(got_losses, want_losses, atol=1e-6, rtol=1e-6)
    assert list(got) == list(start)


def test_k_steps_in_chunks_equal_one_chunk(monkeypatch):
    """Runs longer than STEP_BUFFER_BYTES allow go in chunks of steps, with the same result."""
    from pflkit.engine import stacked as stacked_module
    factory = DENSE_CASES["mlp"]
    model = FunctionalModel(factory)
    data = _federation((2, 3), 4)
    start = broadcast(model.init(0), 5)
    kwargs = dict(steps=9, lr=0.2, batch_size=3)
    one, l1 = local_sgd(model, start, data, torch.arange(5), generator=make_generator(2), **kwargs)
    monkeypatch.setattr(stacked_module, "STEP_BUFFER_BYTES", 2 * 5 * 4 * 3 * 4 * 2)  # two steps per chunk
    chunked, l2 = local_sgd(model, start, data, torch.arange(5), generator=make_generator(2), **kwargs)
    for k in one:
        torch.testing.assert_close(chunked[k], one[k], atol=0, rtol=0)
    torch.testing.assert_close(l1, l2, atol=0, rtol=0)


def test_k_steps_equal_the_per_client_autograd_reference():
    factory = DENSE_CASES["mlp"]
    model = FunctionalModel(factory)
    data = _federation((2, 3), 4)
    start = broadcast(model.init(3), 5)
    schedule = torch.tensor([[0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [1, 1, 1, 1, 1]])
    lrs = torch.full((3, 5), 0.4)
    got, _ = local_sgd(model, start, data, schedule, steps=3, lr=lrs, batch_size=4, generator=make_generator(9))
    want = ref.local_sgd(factory, start, data, schedule, lrs, 4, make_generator(9))
    for k in got:
        torch.testing.assert_close(got[k], want[k], atol=1e-5, rtol=1e-5)


def test_k_step_path_only_where_it_applies():
    data = _federation((6,), 3)
    idx = torch.zeros(2, 3, 4, dtype=torch.long)
    lr = torch.full((2, 3), 0.1)
    params = broadcast(FunctionalModel(DENSE_CASES["logistic"]).init(0), 3)
    assert FunctionalModel(DENSE_CASES["logistic"], fast_steps=False).sgd_steps(params, data, idx, lr) is None
    assert FunctionalModel(DENSE_CASES["logistic"], stacked=False).sgd_steps(params, data, idx, lr) is None
    assert FunctionalModel(DENSE_CASES["logistic"]).sgd_steps(params, data, idx, lr) is not None
    # a CNN runs its K steps in engine.stacked_conv (tests/unit/test_engine_stacked_conv.py), except
    # with a model that has other layers in it
    images = _federation((1, 8, 8), 3)
    cnn_model = FunctionalModel(CASES["cnn"][0], stacked="all")
    assert cnn_model.sgd_steps(broadcast(cnn_model.init(0), 3), images, idx, lr) is not None
    pooled_first = FunctionalModel(lambda: nn.Sequential(nn.AvgPool2d(2), nn.Flatten(), nn.Linear(16, 3)))
    assert pooled_first.sgd_steps(broadcast(pooled_first.init(0), 3), images, idx, lr) is None
    with pytest.raises(ValueError, match="fast_steps must be True or False"):
        FunctionalModel(DENSE_CASES["logistic"], fast_steps="yes")


def test_train_rows_with_ones_layout_and_cache():
    data = _federation((2, 3), 4)
    rows = data.train_rows_with_ones()
    assert rows.shape == (data.x_train.shape[0], 16) and rows.stride(0) == 16
    torch.testing.assert_close(rows[:, :6], data.x_train.reshape(-1, 6), atol=0, rtol=0)
    assert bool((rows[:, 6] == 1).all()) and bool((rows[:, 7:] == 0).all())
    assert data.train_rows_with_ones() is rows  # cached
    data.x_train.mul_(2.0)  # changed in place: rebuilt
    torch.testing.assert_close(data.train_rows_with_ones()[:, :6], data.x_train.reshape(-1, 6), atol=0, rtol=0)
    from dataclasses import replace
    other = replace(data, x_train=data.x_train + 1.0)  # shares the cache dict, not its x_train
    torch.testing.assert_close(other.train_rows_with_ones()[:, :6], other.x_train.reshape(-1, 6), atol=0, rtol=0)
