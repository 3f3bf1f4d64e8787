"""The algorithm protocol shared by every method.

An algorithm is a small object holding its hyperparameters and the model template:
``init(data, seed) -> state``, ``round(state) -> state`` (one communication round),
``personalized(state) -> Params`` (one model per client, stacked [N, ..], ready for evaluation).
States are plain dataclasses of tensors plus a CPU ``torch.Generator`` for all random draws.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from .. import seeds
from ..checks import check_positive
from ..data.federated import FederatedDataset
from ..engine.params import Params


class Algorithm(Protocol):
    name: str

    def init(self, data: FederatedDataset, seed: int): ...

    def round(self, state): ...

    def personalized(self, state) -> Params: ...


@dataclass
class BaseState:
    data: FederatedDataset
    generator: torch.Generator
    seed: int
    round: int


def eval_generator(state: BaseState) -> torch.Generator:
    """Draws for evaluation-time adaptation (fine-tuning), separate from the training stream so that
    evaluating never changes the training trajectory."""
    return torch.Generator().manual_seed(seeds.evaluation(state.seed, state.round))


def check_batch_size(value):
    """A positive integer, or None for full-batch (exact) local gradients."""
    return None if value is None else check_positive("batch_size", value, integer=True)
