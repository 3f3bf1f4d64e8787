"""Personalized evaluation: each client's own model on that client's held-out split."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .data.federated import FederatedDataset
from .engine.functional import FunctionalModel
from .engine.params import Params, num_models, take


@dataclass
class ClientMetrics:
    """Per-client results, all [N] CPU tensors."""
    accuracy: Tensor
    loss: Tensor
    n: Tensor

    def summary(self) -> dict[str, float]:
        """Unweighted mean over clients and the sample-weighted mean (pooled over samples)."""
        w = self.n.double() / self.n.sum()
        return {
            "accuracy": float(self.accuracy.double().mean()),
            "accuracy_weighted": float((self.accuracy.double() * w).sum()),
            "loss": float(self.loss.double().mean()),
            "loss_weighted": float((self.loss.double() * w).sum()),
        }


def evaluate(model: FunctionalModel, params: Params, data: FederatedDataset, split: str = "test",
             chunk: int = 256) -> ClientMetrics:
    """Model i is scored on client i's ``split`` data; params are stacked [N, ..]."""
    n_models = num_models(params)
    if n_models != data.num_clients:
        raise ValueError(f"evaluate needs one model per client: got {n_models} models for "
                         f"{data.num_clients} clients")
    x, y, mask = data.padded(split)
    loss_sum, correct = [], []
    for a in range(0, n_models, chunk):
        sl = torch.arange(a, min(a + chunk, n_models), device=x.device)
        ls, cs = model.batched_stats(take(params, sl), x[sl], y[sl], mask[sl])
        loss_sum.append(ls)
        correct.append(cs)
    n = mask.sum(1).double().cpu()
    return ClientMetrics(accuracy=(torch.cat(correct).double().cpu() / n),
                         loss=(torch.cat(loss_sum).double().cpu() / n), n=n.long())


def majority_baseline(data: FederatedDataset, split: str = "test") -> ClientMetrics:
    """Each client always predicts its most frequent *training* label (ties: smallest label)."""
    majority = data.label_counts("train").argmax(1)
    _, y, mask = data.padded(split)
    hit = (y.cpu() == majority.unsqueeze(1)) & mask.cpu()
    n = mask.sum(1).cpu()
    return ClientMetrics(accuracy=hit.sum(1).double() / n, loss=torch.full((data.num_clients,), float("nan"),
                         dtype=torch.float64), n=n.long())
