"""Run algorithms round by round and record a tidy history (round, method, seed, metric, value).

Long runs can checkpoint: with ``checkpoint=<file>`` (``run``) or ``checkpoint_dir`` (``run_methods``)
the run's state (algorithm state tensors, the CPU generator's state) and the history rows so far are
saved every ``checkpoint_every`` rounds (atomically, ``torch.save``) and read back with
``torch.load(weights_only=True)``. A re-run resumes from the last checkpoint and gives the same
history as an uninterrupted run; finished (method, seed) runs are not run again. A checkpoint written
for other settings (hyperparameters, rounds, data, ``checkpoint_tag``) is ignored and overwritten.
"""
from __future__ import annotations

import hashlib
import math
import re
import sys
from pathlib import Path
from typing import Callable, Iterable, Mapping

import pandas as pd
from tqdm import tqdm

from .data.federated import FederatedDataset
from .engine.params import is_finite
from .eval import evaluate, majority_baseline
from .io import CheckpointError, load_checkpoint, save_checkpoint, state_from_payload, state_to_payload

HISTORY_COLUMNS = ["round", "method", "seed", "metric", "value"]
CHECKPOINT_FORMAT = 1


class DivergenceError(RuntimeError):
    """A run produced NaN/Inf parameters or loss."""


def _describe_lr(algorithm) -> str:
    parts = [f"{k}={getattr(algorithm, k)}" for k in ("lr", "personal_lr", "finetune_lr", "global_lr")
             if hasattr(algorithm, k)]
    return ", ".join(parts) or "n/a"


