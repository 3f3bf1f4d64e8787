"""Reference twins for PERM-hetero: every sub-model is an explicitly built *smaller* ``nn.Module``
(``spec.build(units)``), its parameters cut out of the full-width model by index, trained one model
at a time with ``torch.autograd`` and written back. No masks are used here."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pflkit.data.federated import FederatedDataset
from pflkit.models.width import WidthSpec
from .fedavg import _module_with, sgd_steps
from .perm import water_filling_bisection


def _columns(idx: torch.Tensor, repeat: int) -> torch.Tensor:
    return (idx[:, None] * repeat + torch.arange(repeat)[None, :]).flatten()


def _rows_cols(spec: WidthSpec, name: str, idx: list[torch.Tensor]):
    p = next(q for q in spec.params if q.name == name)
    shape = spec.shapes[name]
    rows = idx[p.out_group] if p.out_group is not None else torch.arange(shape[0])
    cols = _columns(idx[p.in_group], p.in_repeat) if p.in_group is not None else \
        (torch.arange(shape[1]) if len(shape) > 1 else None)
    return rows, cols


def extract(spec: WidthSpec, full: dict, idx: list[torch.Tensor]) -> dict:
    """The small model's parameters: rows / columns of the kept units (``idx``: indices per group)."""
    out = {}
    for name, t in full.items():
        rows, cols = _rows_cols(spec, name, idx)
        out[name] = t[rows] if cols is None else t[rows][:, cols]
    return {k: v.clone() for k, v in out.items()}


def insert(spec: WidthSpec, full: dict, small: dict, idx: list[torch.Tensor]) -> dict:
    """``full`` with the kept units' rows / columns replaced by ``small``."""
    out = {k: v.clone() for k, v in full.items()}
    for name, t in small.items():
        rows, cols = _rows_cols(spec, name, idx)
        if cols is None:
            out[name][rows] = t
        else:
            out[name][rows[:, None], cols[None, :]] = t
    return out


def small_factory(spec: WidthSpec, idx: list[torch.Tensor]):
    units = tuple(len(i) for i in idx)
    return lambda: spec.build(units)


def _intersect(a: list[torch.Tensor], b: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.tensor(sorted(set(x.tolist()) & set(y.tolist())), dtype=torch.long) for x, y in zip(a, b)]


def shuffle_round(spec: WidthSpec, v: dict, units: list[list[torch.Tensor]], data: FederatedDataset,
                  alpha: torch.Tensor, sigma: torch.Tensor, step: int, local_steps: int, lr: float, batch_size: int,
                  generator: torch.Generator) -> dict:
    """One shuffle round, model by model: model i on client c trains the small module made of the
    units model i and client c both hold (``units[i]``: model i's unit indices per group)."""
    n = data.num_clients
    clients = [int(sigma[(i + step) % n]) for i in range(n)]
    schedule = torch.tensor(clients).unsqueeze(0).expand(local_steps, n)
    idx = data.sample_indices(schedule, batch_size, generator)  # the batched code's draws
    out = []
    for i, c in enumerate(clients):
        keep = _intersect(units[i], units[c])
        v_i = {k: p[i] for k, p in v.items()}
        eta = lr * n * float(alpha[i, c])
        small = sgd_steps(small_factory(spec, keep), extract(spec, v_i, keep), data, [c] * local_steps,
                          [eta] * local_steps, idx[:, i])
        out.append(insert(spec, v_i, small, keep))
    return {k: torch.stack([o[k] for o in out]) for k in out[0]}


def partial_fedavg_round(spec: WidthSpec, w: dict, units: list[list[torch.Tensor]], data: FederatedDataset,
                         local_steps: int, lr: float, batch_size: int, generator: torch.Generator) -> dict:
    """Client j trains the small module of its units ``units[j]`` on its data; every server
    coordinate becomes the mean of the clients that hold it (unheld ones keep w)."""
    n = data.num_clients
    schedule = torch.arange(n).unsqueeze(0).expand(local_steps, n)
    idx = data.sample_indices(schedule, batch_size, generator)
    total = {k: torch.zeros_like(p) for k, p in w.items()}
    count = {k: torch.zeros_like(p) for k, p in w.items()}
    for j in range(n):
        small = sgd_steps(small_factory(spec, units[j]), extract(spec, w, units[j]), data, [j] * local_steps,
                          [lr] * local_steps, idx[:, j])
        zeros = {k: torch.zeros_like(p) for k, p in w.items()}
        total = _add(total, insert(spec, zeros, small, units[j]))
        count = _add(count, insert(spec, zeros, {k: torch.ones_like(p) for k, p in small.items()}, units[j]))
    return {k: torch.where(count[k] > 0, total[k] / count[k].clamp_min(1), w[k]) for k in w}


def _add(a: dict, b: dict) -> dict:
    return {k: a[k] + b[k] for k in a}


def _small_gradient(spec: WidthSpec, w: dict, keep: list[torch.Tensor], data: FederatedDataset, client: int):
    module = _module_with(small_factory(spec, keep), extract(spec, w, keep))
    x, y = data.client(client, "train")
    grads = torch.autograd.grad(F.cross_entropy(module(x), y), list(module.parameters()))
    return {name: g for (name, _), g in zip(module.named_parameters(), grads)}, \
        sum(p.numel() for p in module.parameters())


def hetero_alpha(spec: WidthSpec, w: dict, units: list[list[torch.Tensor]], data: FederatedDataset, lam: float,
                 complexity: float, shared: bool = False) -> torch.Tensor:
    """Sec. 3.3's alpha, client by client: exact gradients of each small module on its client's
    whole train split, scattered into server-width vectors; D by explicit pairs; the complexity
    sqrt(P_j / n_j) from the small module's parameter count; each row solved by bisection.
    ``shared``: D_ij from the gradients of the small module of the units both i and j hold."""
    n = data.num_clients
    zeros = {k: torch.zeros_like(p) for k, p in w.items()}
    vecs, sizes = [], []
    for j in range(n):
        small, size = _small_gradient(spec, w, units[j], data, j)
        full = insert(spec, zeros, small, units[j])
        vecs.append(torch.cat([full[k].flatten() for k in w]).double())
        sizes.append(size)
    d = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            if shared:
                keep = _intersect(units[i], units[j])
                gi, _ = _small_gradient(spec, w, keep, data, i)
                gj, _ = _small_gradient(spec, w, keep, data, j)
                d[i, j] = sum(((gi[k].double() - gj[k].double()) ** 2).sum() for k in gi)
            else:
                d[i, j] = ((vecs[i] - vecs[j]) ** 2).sum()
    nj = data.train_sizes.double()
    cost = complexity * torch.sqrt(torch.tensor(sizes, dtype=torch.float64) / nj)
    return torch.stack([water_filling_bisection(d[i] + cost, nj, lam) for i in range(n)])
