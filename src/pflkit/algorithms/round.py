"""The parts every federated round is composed of, written once:

    sample_clients -> client update (``engine.local_sgd``: :func:`local_round` for FedAvg's local
    models, :func:`client_update` for LocalUpdate's Theta-weighted output) -> aggregate -> server
    optimizer (``algorithms.server_opt``)

Partial training (sub-models of one server model, ``models.width``) is the same round with masks.

FedAvg, localized FedAvg, Per-FedAvg, pFedMe, partial-training FedAvg, PERM's warm-up,
LocalUpdate/MAML/FedProx/Reptile and the Charles et al. grid runner draw their clients and average
their clients' outputs here. A client update is a call
for a set of clients stacked as models; called for one client alone it gives that client's result
inside the batch (tested), which is the seam a federated engine calls.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..data.federated import FederatedDataset
from ..engine.local_sgd import local_sgd
from ..engine.params import Params, apply_masks, broadcast, mean

WEIGHTINGS = ("uniform", "samples")


def sample_clients(num_clients: int, clients_per_round: int | None, generator: torch.Generator) -> Tensor:
    """The round's participants: ``clients_per_round`` clients drawn without replacement, sorted
    (all of them, and no draw, when it is None or >= the number of clients)."""
    if clients_per_round is None or clients_per_round >= num_clients:
        return torch.arange(num_clients)
    return torch.randperm(num_clients, generator=generator)[:clients_per_round].sort().values


def client_weights(data: FederatedDataset, clients: Tensor, weighting: str) -> Tensor | None:
    """Aggregation weights of the participants: None (uniform, 1/M as PERM's Alg. 3) or their
    training-set sizes n_j (``'samples'``, McMahan et al.)."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    return data.train_sizes[clients].float() if weighting == "samples" else None


def local_round(model, w: Params, data: FederatedDataset, clients: Tensor, *, steps: int, lr: float | Tensor,
                batch_size: int | None, generator: torch.Generator, masks: Params | None = None) -> Params:
    """FedAvg's client side: broadcast w to ``clients`` (their sub-models m_j (.) w with ``masks``
    stacked [M, ..]), K (masked) SGD steps each; returns the local models stacked [M, ..]."""
    start = broadcast(w, len(clients))
    if masks is not None:
        start = apply_masks(start, masks)
    local, _ = local_sgd(model, start, data, clients, steps=steps, lr=lr, batch_size=batch_size,
                         generator=generator, masks=masks)
    return local


def aggregate(local: Params, weights: Tensor | None = None, radius: float | None = None, *,
              masks: Params | None = None, base: Params | None = None) -> Params:
    """The server's average of the participants' outputs (stacked [M, ..]), weights normalised; with
    ``radius`` the average is projected onto the l2 ball of that radius (PERM's Alg. 3).

    With ``masks`` (partial training: each output covers its sub-model only) every coordinate is
    averaged over the participants whose mask covers it, w_c = sum_j M_jc u_jc / sum_j M_jc, and a
    coordinate nobody covers keeps its value in ``base``."""
    if masks is not None:
        if weights is not None or radius is not None or base is None:
            raise ValueError("a masked aggregate takes base (the values of uncovered coordinates), "
                             "and no weights or radius")
        out = {}
        for k, p in base.items():
            count = masks[k].sum(0)
            out[k] = torch.where(count > 0, (local[k] * masks[k]).sum(0) / count.clamp_min(1), p)
        return out
    w = mean(local, weights)
    if radius is not None:
        norm = torch.sqrt(sum((v ** 2).sum() for v in w.values()))
        if norm > radius:
            w = {k: v * (radius / norm) for k, v in w.items()}
    return w


def client_update(model, start: Params, data: FederatedDataset, clients: Tensor, *, theta: Tensor,
                  gamma: float | Tensor, alpha: float, batch_size: int | None,
                  generator: torch.Generator) -> Params:
    """LocalUpdate's ClientUpdate (Charles & Konecny, Alg. 2) for models ``start`` stacked [M, ..] on
    ``clients`` [M]: K = len(theta) SGD steps with lr gamma on f_i(v) + alpha/2 |v - start|^2, returning
    sum_k theta_k g_k per model. ``gamma`` may be one value per model ([M])."""
    m = len(clients)
    _, _, q = local_sgd(model, start, data, clients, steps=len(theta), lr=gamma, batch_size=batch_size,
                        generator=generator, prox=alpha, anchor=start if alpha else None,
                        # [K, M] explicitly: a [K] vector is read as per-model when K == M
                        grad_weights=theta.float().unsqueeze(1).expand(len(theta), m))
    return q
