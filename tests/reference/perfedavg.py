"""Reference twin of Per-FedAvg (FO and HF): one client, one step at a time, nn.Module + autograd.

The Hessian-vector product is either the finite difference of two autograd gradients or the exact
double-backward product grad_w <grad_w f(w), u> (independent of the batched code's forward-over-reverse
``torch.func.jvp``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pflkit.data.federated import FederatedDataset
from .fedavg import _module_with


def gradient(factory, params: dict, x: torch.Tensor, y: torch.Tensor) -> dict:
    """grad of the mean cross-entropy of one model on one batch."""
    module = _module_with(factory, params)
    loss = F.cross_entropy(module(x), y)
    names = [n for n, _ in module.named_parameters()]
    return dict(zip(names, torch.autograd.grad(loss, list(module.parameters()))))


def hvp_double_backward(factory, params: dict, x: torch.Tensor, y: torch.Tensor, u: dict) -> dict:
    """H(params; x, y) u by differentiating <grad f, u> once more."""
    module = _module_with(factory, params)
    names = [n for n, _ in module.named_parameters()]
    loss = F.cross_entropy(module(x), y)
    grads = torch.autograd.grad(loss, list(module.parameters()), create_graph=True)
    dot = sum((g * u[n]).sum() for n, g in zip(names, grads))
    return dict(zip(names, torch.autograd.grad(dot, list(module.parameters()))))


def hvp_finite_difference(factory, params: dict, x, y, u: dict, delta: float) -> dict:
    plus = gradient(factory, {k: v + delta * u[k] for k, v in params.items()}, x, y)
    minus = gradient(factory, {k: v - delta * u[k] for k, v in params.items()}, x, y)
    return {k: (plus[k] - minus[k]) / (2 * delta) for k in params}


def local_steps(factory, w: dict, data: FederatedDataset, rows: torch.Tensor, alpha: float, beta: float,
                variant: str, hvp: str = "finite_difference", delta: float = 1e-3) -> dict:
    """Per-FedAvg local steps for one client; rows [tau, parts, B] are the D, D'(, D'') row indices."""
    v = {k: t.clone() for k, t in w.items()}
    for t in range(rows.shape[0]):
        batch = [(data.x_train[rows[t, p]], data.y_train[rows[t, p]]) for p in range(rows.shape[1])]
        g = gradient(factory, v, *batch[0])
        temp = {k: v[k] - alpha * g[k] for k in v}
        step = gradient(factory, temp, *batch[1])
        if variant == "hf" and alpha:
            d = (hvp_double_backward(factory, v, *batch[2], step) if hvp == "exact"
                 else hvp_finite_difference(factory, v, *batch[2], step, delta))
            step = {k: step[k] - alpha * d[k] for k in step}
        v = {k: v[k] - beta * step[k] for k in v}
    return v


def participants(n: int, clients_per_round: int | None, gen: torch.Generator) -> list[int]:
    if clients_per_round is None or clients_per_round >= n:
        return list(range(n))
    return torch.randperm(n, generator=gen)[:clients_per_round].sort().values.tolist()


def average(models: list[dict], weights: torch.Tensor | None) -> dict:
    w = torch.ones(len(models), dtype=torch.float64) if weights is None else weights.double()
    w = w / w.sum()
    return {k: sum(float(w[j]) * models[j][k] for j in range(len(models))) for k in models[0]}


def perfedavg(factory, w0: dict, data: FederatedDataset, rounds: int, tau: int, alpha: float, beta: float,
              batch_size: int, seed: int, variant: str = "fo", hvp: str = "finite_difference",
              delta: float = 1e-3, clients_per_round: int | None = None, weighting: str = "uniform") -> list[dict]:
    """Per-FedAvg one client at a time; returns the global model after every round."""
    gen = torch.Generator().manual_seed(seed)
    n, parts = data.num_clients, 3 if variant == "hf" else 2
    w = {k: v.clone() for k, v in w0.items()}
    history = []
    for _ in range(rounds):
        clients = participants(n, clients_per_round, gen)
        m = len(clients)
        idx = data.sample_indices(torch.tensor(clients).view(1, 1, m).expand(tau, parts, m), batch_size, gen)
        locals_ = [local_steps(factory, w, data, idx[:, :, i], alpha, beta, variant, hvp, delta)
                   for i in range(m)]
        weights = data.train_sizes[clients] if weighting == "samples" else None
        w = average(locals_, weights)
        history.append(w)
    return history


def personalize(factory, w: dict, data: FederatedDataset, alpha: float, batch_size: int,
                generator: torch.Generator) -> list[dict]:
    """One SGD step of size alpha from w on a training minibatch of each client."""
    n = data.num_clients
    idx = data.sample_indices(torch.arange(n).unsqueeze(0), batch_size, generator)[0]
    out = []
    for j in range(n):
        g = gradient(factory, w, data.x_train[idx[j]], data.y_train[idx[j]])
        out.append({k: w[k] - alpha * g[k] for k in w})
    return out
