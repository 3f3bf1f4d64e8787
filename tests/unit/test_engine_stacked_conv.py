"""The K-step client update of N stacked CNNs (engine.stacked_conv) against the per-client autograd loop.

Everything runs in float64 (data, parameters, reference modules), so the stacked path, the vmap path
(``fast_steps=False``, one step at a time) and the per-model autograd loop (``reference.fedavg``) agree
to rounding. Measured (the largest absolute difference to the autograd loop over the three networks, 5
steps, per-model step sizes): K-step path 1.8e-15 (parameters) and 3.6e-15 (losses) in both layouts, vmap
path 8.0e-15 and 8.9e-15; the tolerance is 1e-10 (absolute and relative), far above rounding and far
below any real difference (a step is ~1e-2).
"""
from dataclasses import replace

import pytest
import torch
from torch import nn

from pflkit.data import FederatedDataset
from pflkit.engine import FunctionalModel, broadcast, local_sgd, make_generator
from pflkit.engine import stacked_conv
from pflkit.engine.local_sgd import expand_lr
from pflkit.models import cnn
from pflkit.models.femnist import femnist_cnn

from reference import fedavg as ref

TOL = dict(atol=1e-10, rtol=1e-10)
LAYOUTS = ("loop", "grouped")


@pytest.fixture(autouse=True)
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _odd_net():
    """Odd shapes: 2 input channels on 11 x 10, a rectangular kernel with stride and asymmetric padding, pool
    before ReLU with padding and overlapping windows, dilation, ReLU after the Flatten, three Linears."""
    head = [nn.Conv2d(2, 3, (3, 2), stride=(2, 1), padding=(1, 0)), nn.MaxPool2d(2, stride=1), nn.ReLU(),
            nn.Conv2d(3, 4, 3, dilation=(1, 2), padding=(1, 2)), nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1),
            nn.Flatten()]
    features = nn.Sequential(*head)(torch.zeros(1, 2, 11, 10)).shape[1]  # 4 x 3 x 4
    return nn.Sequential(*head, nn.ReLU(), nn.Linear(features, 6), nn.ReLU(), nn.Linear(6, 5), nn.Linear(5, 4))


def _femnist_shape():
    """femnist_cnn's layer order (conv, ReLU, conv, ReLU, pool) without its dropout layers."""
    return nn.Sequential(*[m for m in femnist_cnn((1, 9, 8), 3, width=0.1) if not isinstance(m, nn.Dropout)])


NETS = {  # factory, input shape, classes
    "cnn": (lambda: cnn((1, 9, 7), 3, channels=(2, 3), hidden=5), (1, 9, 7), 3),
    "odd": (_odd_net, (2, 11, 10), 4),
    "femnist-order": (_femnist_shape, (1, 9, 8), 3),
}


def _federation(name, sizes=(7, 2, 13, 5, 9), seed=0):
    """Uneven clients (one smaller than the batch), float64 inputs."""
    _, shape, classes = NETS[name]
    g = torch.Generator().manual_seed(seed)
    clients = [(torch.randn(m, *shape, generator=g), torch.randint(0, classes, (m,), generator=g)) for m in sizes]
    data = FederatedDataset.from_client_arrays(clients, clients, classes, "tiny-images")
    return replace(data, x_train=data.x_train.double(), x_test=data.x_test.double(), _padded={}, _buckets={},
                   _rows={})


def _start(model, n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.3 * torch.randn(n, *v.shape, generator=g) for k, v in model.init(0).items()}


def _run(model, start, data, schedule, lr, batch=4, seed=5):
    return local_sgd(model, start, data, schedule, steps=schedule.shape[0], lr=lr, batch_size=batch,
                     generator=make_generator(seed))


def _reference(factory, start, data, schedule, lr, batch=4, seed=5):
    """Per model, one step at a time, plain autograd on an nn.Module; and its minibatch losses."""
    steps, n = schedule.shape
    lrs = expand_lr(lr, steps, n, "cpu")  # the float32 step sizes local_sgd uses
    idx = data.sample_indices(schedule, batch, make_generator(seed))
    params = ref.local_sgd(factory, start, data, schedule, lrs, batch, make_generator(seed))
    losses = torch.empty(steps, n)
    for i in range(n):  # the loss before each step: replay the reference steps one at a time
        p = {k: v[i] for k, v in start.items()}
        for s in range(steps):
            module = ref._module_with(factory, p)
            losses[s, i] = nn.functional.cross_entropy(module(data.x_train[idx[s, i]]), data.y_train[idx[s, i]])
            p = ref.sgd_steps(factory, p, data, [int(schedule[s, i])], [float(lrs[s, i])], idx[s, i:i + 1])
    return params, losses


