"""Reference twins of the robust aggregators (``algorithms.round.robust_mean``): one coordinate at a time, in
plain Python, as Flower's FedMedian (``numpy.median``) and FedTrimmedAvg (``trim_mean``) define them."""
from __future__ import annotations

import torch


def _coordinates(values: list[torch.Tensor]):
    """Each coordinate's values over the participants, as lists of Python floats, and the output's shape."""
    flat = [v.reshape(-1).tolist() for v in values]
    return [sorted(column) for column in zip(*flat)], values[0].shape


def median(values: list[torch.Tensor]) -> torch.Tensor:
    """The middle value of every coordinate (the mean of the two middle ones for an even count)."""
    columns, shape = _coordinates(values)
    m = len(values)
    out = [c[m // 2] if m % 2 else (c[m // 2 - 1] + c[m // 2]) / 2 for c in columns]
    return torch.tensor(out, dtype=torch.float64).reshape(shape)


def trimmed_mean(values: list[torch.Tensor], fraction: float) -> torch.Tensor:
    """Every coordinate's mean after dropping ``int(fraction * m)`` of its smallest and as many largest values."""
    columns, shape = _coordinates(values)
    cut = int(fraction * len(values))
    out = [sum(c[cut:len(c) - cut]) / (len(c) - 2 * cut) for c in columns]
    return torch.tensor(out, dtype=torch.float64).reshape(shape)


def combine(aggregator: str, fraction: float = 0.2):
    """The twin of ``aggregate(..., aggregator=aggregator)`` over a list of per-client model dicts."""
    def apply(models: list[dict]) -> dict:
        one = median if aggregator == "median" else (lambda vs: trimmed_mean(vs, fraction))
        return {k: one([m[k] for m in models]).to(models[0][k].dtype) for k in models[0]}
    return apply
