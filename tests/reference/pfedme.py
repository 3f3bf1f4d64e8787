"""Reference twin of pFedMe: one client, one step at a time, nn.Module + autograd."""
from __future__ import annotations

import torch

from pflkit.data.federated import FederatedDataset
from .perfedavg import average, gradient, participants


def local_round(factory, w: dict, data: FederatedDataset, rows: torch.Tensor, lr: float, personal_lr: float,
                lam: float, inner_steps: int) -> tuple[dict, dict]:
    """One client's pFedMe local round from w; rows [R, B] is one minibatch per local step.
    Returns (w_local, theta)."""
    local = {k: v.clone() for k, v in w.items()}
    theta = {k: v.clone() for k, v in w.items()}
    for r in range(rows.shape[0]):
        x, y = data.x_train[rows[r]], data.y_train[rows[r]]
        for _ in range(inner_steps):
            g = gradient(factory, theta, x, y)
            theta = {k: theta[k] - personal_lr * (g[k] + lam * (theta[k] - local[k])) for k in theta}
        local = {k: local[k] - lr * lam * (local[k] - theta[k]) for k in local}
    return local, theta


def pfedme(factory, w0: dict, data: FederatedDataset, rounds: int, local_steps: int, lr: float,
           personal_lr: float, lam: float, inner_steps: int, batch_size: int, seed: int, beta: float = 1.0,
           clients_per_round: int | None = None, weighting: str = "uniform") -> list[dict]:
    """pFedMe one client at a time; returns the global model after every round."""
    gen = torch.Generator().manual_seed(seed)
    n = data.num_clients
    w = {k: v.clone() for k, v in w0.items()}
    history = []
    for _ in range(rounds):
        clients = participants(n, clients_per_round, gen)
        m = len(clients)
        idx = data.sample_indices(torch.tensor(clients).unsqueeze(0).expand(local_steps, m), batch_size, gen)
        locals_ = [local_round(factory, w, data, idx[:, i], lr, personal_lr, lam, inner_steps)[0]
                   for i in range(m)]
        avg = average(locals_, data.train_sizes[clients] if weighting == "samples" else None)
        w = {k: (1 - beta) * w[k] + beta * avg[k] for k in w}
        history.append(w)
    return history


def personalize(factory, w: dict, data: FederatedDataset, local_steps: int, lr: float, personal_lr: float,
                lam: float, inner_steps: int, batch_size: int, generator: torch.Generator,
                clients_per_round: int | None = None) -> list[dict]:
    """Each client's theta after one local round from w, every client drawing what it would draw in the
    next round of :func:`pfedme` (``generator``: the run's generator as that round finds it; the
    participants are drawn first, as the round does, then every client's minibatches)."""
    n = data.num_clients
    participants(n, clients_per_round, generator)
    idx = data.sample_indices(torch.arange(n).unsqueeze(0).expand(local_steps, n), batch_size, generator)
    return [local_round(factory, w, data, idx[:, j], lr, personal_lr, lam, inner_steps)[1] for j in range(n)]