def _lr(kind, steps, n):
    g = torch.Generator().manual_seed(3)
    return {"scalar": 0.3, "per-model": torch.rand(n, generator=g, dtype=torch.float32) + 0.1,
            "per-step-and-model": torch.rand(steps, n, generator=g, dtype=torch.float32) + 0.1}[kind]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", sorted(NETS))
def test_forward_one_step_and_k_steps_equal_per_model_autograd(name, layout):
    """Losses before each step (the forward pass), one step, and K steps with models moving between uneven
    clients, per-model step sizes [N]; the K-step path and the vmap path against the autograd loop."""
    factory = NETS[name][0]
    data = _federation(name)
    fast = FunctionalModel(factory, conv_layout=layout)
    slow = FunctionalModel(factory, fast_steps=False)
    assert fast._steps_net is not None and fast.stacked is None  # the CNN's evaluation stays on vmap
    n = 4
    start = _start(fast, n)
    lr = _lr("per-model", 1, n)
    for steps in (1, 5):
        schedule = torch.randint(0, data.num_clients, (steps, n), generator=torch.Generator().manual_seed(steps))
        want, want_losses = _reference(factory, start, data, schedule, lr)
        for model in (fast, slow):
            got, got_losses = _run(model, start, data, schedule, lr)
            assert list(got) == list(start)
            for k in want:
                torch.testing.assert_close(got[k], want[k], **TOL)
                assert got[k].dtype == torch.float64 and got[k].is_contiguous()
            torch.testing.assert_close(got_losses, want_losses, **TOL)
    assert not torch.equal(got["0.weight"], start["0.weight"])


@pytest.mark.parametrize("lr_kind", ["scalar", "per-model", "per-step-and-model"])
def test_step_size_shapes_and_layouts_agree(lr_kind):
    factory = NETS["cnn"][0]
    data = _federation("cnn")
    steps, n = 3, 5
    schedule = torch.arange(n).remainder(data.num_clients).expand(steps, n)
    lr = _lr(lr_kind, steps, n)
    start = broadcast(FunctionalModel(factory).init(2), n)
    want, want_losses = _reference(factory, start, data, schedule, lr, batch=3)
    for layout in LAYOUTS:
        got, got_losses = _run(FunctionalModel(factory, conv_layout=layout), start, data, schedule, lr, batch=3)
        for k in want:
            torch.testing.assert_close(got[k], want[k], **TOL)
        torch.testing.assert_close(got_losses, want_losses, **TOL)


def test_the_callers_parameters_are_untouched():
    factory = NETS["odd"][0]
    data = _federation("odd")
    model = FunctionalModel(factory)
    start = _start(model, 3)
    before = {k: v.clone() for k, v in start.items()}
    _run(model, start, data, torch.tensor([[0, 1, 2], [2, 1, 0]]), 0.2)
    for k in start:
        assert torch.equal(start[k], before[k])


def test_k_step_path_only_where_it_applies():
    factory = NETS["cnn"][0]
    data = _federation("cnn")
    idx = torch.zeros(2, 3, 4, dtype=torch.long)
    lr = torch.full((2, 3), 0.1)
    params = broadcast(FunctionalModel(factory).init(0), 3)
    assert FunctionalModel(factory).sgd_steps(params, data, idx, lr) is not None
    assert FunctionalModel(factory, stacked="all").sgd_steps(params, data, idx, lr) is not None
    assert FunctionalModel(factory, fast_steps=False).sgd_steps(params, data, idx, lr) is None
    assert FunctionalModel(factory, stacked=False).sgd_steps(params, data, idx, lr) is None
    leaves = {k: v.clone().requires_grad_() for k, v in params.items()}
    assert FunctionalModel(factory).sgd_steps(leaves, data, idx, lr) is None
    # dropout layers (femnist_cnn) are not a layer the stacked path runs: the general path, vmap
    assert FunctionalModel(lambda: femnist_cnn((1, 9, 8), 3, width=0.1))._steps_net is None
    # a conv network without the Flatten -> dense tail shape has no K-step path
    assert FunctionalModel(lambda: nn.Sequential(nn.Flatten(), nn.Linear(4, 2)))._steps_net.conv_steps is None
    assert stacked_conv.conv_plan([("0", nn.Conv2d(1, 2, 3)), ("1", nn.Linear(2, 2))]) is None