# --------------------------------------------------------------------------- checkpoint identity
def data_digest(data: FederatedDataset) -> str:
    """SHA-256 over the dataset's tensors (features, labels, client offsets): same data, same digest."""
    h = hashlib.sha256()
    for t in (data.x_train, data.y_train, data.train_sizes, data.x_test, data.y_test, data.test_sizes):
        h.update(str((tuple(t.shape), t.dtype)).encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def run_fingerprint(algorithm, method: str, seed: int, rounds: int, eval_every: int, tag: str) -> str:
    """What a checkpoint must match to be resumed: the algorithm class and its plain settings, the
    model architecture, the run's (method, seed, rounds, eval_every) and ``tag`` (data digest, config)."""
    settings = {k: v for k, v in sorted(vars(algorithm).items())
                if isinstance(v, (bool, int, float, str, type(None), tuple))}
    model = getattr(getattr(algorithm, "model", None), "module", None)
    text = repr((type(algorithm).__qualname__, settings, repr(model), method, seed, rounds, eval_every, tag))
    return hashlib.sha256(text.encode()).hexdigest()


def checkpoint_path(checkpoint_dir: str | Path, method: str, seed: int) -> Path:
    slug = re.sub(r"[^A-Za-z0-9]+", "_", method).strip("_") or "method"
    return Path(checkpoint_dir) / f"{slug}__seed{seed}.pt"


def _load_resumable(path: Path | None, fingerprint: str) -> dict | None:
    if path is None or not path.exists():
        return None
    try:
        saved = load_checkpoint(path)
    except CheckpointError as exc:
        print(f"ignoring unreadable checkpoint ({exc})", file=sys.stderr)
        return None
    if not isinstance(saved, dict) or saved.get("format") != CHECKPOINT_FORMAT \
            or saved.get("fingerprint") != fingerprint:
        print(f"ignoring checkpoint {path}: written for other settings; starting this run afresh",
              file=sys.stderr)
        return None
    return saved


# --------------------------------------------------------------------------- running
def run(algorithm, data: FederatedDataset, rounds: int, seed: int, eval_every: int = 1,
        method: str | None = None, progress: tqdm | None = None, keep: dict | None = None,
        checkpoint: str | Path | None = None, checkpoint_every: int = 5,
        checkpoint_tag: str | None = None) -> pd.DataFrame:
    """Train ``algorithm`` for ``rounds`` communication rounds and evaluate its personalized models
    on every client's test split at round 0, every ``eval_every`` rounds and at the last round.

    With ``checkpoint`` (a file path), the state and history are saved there every
    ``checkpoint_every`` rounds and at the end, and a matching checkpoint is resumed from.
    ``checkpoint_tag`` is part of the match (default: a digest of ``data``).
    NaN/Inf loss or parameters raise :class:`DivergenceError` naming method, round and lr."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds!r}")
    if eval_every < 1:
        raise ValueError(f"eval_every must be >= 1, got {eval_every!r}")
    if not isinstance(checkpoint_every, int) or isinstance(checkpoint_every, bool) or checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be an integer >= 1, got {checkpoint_every!r}")
    method = method or algorithm.name
    rows: list[tuple] = []
    state = algorithm.init(data, seed)
    start = 0
    path = fingerprint = None
    if checkpoint is not None:
        path = Path(checkpoint)
        tag = data_digest(data) if checkpoint_tag is None else checkpoint_tag
        fingerprint = run_fingerprint(algorithm, method, seed, rounds, eval_every, tag)
        saved = _load_resumable(path, fingerprint)
        if saved is not None:
            state = state_from_payload(state, saved["state"])
            rows = [tuple(r) for r in saved["rows"]]
            start = int(saved["round"])
            print(f"resuming {method} seed {seed} from round {start} of {rounds} ({path})", file=sys.stderr)
            if progress is not None:
                progress.update(start)

    def record(r: int):
        personal = algorithm.personalized(state)
        summary = evaluate(algorithm.model, personal, data).summary()
        bad = [k for k, v in summary.items() if not math.isfinite(v)]
        if bad or not is_finite(personal):
            raise DivergenceError(f"{method} diverged at round {r} (seed {seed}, {_describe_lr(algorithm)}): "
                                  f"non-finite {'parameters' if not bad else ', '.join(bad)}; "
                                  "lower the learning rate")
        rows.extend((r, method, seed, k, float(v)) for k, v in summary.items())

    def save(r: int):
        save_checkpoint(path, {"format": CHECKPOINT_FORMAT, "fingerprint": fingerprint, "method": method,
                               "seed": seed, "round": r, "rounds": rounds, "rows": list(rows),
                               "state": state_to_payload(state)})

    if start == 0:
        record(0)
    for r in range(start + 1, rounds + 1):
        state = algorithm.round(state)
        if r % eval_every == 0 or r == rounds:
            record(r)
        if path is not None and (r % checkpoint_every == 0 or r == rounds):
            save(r)
        if progress is not None:
            progress.update(1)
    if keep is not None:
        keep[(method, seed)] = state
    return pd.DataFrame(rows, columns=HISTORY_COLUMNS)


def run_methods(methods: Mapping[str, Callable[[], object]], data_for_seed: Callable[[int], FederatedDataset],
                seeds: Iterable[int], rounds: int, eval_every: int = 1, show_progress: bool = True,
                keep: dict | None = None, checkpoint_dir: str | Path | None = None,
                checkpoint_every: int = 5, checkpoint_tag: str = "",
                keep_checkpoints: bool = False) -> pd.DataFrame:
    """Every method x seed; ``methods`` maps a display name to a factory of the algorithm.
    With ``keep`` (a dict), the final state of every run is stored under (method, seed).

    With ``checkpoint_dir``, each (method, seed) run checkpoints to ``<dir>/<method>__seed<s>.pt``
    every ``checkpoint_every`` rounds and resumes from there when called again (a killed stage picks
    up where it stopped; finished runs are read back, not re-run). ``checkpoint_tag`` (e.g. the
    stage config as JSON) must match too. The files are deleted once every run has finished, unless
    ``keep_checkpoints``.

    Adds the per-client majority-class baseline as method "Majority class" (flat over rounds).
    """
    seeds = list(seeds)
    frames = []
    used: list[Path] = []
    with tqdm(total=len(methods) * len(seeds) * rounds, desc="rounds", disable=not show_progress,
              leave=False) as bar:
        for seed in seeds:
            data = data_for_seed(seed)
            base = majority_baseline(data).summary()
            frames.append(pd.DataFrame(
                [(r, "Majority class", seed, k, base[k]) for r in (0, rounds)
                 for k in ("accuracy", "accuracy_weighted")], columns=HISTORY_COLUMNS))
            tag = None if checkpoint_dir is None else f"{checkpoint_tag}|{data_digest(data)}"
            for name, make in methods.items():
                bar.set_description(f"{name} seed {seed}")
                path = None if checkpoint_dir is None else checkpoint_path(checkpoint_dir, name, seed)
                if path is not None:
                    used.append(path)
                frames.append(run(make(), data, rounds, seed, eval_every, method=name, progress=bar, keep=keep,
                                  checkpoint=path, checkpoint_every=checkpoint_every, checkpoint_tag=tag))
    if checkpoint_dir is not None and not keep_checkpoints:
        for path in used:
            path.unlink(missing_ok=True)
            for stale in path.parent.glob(f".{path.name}.*.tmp*"):  # a write cut short by a kill
                stale.unlink(missing_ok=True)
        try:
            Path(checkpoint_dir).rmdir()  # only if empty
        except OSError:
            pass
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
