"""A module template turned into pure functions of (stacked) parameters via torch.func."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from .params import Params


class FunctionalModel:
    """Wraps an ``nn.Module`` template (its own parameters are never trained).

    ``loss(params, x, y)`` is the mean cross-entropy of one model on one batch;
    ``batched_grad(params, x, y)`` is the same for N models at once: params [N, ..], x [N, B, ..],
    y [N, B] -> (grads [N, ..], losses [N]).
    """

    def __init__(self, factory: Callable[[], nn.Module], device: str | torch.device = "cpu"):
        self.factory = factory
        self.module = factory().to(device)
        self.module.eval()
        if list(self.module.buffers()):
            raise ValueError("models with buffers (e.g. BatchNorm) cannot be stacked; use GroupNorm")
        self.device = torch.device(device)
        self._batched_grad = vmap(grad_and_value(self.loss))
        self._batched_eval = vmap(self._masked_stats)
        self._batched_masked_grad = vmap(grad_and_value(self._masked_loss))

    def init(self, seed: int) -> Params:
        from .params import init_params
        return init_params(self.factory, seed, self.device)

    def forward(self, params: Params, x: Tensor) -> Tensor:
        return functional_call(self.module, params, (x,))

    def loss(self, params: Params, x: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(self.forward(params, x), y)

    def batched_grad(self, params: Params, x: Tensor, y: Tensor) -> tuple[Params, Tensor]:
        return self._batched_grad(params, x, y)

    # full-batch (padded + masked) losses: used for exact client gradients and evaluation
    def _masked_loss(self, params: Params, x: Tensor, y: Tensor, mask: Tensor) -> Tensor:
        per = F.cross_entropy(self.forward(params, x), y, reduction="none")
        m = mask.to(per.dtype)
        return (per * m).sum() / m.sum()

    def _masked_stats(self, params: Params, x: Tensor, y: Tensor, mask: Tensor):
        logits = self.forward(params, x)
        per = F.cross_entropy(logits, y, reduction="none")
        m = mask.to(per.dtype)
        correct = ((logits.argmax(-1) == y).to(per.dtype) * m).sum()
        return (per * m).sum(), correct

    def batched_full_grad(self, params: Params, x: Tensor, y: Tensor, mask: Tensor):
        """Exact gradient of each model's mean loss over its (padded) client data."""
        return self._batched_masked_grad(params, x, y, mask)

    def batched_stats(self, params: Params, x: Tensor, y: Tensor, mask: Tensor):
        """Per model: (sum of losses, number correct) over the masked samples."""
        with torch.no_grad():
            return self._batched_eval(params, x, y, mask)
