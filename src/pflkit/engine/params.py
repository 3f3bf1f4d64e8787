"""Stacked parameters: a dict name -> tensor whose leading dimension indexes models.

``Params`` with leading size N hold N models (one per client, or one per personalized model);
these helpers are the only vocabulary the algorithms need to move them around.
"""
from __future__ import annotations

from typing import Callable, Dict

import torch
from torch import Tensor, nn

Params = Dict[str, Tensor]


def init_params(factory: Callable[[], nn.Module], seed: int, device: str | torch.device = "cpu") -> Params:
    """Parameters of ``factory()`` initialised under ``seed`` (one model, no leading dim)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = factory()
    return {k: v.detach().to(device).clone() for k, v in module.named_parameters()}


def broadcast(params: Params, n: int) -> Params:
    """N independent copies of one model: [..] -> [n, ..]."""
    return {k: v.unsqueeze(0).expand(n, *v.shape).clone() for k, v in params.items()}


def mean(stacked: Params, weights: Tensor | None = None) -> Params:
    """(Weighted) average over the model dimension: [n, ..] -> [..]. Weights are normalised."""
    if weights is None:
        return {k: v.mean(0) for k, v in stacked.items()}
    w = weights.to(next(iter(stacked.values()))).flatten()
    w = w / w.sum()
    return {k: torch.tensordot(w, v, dims=1) for k, v in stacked.items()}


def take(stacked: Params, index: Tensor) -> Params:
    return {k: v[index] for k, v in stacked.items()}


def flatten(stacked: Params) -> Tensor:
    """[n, ..] per tensor -> [n, P] (one row per model)."""
    return torch.cat([v.reshape(v.shape[0], -1) for v in stacked.values()], dim=1)


def num_models(stacked: Params) -> int:
    return next(iter(stacked.values())).shape[0]


def apply_masks(params: Params, masks: Params) -> Params:
    """m (.) v for every tensor: a model's sub-model (0/1 masks, ``models.width``)."""
    return {k: p * masks[k] for k, p in params.items()}


def scale_like(scale: Tensor, like: Tensor) -> Tensor:
    """Reshape a per-model vector [n] to broadcast against a stacked tensor [n, ..]."""
    return scale.reshape(-1, *([1] * (like.dim() - 1)))


def is_finite(stacked: Params) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in stacked.values())
