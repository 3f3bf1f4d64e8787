"""The hot primitive: K SGD steps for N models at once, each on its own client.

``schedule[s, i]`` is the client model i sits on at step s and ``lr[s, i]`` its step size, so the
same call runs FedAvg (all models on their own client), PERM's shuffling (model i moves between
clients with step eta * alpha_i(client) * N) and fine-tuning.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..data.federated import FederatedDataset
from .functional import FunctionalModel
from .params import Params, num_models, scale_like


def expand_schedule(clients: Tensor, steps: int) -> Tensor:
    """[N] (fixed client per model) or [steps, N] -> [steps, N] int64 on CPU."""
    clients = torch.as_tensor(clients, dtype=torch.long).cpu()
    if clients.dim() == 1:
        return clients.unsqueeze(0).expand(steps, -1)
    if clients.dim() == 2 and clients.shape[0] == steps:
        return clients
    raise ValueError(f"clients must have shape [N] or [steps={steps}, N], got {tuple(clients.shape)}")


def expand_lr(lr: float | Tensor, steps: int, n: int, device) -> Tensor:
    """Scalar, [N] (one value per model), [steps, 1] (one per step) or [steps, N] -> [steps, N].

    A 1-D tensor always means one value per model: per-step values must say so with shape
    [steps, 1], so a length that happens to equal both steps and N is never misread."""
    lr = torch.as_tensor(lr, dtype=torch.float32, device=device)
    if lr.dim() == 0:
        return lr.expand(steps, n)
    if lr.dim() == 1 and lr.shape[0] == n:
        return lr.unsqueeze(0).expand(steps, n)
    if lr.dim() == 2 and lr.shape == (steps, 1):
        return lr.expand(steps, n)
    if lr.dim() == 2 and lr.shape == (steps, n):
        return lr
    raise ValueError(f"lr must be a scalar, [N={n}], [steps={steps}, 1] or [steps={steps}, N={n}], "
                     f"got {tuple(lr.shape)}")


def local_sgd(model: FunctionalModel, params: Params, data: FederatedDataset, clients: Tensor, *,
              steps: int, lr: float | Tensor, batch_size: int | None, generator: torch.Generator,
              prox: float = 0.0, anchor: Params | None = None,
              grad_weights: Tensor | None = None):
    """Run ``steps`` minibatch SGD steps for every stacked model.

    v_i <- v_i - lr[s, i] * g_{s,i},  g_{s,i} = grad f_{schedule[s, i]}(v_i; batch) + prox * (v_i - anchor_i)

    ``batch_size=None`` uses each client's whole train split at every step (exact local GD); no
    random draws are made then. Returns the new parameters and the minibatch losses [steps, N] (before each step). With
    ``grad_weights`` (theta, shape [steps, 1] or [steps, N]) it also returns sum_s theta_s g_s per model
    as a third value (LocalUpdate's client output). ``lr`` and ``grad_weights`` take the shapes of
    ``expand_lr``.
    """
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps!r}")
    n = num_models(params)
    schedule = expand_schedule(clients, steps)
    if schedule.shape[1] != n:
        raise ValueError(f"clients assigns {schedule.shape[1]} models but params stack {n}")
    lrs = expand_lr(lr, steps, n, data.device)
    if prox and anchor is None:
        raise ValueError("prox > 0 needs an anchor (the parameters to stay close to)")
    full = batch_size is None
    if full:
        x_pad, y_pad, mask = data.padded("train")
        sched_dev = schedule.to(data.device)
    else:
        idx = data.sample_indices(schedule, batch_size, generator)  # [steps, N, B]
    losses = torch.empty(steps, n, device=data.device)
    acc = None
    if grad_weights is not None:
        theta = expand_lr(grad_weights, steps, n, data.device)
        acc = {k: torch.zeros_like(p) for k, p in params.items()}
    for s in range(steps):
        if full:
            c = sched_dev[s]
            grads, loss = model.batched_full_grad(params, x_pad[c], y_pad[c], mask[c])
        else:
            grads, loss = model.batched_grad(params, data.x_train[idx[s]], data.y_train[idx[s]])
        losses[s] = loss
        new = {}
        for k, p in params.items():
            g = grads[k] if not prox else grads[k] + prox * (p - anchor[k])
            new[k] = p - scale_like(lrs[s], p) * g
            if acc is not None:
                acc[k] = acc[k] + scale_like(theta[s], p) * g
        params = new
    if acc is not None:
        return params, losses, acc
    return params, losses


def full_gradients(model: FunctionalModel, params: Params, data: FederatedDataset,
                   split: str = "train") -> tuple[Params, Tensor]:
    """Exact gradient of f_j at model j's parameters for every client j (params stacked [N, ..])."""
    x, y, mask = data.padded(split)
    return model.batched_full_grad(params, x, y, mask)
