"""The batched engine against its reference loop, and its sampling / determinism contracts."""
import pytest
import torch

from pflkit.engine import FunctionalModel, broadcast, full_gradients, local_sgd, make_generator, mean
from pflkit.engine.local_sgd import expand_lr, expand_schedule
from pflkit.models import logistic, mlp

from reference import fedavg as ref

FACTORIES = {
    "logistic": lambda: logistic((6,), 3),
    "mlp": lambda: mlp((6,), 3, hidden=(8, 5)),
}


def _close(a, b, tol=1e-5):
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=tol, rtol=tol)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_local_sgd_equals_reference_mixed_sizes(mixed, name):
    """Per-step client schedule and per-model step sizes, clients of sizes 3..41."""
    factory = FACTORIES[name]
    model = FunctionalModel(factory)
    n, steps = 4, 6
    g = torch.Generator().manual_seed(0)
    stacked = {k: torch.randn(n, *v.shape, generator=g) * 0.3 for k, v in model.init(1).items()}
    schedule = torch.randint(0, mixed.num_clients, (steps, n), generator=g)
    lrs = torch.rand(steps, n, generator=g) * 0.5 + 0.05
    got, losses = local_sgd(model, stacked, mixed, schedule, steps=steps, lr=lrs, batch_size=5,
                            generator=make_generator(7))
    want = ref.local_sgd(factory, stacked, mixed, schedule, lrs, 5, make_generator(7))
    _close(got, want)
    assert losses.shape == (steps, n) and torch.isfinite(losses).all()
    assert not torch.allclose(got["1.weight"] if name == "logistic" else got["5.weight"],
                              stacked["1.weight"] if name == "logistic" else stacked["5.weight"])


def test_local_sgd_prox_full_batch_and_grad_weights(mixed):
    factory = FACTORIES["logistic"]
    model = FunctionalModel(factory)
    n, steps = mixed.num_clients, 4
    start = broadcast(model.init(0), n)
    anchor = broadcast(model.init(1), n)
    clients = torch.arange(n)
    theta = torch.tensor([0.0, 1.0, 2.0, 0.5])
    # per-step weights are [steps, 1]; steps (4) != N (5) here, but the shape is what decides
    got, _, acc = local_sgd(model, start, mixed, clients, steps=steps, lr=0.3, batch_size=None,
                            generator=make_generator(0), prox=0.7, anchor=anchor, grad_weights=theta[:, None])
    schedule = expand_schedule(clients, steps)
    want = ref.local_sgd(factory, start, mixed, schedule, torch.full((steps, n), 0.3), None,
                         make_generator(0), prox=0.7, anchor=anchor)
    _close(got, want)
    # sum_s theta_s g_s rebuilt from the reference trajectory one step at a time
    expected = {k: torch.zeros_like(v) for k, v in start.items()}
    cur = start
    for s in range(steps):
        nxt = ref.local_sgd(factory, cur, mixed, schedule[:1], torch.full((1, n), 0.3), None,
                            make_generator(0), prox=0.7, anchor=anchor)
        for k in expected:
            expected[k] += theta[s] * (cur[k] - nxt[k]) / 0.3
        cur = nxt
    _close(acc, expected, tol=1e-4)


def test_full_gradients_equal_autograd_per_client(mixed):
    factory = FACTORIES["mlp"]
    model = FunctionalModel(factory)
    w = broadcast(model.init(3), mixed.num_clients)
    grads, losses = full_gradients(model, w, mixed)
    for j in range(mixed.num_clients):
        module = ref._module_with(factory, {k: v[j] for k, v in w.items()})
        x, y = mixed.client(j)
        loss = torch.nn.functional.cross_entropy(module(x), y)
        gs = torch.autograd.grad(loss, list(module.parameters()))
        for (name, _), g in zip(module.named_parameters(), gs):
            torch.testing.assert_close(grads[name][j], g, atol=1e-6, rtol=1e-5)
        assert abs(float(losses[j]) - loss.detach().item()) < 1e-6


def test_sample_indices_stay_inside_each_client(mixed):
    clients = torch.tensor([[0, 1, 2, 3, 4]] * 50)
    idx = mixed.sample_indices(clients, 16, make_generator(0)).cpu()
    assert idx.shape == (50, 5, 16)
    for j in range(5):
        lo, hi = int(mixed.train_offsets[j]), int(mixed.train_offsets[j] + mixed.train_sizes[j])
        col = idx[:, j]
        assert col.min() >= lo and col.max() < hi
        assert len(col.unique()) == hi - lo  # 800 draws cover every sample of clients up to 41
    again = mixed.sample_indices(clients, 16, make_generator(0))
    assert torch.equal(idx, again.cpu())


def test_padded_matches_clients(mixed):
    x, y, mask = mixed.padded("train")
    for j in range(mixed.num_clients):
        xj, yj = mixed.client(j)
        n = len(yj)
        assert int(mask[j].sum()) == n
        assert torch.equal(x[j, :n], xj) and torch.equal(y[j, :n], yj)


def test_mean_weights_and_shapes():
    stacked = {"w": torch.tensor([[1.0, 2.0], [3.0, 6.0]])}
    assert torch.equal(mean(stacked)["w"], torch.tensor([2.0, 4.0]))
    torch.testing.assert_close(mean(stacked, torch.tensor([3.0, 1.0]))["w"], torch.tensor([1.5, 3.0]))


