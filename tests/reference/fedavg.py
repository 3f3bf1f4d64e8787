"""Reference twins of engine.local_sgd, Local, FedAvg and localized FedAvg."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from pflkit.data.federated import FederatedDataset


def _module_with(factory: Callable[[], nn.Module], params: dict[str, torch.Tensor]) -> nn.Module:
    module = factory().to(next(iter(params.values())).device)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(params[name])
    return module


def sgd_steps(factory, params: dict, data: FederatedDataset, clients: list[int], lrs: list[float],
              rows: torch.Tensor | None, prox: float = 0.0, anchor: dict | None = None) -> dict:
    """One model, one step at a time: step s uses client clients[s], lr lrs[s] and the sample rows
    rows[s] of x_train (or the client's whole train split when rows is None)."""
    module = _module_with(factory, params)
    names = [n for n, _ in module.named_parameters()]
    for s, (client, lr) in enumerate(zip(clients, lrs)):
        if rows is None:
            x, y = data.client(int(client), "train")
        else:
            x, y = data.x_train[rows[s]], data.y_train[rows[s]]
        loss = F.cross_entropy(module(x), y)
        grads = torch.autograd.grad(loss, list(module.parameters()))
        with torch.no_grad():
            for name, p, g in zip(names, module.parameters(), grads):
                if prox:
                    g = g + prox * (p - anchor[name])
                p -= lr * g
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def local_sgd(factory, stacked: dict, data: FederatedDataset, schedule: torch.Tensor, lrs: torch.Tensor,
              batch_size: int | None, generator: torch.Generator, prox: float = 0.0,
              anchor: dict | None = None) -> dict:
    """Loop twin of engine.local_sgd with schedule [steps, N] and lrs [steps, N] given explicitly."""
    idx = None if batch_size is None else data.sample_indices(schedule, batch_size, generator)
    n = schedule.shape[1]
    out = []
    for i in range(n):
        p_i = {k: v[i] for k, v in stacked.items()}
        a_i = None if anchor is None else {k: v[i] for k, v in anchor.items()}
        out.append(sgd_steps(factory, p_i, data, schedule[:, i].tolist(), lrs[:, i].tolist(),
                             None if idx is None else idx[:, i], prox, a_i))
    return {k: torch.stack([o[k] for o in out]) for k in out[0]}


def fedavg(factory, w0: dict, data: FederatedDataset, rounds: int, local_steps: int, lr: float,
           batch_size: int | None, seed: int, weighting: str = "uniform", combine=None) -> list[dict]:
    """Full-participation FedAvg, one client at a time; returns w after every round. ``combine``: the server's
    rule over the list of local models instead of the weighted mean (``reference.robust.combine``)."""
    gen = torch.Generator().manual_seed(seed)
    n = data.num_clients
    w = {k: v.clone() for k, v in w0.items()}
    history = []
    for _ in range(rounds):
        schedule = torch.arange(n).unsqueeze(0).expand(local_steps, n)
        idx = None if batch_size is None else data.sample_indices(schedule, batch_size, gen)
        locals_ = [sgd_steps(factory, w, data, [j] * local_steps, [lr] * local_steps,
                             None if idx is None else idx[:, j]) for j in range(n)]
        weights = data.train_sizes.double() if weighting == "samples" else torch.ones(n, dtype=torch.float64)
        weights = weights / weights.sum()
        w = combine(locals_) if combine is not None else \
            {k: sum(float(weights[j]) * locals_[j][k] for j in range(n)) for k in w}
        history.append(w)
    return history


def local(factory, w0: dict, data: FederatedDataset, rounds: int, local_steps: int, lr: float,
          batch_size: int, seed: int) -> list[dict]:
    """Each client alone; returns every client's model after the last round."""
    gen = torch.Generator().manual_seed(seed)
    n = data.num_clients
    models = [{k: v.clone() for k, v in w0.items()} for _ in range(n)]
    for _ in range(rounds):
        schedule = torch.arange(n).unsqueeze(0).expand(local_steps, n)
        idx = data.sample_indices(schedule, batch_size, gen)
        models = [sgd_steps(factory, models[j], data, [j] * local_steps, [lr] * local_steps, idx[:, j])
                  for j in range(n)]
    return models


def finetune(factory, w: dict, data: FederatedDataset, steps: int, lr: float, batch_size: int,
             generator: torch.Generator) -> list[dict]:
    """Localized FedAvg's personalization: every client fine-tunes w on its own train split."""
    n = data.num_clients
    idx = data.sample_indices(torch.arange(n).unsqueeze(0).expand(steps, n), batch_size, generator)
    return [sgd_steps(factory, w, data, [j] * steps, [lr] * steps, idx[:, j]) for j in range(n)]
