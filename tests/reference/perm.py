"""Reference twins for PERM: one client problem at a time, by other means than the batched code."""
from __future__ import annotations

import torch

from pflkit.data.federated import FederatedDataset
from .fedavg import sgd_steps


def water_filling_bisection(d_row: torch.Tensor, n: torch.Tensor, lam: float, iters: int = 200) -> torch.Tensor:
    """min_a sum_j a_j d_j + lam sum_j a_j^2 / n_j on the simplex, by bisection on the multiplier tau:
    a_j(tau) = max(0, (tau - d_j) n_j / (2 lam)) and sum_j a_j(tau) = 1."""
    d_row, n = d_row.double(), n.double()
    lo, hi = float(d_row.min()), float(d_row.max()) + 2.0 * lam / float(n.min()) + 1.0
    for _ in range(iters):
        tau = 0.5 * (lo + hi)
        total = float(((tau - d_row).clamp_min(0) * n / (2 * lam)).sum())
        lo, hi = (tau, hi) if total < 1.0 else (lo, tau)
    return (0.5 * (lo + hi) - d_row).clamp_min(0) * n / (2 * lam)


def project_simplex_bisection(v: torch.Tensor, iters: int = 200) -> torch.Tensor:
    """Euclidean projection of one vector onto the simplex: max(v - theta, 0) with sum 1, theta by bisection."""
    v = v.double()
    lo, hi = float(v.min()) - 1.0, float(v.max())
    for _ in range(iters):
        theta = 0.5 * (lo + hi)
        lo, hi = (lo, theta) if float((v - theta).clamp_min(0).sum()) < 1.0 else (theta, hi)
    return (v - 0.5 * (lo + hi)).clamp_min(0)


def project_simplex_sort(v: torch.Tensor) -> torch.Tensor:
    """The sort-based projection of every row (Duchi et al. 2008) in torch ops only, as pflkit computed it
    before ``algorithms.perm.project_simplex`` had numpy sort the rows (which must agree bit for bit)."""
    u, _ = v.sort(1, descending=True)
    css = u.cumsum(1) - 1.0
    ks = torch.arange(1, v.shape[1] + 1, device=v.device, dtype=v.dtype)
    cond = u - css / ks > 0
    rho = cond.sum(1, keepdim=True) - 1
    theta = css.gather(1, rho) / (rho + 1).to(v.dtype)
    return (v - theta).clamp_min(0.0)


def shuffle_round(factory, v: dict, data: FederatedDataset, alpha: torch.Tensor, sigma: torch.Tensor, step: int,
                  local_steps: int, lr: float, batch_size: int, generator: torch.Generator) -> dict:
    """Alg. 1, one shuffle step, model by model: model i on client sigma[(i + step) % N]."""
    n = data.num_clients
    clients = [int(sigma[(i + step) % n]) for i in range(n)]
    schedule = torch.tensor(clients).unsqueeze(0).expand(local_steps, n)
    idx = data.sample_indices(schedule, batch_size, generator)  # the same draws as the batched call
    out = []
    for i, c in enumerate(clients):
        eta = lr * n * float(alpha[i, c])
        out.append(sgd_steps(factory, {k: p[i] for k, p in v.items()}, data, [c] * local_steps,
                             [eta] * local_steps, idx[:, i]))
    return {k: torch.stack([o[k] for o in out]) for k in out[0]}


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    """The sample Pearson correlation of two vectors, one sum at a time (deviations over n - 1, as torch.std)."""
    a, b = a.double().tolist(), b.double().tolist()
    n = len(a)
    ma, mb = sum(a) / n, sum(b) / n
    sa = (sum((x - ma) ** 2 for x in a) / (n - 1)) ** 0.5 + 1e-8
    sb = (sum((x - mb) ** 2 for x in b) / (n - 1)) ** 0.5 + 1e-8
    return sum((x - ma) / sa * (y - mb) / sb for x, y in zip(a, b)) / (n - 1)


def gradient_correlation(grads: dict) -> torch.Tensor:
    """TorchFed fedshuffle's alpha, pair by pair: per parameter tensor the Pearson correlation of every two
    clients' gradients, averaged over the tensors where client 0's gradient is not constant (and D >= 2)."""
    total, count = None, 0
    for g in grads.values():
        x = g.flatten(1)
        n = x.shape[0]
        if x.shape[1] < 2 or pearson(x[0], x[0]) < 0.99:
            continue
        corr = torch.tensor([[pearson(x[i], x[j]) for j in range(n)] for i in range(n)], dtype=torch.float64)
        total, count = (corr if total is None else total + corr), count + 1
    return total / count


def interpolate_round(factory, v: dict, data: FederatedDataset, alpha: torch.Tensor, sigma: torch.Tensor, step: int,
                      local_steps: int, lr: float, batch_size: int, generator: torch.Generator) -> dict:
    """TorchFed fedshuffle's visit, model by model: model i on client c = sigma[(i + step) % N] takes K plain SGD
    steps lr from v_i to u_i, then v_i <- v_i + a (u_i - v_i) with a = alpha[i, c] clipped to [0, 1]."""
    n = data.num_clients
    clients = [int(sigma[(i + step) % n]) for i in range(n)]
    schedule = torch.tensor(clients).unsqueeze(0).expand(local_steps, n)
    idx = data.sample_indices(schedule, batch_size, generator)
    out = []
    for i, c in enumerate(clients):
        start = {k: p[i] for k, p in v.items()}
        u = sgd_steps(factory, start, data, [c] * local_steps, [lr] * local_steps, idx[:, i])
        a = min(max(float(alpha[i, c]), 0.0), 1.0)
        out.append({k: start[k] + a * (u[k] - start[k]) for k in start})
    return {k: torch.stack([o[k] for o in out]) for k in out[0]}
