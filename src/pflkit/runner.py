"""Run algorithms round by round and record a tidy history (round, method, seed, metric, value)."""
from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping

import pandas as pd
from tqdm import tqdm

from .data.federated import FederatedDataset
from .engine.params import is_finite
from .eval import evaluate, majority_baseline

HISTORY_COLUMNS = ["round", "method", "seed", "metric", "value"]


class DivergenceError(RuntimeError):
    """A run produced NaN/Inf parameters or loss."""


def _describe_lr(algorithm) -> str:
    parts = [f"{k}={getattr(algorithm, k)}" for k in ("lr", "personal_lr", "finetune_lr", "global_lr")
             if hasattr(algorithm, k)]
    return ", ".join(parts) or "n/a"


def run(algorithm, data: FederatedDataset, rounds: int, seed: int, eval_every: int = 1,
        method: str | None = None, progress: tqdm | None = None, keep: dict | None = None) -> pd.DataFrame:
    """Train ``algorithm`` for ``rounds`` communication rounds and evaluate its personalized models
    on every client's test split at round 0, every ``eval_every`` rounds and at the last round."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds!r}")
    if eval_every < 1:
        raise ValueError(f"eval_every must be >= 1, got {eval_every!r}")
    method = method or algorithm.name
    rows: list[tuple] = []
    state = algorithm.init(data, seed)

    def record(r: int):
        personal = algorithm.personalized(state)
        summary = evaluate(algorithm.model, personal, data).summary()
        bad = [k for k, v in summary.items() if not math.isfinite(v)]
        if bad or not is_finite(personal):
            raise DivergenceError(f"{method} diverged at round {r} (seed {seed}, {_describe_lr(algorithm)}): "
                                  f"non-finite {'parameters' if not bad else ', '.join(bad)}; "
                                  "lower the learning rate")
        rows.extend((r, method, seed, k, v) for k, v in summary.items())

    record(0)
    for r in range(1, rounds + 1):
        state = algorithm.round(state)
        if r % eval_every == 0 or r == rounds:
            record(r)
        if progress is not None:
            progress.update(1)
    if keep is not None:
        keep[(method, seed)] = state
    return pd.DataFrame(rows, columns=HISTORY_COLUMNS)


def run_methods(methods: Mapping[str, Callable[[], object]], data_for_seed: Callable[[int], FederatedDataset],
                seeds: Iterable[int], rounds: int, eval_every: int = 1, show_progress: bool = True,
                keep: dict | None = None) -> pd.DataFrame:
    """Every method x seed; ``methods`` maps a display name to a factory of the algorithm.
    With ``keep`` (a dict), the final state of every run is stored under (method, seed).

    Adds the per-client majority-class baseline as method "Majority class" (flat over rounds).
    """
    seeds = list(seeds)
    frames = []
    with tqdm(total=len(methods) * len(seeds) * rounds, desc="rounds", disable=not show_progress,
              leave=False) as bar:
        for seed in seeds:
            data = data_for_seed(seed)
            base = majority_baseline(data).summary()
            frames.append(pd.DataFrame(
                [(r, "Majority class", seed, k, base[k]) for r in (0, rounds)
                 for k in ("accuracy", "accuracy_weighted")], columns=HISTORY_COLUMNS))
            for name, make in methods.items():
                bar.set_description(f"{name} seed {seed}")
                frames.append(run(make(), data, rounds, seed, eval_every, method=name, progress=bar, keep=keep))
    return pd.concat(frames, ignore_index=True)


def final_table(history: pd.DataFrame, metrics: Iterable[str] = ("accuracy", "loss")) -> pd.DataFrame:
    """Mean and std over seeds at each method's last evaluated round: rows = methods."""
    last = history[history["round"] == history.groupby("method")["round"].transform("max")]
    last = last[last["metric"].isin(list(metrics))]
    table = last.pivot_table(index="method", columns="metric", values="value", aggfunc=["mean", "std"])
    table.columns = [f"{m}_{stat}" for stat, m in table.columns]
    return table[sorted(table.columns)]


def curves(history: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Wide table: one row per round, one column per method, mean over seeds (for `dvc plots`)."""
    sub = history[history["metric"] == metric]
    return sub.pivot_table(index="round", columns="method", values="value", aggfunc="mean").reset_index()
