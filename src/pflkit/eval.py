"""Personalized evaluation: each client's own model on that client's held-out split."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .data.federated import FederatedDataset
from .engine.full_batch import over_buckets, rows_per_call
from .engine.functional import FunctionalModel
from .engine.params import Params, num_models

#: a run's history, whichever engine ran it (``runner.run``, the federated server): one row per evaluated round,
#: method, seed and metric (a key of :meth:`ClientMetrics.summary`)
HISTORY_COLUMNS = ["round", "method", "seed", "metric", "value"]

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
             chunk: int = 256, budget: int | None = None) -> ClientMetrics:
    """Model i is scored on client i's ``split`` data; params are stacked [N, ..].

    Runs over the real rows only: masked batched calls per size bucket (``engine.full_batch.over_buckets``),
    at most ``chunk`` models and ``rows_per_call(model, data, budget)`` rows per call."""
    n_models = num_models(params)
    if n_models != data.num_clients:
        raise ValueError(f"evaluate needs one model per client: got {n_models} models for "
                         f"{data.num_clients} clients")
    loss_sum, correct = over_buckets(model.batched_stats, params, data, split, chunk=chunk,
                                     rows=rows_per_call(model, data, budget))
    n = data._split(split)[3].double()
    return ClientMetrics(accuracy=(correct.double().cpu() / n), loss=(loss_sum.double().cpu() / n), n=n.long())


def majority_baseline(data: FederatedDataset, split: str = "test") -> ClientMetrics:
    """Each client always predicts its most frequent *training* label (ties: smallest label)."""
    majority = data.label_counts("train").argmax(1)
    _, y, _, n = data._split(split)
    owner = torch.repeat_interleave(torch.arange(data.num_clients), n)
    hit = (y.cpu() == majority[owner]).double()
    hits = torch.zeros(data.num_clients, dtype=torch.float64).index_add_(0, owner, hit)
    return ClientMetrics(accuracy=hits / n.double(), loss=torch.full((data.num_clients,), float("nan"),
                         dtype=torch.float64), n=n.long())