@pytest.mark.parametrize("bad", [torch.zeros(3, 2), torch.zeros(2, 2, 2)])
def test_schedule_and_lr_shapes_are_checked(bad):
    with pytest.raises(ValueError, match="clients must have shape"):
        expand_schedule(bad.long(), 5)
    with pytest.raises(ValueError, match="lr must be"):
        expand_lr(bad, 5, 2, "cpu")


def test_per_step_values_are_never_read_as_per_model():
    """[steps] == [N] in length is ambiguous: a 1-D tensor always means per model."""
    per_model = torch.tensor([1.0, 2.0, 3.0])
    assert torch.equal(expand_lr(per_model, 3, 3, "cpu"), per_model.expand(3, 3))
    per_step = torch.tensor([[1.0], [2.0], [3.0]])
    assert torch.equal(expand_lr(per_step, 3, 3, "cpu"), per_step.expand(3, 3))
    with pytest.raises(ValueError, match=r"\[steps=4, 1\]"):
        expand_lr(torch.ones(4), 4, 3, "cpu")


def test_local_sgd_rejects_mismatched_models(mixed):
    model = FunctionalModel(FACTORIES["logistic"])
    with pytest.raises(ValueError, match="assigns 3 models but params stack 5"):
        local_sgd(model, broadcast(model.init(0), 5), mixed, torch.arange(3), steps=2, lr=0.1,
                  batch_size=2, generator=make_generator(0))
    with pytest.raises(ValueError, match="prox > 0 needs an anchor"):
        local_sgd(model, broadcast(model.init(0), 5), mixed, torch.arange(5), steps=2, lr=0.1,
                  batch_size=2, generator=make_generator(0), prox=1.0)


def _dropout_linear(d=10, p=0.3, classes=2):
    return torch.nn.Sequential(torch.nn.Dropout(p), torch.nn.Linear(d, classes))


def test_train_grad_runs_dropout_with_one_mask_per_model():
    """With one sample per model the mask is readable off grad W (a dropped input gives a zero column);
    recomputing each model's loss by hand with that mask gives the same gradient; a model's mask depends on its
    own seed only."""
    n, d, p = 200, 10, 0.3
    model = FunctionalModel(lambda: _dropout_linear(d, p))
    assert model.dropout and model.module.training is False
    g = torch.Generator().manual_seed(0)
    params = {k: torch.randn(n, *v.shape, generator=g) for k, v in model.init(0).items()}
    x, y = torch.randn(n, 1, d, generator=g), torch.randint(0, 2, (n, 1), generator=g)
    seeds = torch.arange(n) + 7  # one per model
    grads, losses = model.train_grad(params, x, y, seeds)
    assert model.module.training is False  # back in eval mode
    masks = grads["1.weight"].abs().sum(1) > 0  # [n, d]
    assert abs(1 - masks.float().mean().item() - p) < 0.04  # 2,000 draws: sd ~0.01
    assert len({tuple(m.tolist()) for m in masks}) > n // 2  # models draw their own masks
    for i in range(n):
        w = params["1.weight"][i].clone().requires_grad_()
        b = params["1.bias"][i].clone().requires_grad_()
        loss = torch.nn.functional.cross_entropy((x[i] * masks[i] / (1 - p)) @ w.T + b, y[i])
        gw, gb = torch.autograd.grad(loss, (w, b))
        torch.testing.assert_close(grads["1.weight"][i], gw, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(grads["1.bias"][i], gb, atol=1e-6, rtol=1e-5)
        assert losses[i].item() == pytest.approx(loss.item(), rel=1e-5, abs=1e-6)
    again, _ = model.train_grad(params, x, y, seeds)
    other, _ = model.train_grad(params, x, y, seeds + n)
    assert torch.equal(again["1.weight"], grads["1.weight"])
    assert not torch.equal(other["1.weight"], grads["1.weight"])
    half, _ = model.train_grad({k: v[::2] for k, v in params.items()}, x[::2], y[::2], seeds[::2])
    assert torch.equal(half["1.weight"], grads["1.weight"][::2])
    eval_grads, _ = model.batched_grad(params, x, y)  # estimates and evaluation: no dropout
    assert (eval_grads["1.weight"].abs().sum(1) > 0).all()


def test_local_sgd_trains_with_dropout_deterministically(mixed):
    model = FunctionalModel(lambda: _dropout_linear(6, 0.5, 3))
    off = FunctionalModel(lambda: _dropout_linear(6, 0.5, 3), dropout=False)
    w = broadcast(model.init(0), 4)
    same_client = torch.zeros(4, dtype=torch.long)

    def run(m, seed=0):
        out, _ = local_sgd(m, w, mixed, same_client, steps=5, lr=0.1, batch_size=4, generator=make_generator(seed))
        return out["1.weight"]
    a = run(model)
    assert torch.equal(a, run(model))  # deterministic for a seed
    assert not torch.equal(a, run(model, seed=1))
    plain = run(off)  # the same minibatches (mask seeds are drawn after them), no dropout
    assert not torch.equal(a, plain)
    no_layer = FunctionalModel(lambda: torch.nn.Sequential(torch.nn.Identity(), torch.nn.Linear(6, 3)))
    assert not no_layer.dropout
    assert torch.equal(plain, run(no_layer))
    with pytest.raises(ValueError, match="dropout must be True or False"):
        FunctionalModel(lambda: _dropout_linear(), dropout="yes")
