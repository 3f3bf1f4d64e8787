"""The stacked (bmm / grouped-conv) execution path against vmap(grad) and a per-model autograd loop."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pflkit.engine import FunctionalModel, broadcast, local_sgd, make_generator
from pflkit.engine.stacked import compile_sequential
from pflkit.models import cnn, logistic, mlp
from pflkit.reference import fedavg as ref

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