def test_layout_per_device_and_validation():
    assert FunctionalModel(NETS["cnn"][0]).conv_layout == stacked_conv.CONV_LAYOUT["cpu"] == "loop"
    assert stacked_conv.conv_layout_for(torch.device("cuda")) == "grouped"
    with pytest.raises(ValueError, match="conv_layout must be one of"):
        FunctionalModel(NETS["cnn"][0], conv_layout="im2col")


def _per_model_grads(factory, params, x, y):
    """Per model, plain autograd on an nn.Module: the gradient of its mean loss on (x[i], y[i]), and the loss."""
    grads, losses = {k: torch.empty_like(v) for k, v in params.items()}, torch.empty(x.shape[0])
    for i in range(x.shape[0]):
        module = ref._module_with(factory, {k: v[i] for k, v in params.items()})
        loss = nn.functional.cross_entropy(module(x[i]), y[i])
        names, leaves = zip(*module.named_parameters())
        for k, g in zip(names, torch.autograd.grad(loss, leaves)):
            grads[k][i] = g
        losses[i] = loss.detach()
    return grads, losses


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", sorted(NETS))
def test_batched_grad_equals_per_model_autograd(name, layout):
    """A CNN's ``batched_grad`` (the steps of pFedMe, Per-FedAvg, PERM's global step) by the K-step path's
    forward and backward, against the autograd loop and the vmap path; the caller's tensors untouched. Measured
    (float64, a 5 x 7 batch of the cnn net, 2026-11-29): largest difference to vmap 4.4e-16, far below TOL."""
    factory, shape, classes = NETS[name]
    fast = FunctionalModel(factory, conv_layout=layout)
    slow = FunctionalModel(factory, fast_steps=False)
    n, b = 4, 3
    params = _start(fast, n)
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(n, b, *shape, generator=g), torch.randint(0, classes, (n, b), generator=g)
    before = ({k: v.clone() for k, v in params.items()}, x.clone())
    want, want_losses = _per_model_grads(factory, params, x, y)
    for model in (fast, slow):
        got, losses = model.batched_grad(params, x, y)
        assert list(got) == list(params)
        for k in want:
            torch.testing.assert_close(got[k], want[k], **TOL)
        torch.testing.assert_close(losses, want_losses, **TOL)
    assert all(torch.equal(params[k], before[0][k]) for k in params) and torch.equal(x, before[1])


@pytest.mark.parametrize("path", ["loop", "grouped", "vmap", "dense"])
def test_batched_grad_into_buffers(path):
    """``batched_grad(..., out=buffers)`` (pFedMe's and Per-FedAvg's steps) writes every gradient into the
    caller's buffers and returns them: exactly the numbers of the call without ``out``, on each path (the CNN
    path in both layouts, vmap, the dense stacked path of an MLP), and again on a second call."""
    if path == "dense":
        model, shape, classes = FunctionalModel(lambda: nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.ReLU(),
                                                                      nn.Linear(5, 3))), (6,), 3
    else:
        factory, shape, classes = NETS["odd"]
        model = FunctionalModel(factory, fast_steps=path != "vmap", conv_layout="loop" if path == "vmap" else path)
    n, b = 4, 3
    params = _start(model, n)
    g = torch.Generator().manual_seed(7)
    out = {k: torch.full_like(v, float("nan")) for k, v in params.items()}
    for _ in range(2):
        x, y = torch.randn(n, b, *shape, generator=g), torch.randint(0, classes, (n, b), generator=g)
        want, want_losses = model.batched_grad(params, x, y)
        got, losses = model.batched_grad(params, x, y, out=out)
        assert got is out and list(got) == list(params)
        assert all(torch.equal(got[k], want[k]) for k in want) and torch.equal(losses, want_losses)


def test_batched_grad_path_only_where_it_applies(monkeypatch):
    """The CNN gradient path runs under the K-step path's conditions, else vmap (which sees the graph)."""
    factory, shape, classes = NETS["cnn"]
    calls = []
    original = stacked_conv.ConvSteps.grad
    monkeypatch.setattr(stacked_conv.ConvSteps, "grad", lambda self, *a: calls.append(1) or original(self, *a))
    params = broadcast(FunctionalModel(factory).init(0), 2)
    x, y = torch.randn(2, 3, *shape), torch.randint(0, classes, (2, 3))
    FunctionalModel(factory).batched_grad(params, x, y)
    assert calls == [1]
    FunctionalModel(factory, fast_steps=False).batched_grad(params, x, y)
    FunctionalModel(factory).batched_grad({k: v.clone().requires_grad_() for k, v in params.items()}, x, y)
    assert calls == [1]
