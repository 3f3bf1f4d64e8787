"""Evaluation: personalized (each client's own model on that client's held-out split: :func:`evaluate`, what
``runner.run`` and the federated server score) and of stacked server models on a fixed pooled sample
(:func:`make_evaluator` over :func:`eval_batch`: the Charles et al. grids' training loss and test accuracy,
``experiments.charles_nn.run_grid``)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import vmap

from . import seeds
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


def eval_batch(data: FederatedDataset, split: str, samples: int, seed: int):
    """A fixed random sample of ``samples`` pooled examples of ``split`` (all when fewer)."""
    x, y = (data.x_train, data.y_train) if split == "train" else (data.x_test, data.y_test)
    g = torch.Generator().manual_seed(seeds.data_sample(seed))
    idx = torch.randperm(len(y), generator=g)[: min(samples, len(y))].to(x.device)
    return x[idx], y[idx]


def make_evaluator(model: FunctionalModel, batches: dict[str, tuple], chunk: int = 64):
    """Returns f(params [G, ..]) -> {metric: tensor [G]}: ``<split>_loss`` and ``<split>_accuracy``
    (accuracy over non-ignored targets; logits [B, C] or [B, V, T])."""
    def stats(params, x, y):
        logits = model.forward(params, x)
        loss = F.cross_entropy(logits, y)
        valid = y != -100
        acc = ((logits.argmax(1) == y) & valid).sum() / valid.sum()
        return loss, acc

    batched = vmap(stats, in_dims=(0, None, None))

    def evaluate(params: Params) -> dict[str, Tensor]:
        out = {}
        with torch.no_grad():
            for split, (x, y) in batches.items():
                parts = [batched(params, x[i:i + chunk], y[i:i + chunk]) for i in range(0, len(y), chunk)]
                w = torch.tensor([min(chunk, len(y) - i) for i in range(0, len(y), chunk)], dtype=torch.float32)
                out[f"{split}_loss"] = sum(p[0].cpu() * wi for p, wi in zip(parts, w)) / w.sum()
                out[f"{split}_accuracy"] = sum(p[1].cpu() * wi for p, wi in zip(parts, w)) / w.sum()
        return out

    return evaluate
