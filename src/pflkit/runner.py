"""Run algorithms round by round and record a tidy history (round, method, seed, metric, value).

Long runs can checkpoint: with ``checkpoint=<file>`` (``run``) or ``checkpoint_dir`` (``run_methods``)
the run's state (algorithm state tensors, the CPU generator's state) and the history rows so far are
saved every ``checkpoint_every`` rounds (atomically, ``torch.save``) and read back with
``torch.load(weights_only=True)``. A re-run resumes from the last checkpoint and gives the same
history as an uninterrupted run; finished (method, seed) runs are not run again.

A checkpoint is resumed only if it was written by the same code for the same run: its fingerprint
covers the algorithm and its settings, the model, (method, seed, rounds, eval_every), the data and
``checkpoint_tag``, and the code: a SHA-256 of every ``.py`` file of the pflkit package
(:func:`source_digest`) and of the notebook twin that runs it (``$PFLKIT_TWIN_SHA256``, set by the
stage runner). A checkpoint written for other settings or by other code is ignored (and overwritten);
one that cannot be read, or whose tensors do not fit this run's state (shape, dtype, keys), is
reported as ``cannot use checkpoint <path>: <reason>`` and the run starts afresh. Every such message,
and every resume, goes to stderr and to the stage runner's terminal (:func:`pflkit.progress.note`).

Divergence (:func:`pflkit.divergence.run_rule`, the rule the federated server and the Charles grids apply too,
there with the grid's clauses; :class:`DivergenceError`, naming method, seed, round and learning rates): NaN/Inf
parameters or metrics at any evaluation; an evaluated loss above ``ABORT_MULTIPLE x diverge_factor``
times the initial loss at any evaluation, round 0 included (a blow-up: stopped at once); or a loss
still above ``diverge_factor`` times the initial loss at the last round (it grew and never came back).
The initial loss is the round-0 loss capped at the chance level log(C) (:func:`reference_loss`), so a
run already broken at round 0 is caught there. A loss that spikes between evaluations but ends below
``diverge_factor`` x its initial value is not divergence. The loss is the mean over clients of each
personalized model's test loss. The default
``DIVERGE_FACTOR`` (10) is far above what any curve stage shows at params.yaml or smoke scale (final
loss <= 1.02 x initial, peaks <= 1.5 x). The Charles NN grids (``experiments.charles_nn.run_grid``, on
:func:`run_rounds`) judge each setting with the grid's clauses (:func:`pflkit.divergence.grid_rule`: its training
loss above ``diverge_factor`` x its first at ``diverge_patience`` evaluations in a row): there a diverged setting
is dropped from a tuning grid, here it would stop a stage's reported run.
"""
from __future__ import annotations

import functools
import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import pandas as pd

from .checks import check_int, is_int
from .data.federated import FederatedDataset, data_digest
# the divergence rule, shared with the federated server; its names stay importable from here too
from .divergence import (ABORT_MULTIPLE, DIVERGE_FACTOR, DivergenceError, check_diverge_factor,  # noqa: F401
                         check_finite, check_loss_growth, reference_loss)
from .divergence import describe_lr as _describe_lr
from .engine.params import is_finite
from .eval import HISTORY_COLUMNS, evaluate, majority_baseline
from .io import CheckpointError, load_checkpoint, save_checkpoint, slug, state_from_payload, state_to_payload
from .progress import Timer, note, tqdm
from .progress import bar as progress_bar

#: the environment variable holding the SHA-256 of the stage's notebook twin (the pipeline's stage runner sets it:
#: :data:`pflkit.stage_env.TWIN_SHA256`), recorded in every checkpoint's identity
TWIN_ENV = "PFLKIT_TWIN_SHA256"

CHECKPOINT_FORMAT = 2  # 2: the fingerprint covers the code (package source + notebook twin)


def _say(message: str) -> None:
    """A message the user must see: stderr (the notebook's output) and the stage runner's terminal."""
    print(message, file=sys.stderr, flush=True)
    note(message)


# --------------------------------------------------------------------------- checkpoint identity
@functools.lru_cache(maxsize=None)
def source_digest() -> str:
    """SHA-256 over the pflkit package source: every ``.py`` file under the package folder, sorted by
    relative path, hashing path and bytes. Computed once per process."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for rel, path in sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*.py")):
        data = path.read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def code_identity() -> dict[str, str]:
    """The code a checkpoint was written by: the package source digest and the notebook twin's
    digest (``$PFLKIT_TWIN_SHA256``; empty outside a stage run)."""
    return {"source": source_digest(), "twin": os.environ.get(TWIN_ENV, "")}


def run_fingerprint(algorithm, method: str, seed: int, rounds: int, eval_every: int, tag: str) -> str:
    """What a checkpoint must match to be resumed: the algorithm class and its plain settings, the
    model architecture, the run's (method, seed, rounds, eval_every), ``tag`` (data digest, config)
    and the code (:func:`code_identity`: package source and notebook twin)."""
    settings = {k: v for k, v in sorted(vars(algorithm).items())
                if isinstance(v, (bool, int, float, str, type(None), tuple))}
    model = getattr(getattr(algorithm, "model", None), "module", None)
    code = code_identity()
    text = repr((type(algorithm).__qualname__, settings, repr(model), method, seed, rounds, eval_every, tag,
                 code["source"], code["twin"]))
    return hashlib.sha256(text.encode()).hexdigest()


def checkpoint_path(checkpoint_dir: str | Path, method: str, seed: int) -> Path:
    return Path(checkpoint_dir) / f"{slug(method, 'method')}__seed{seed}.pt"


def _stale_reason(saved, fingerprint: str) -> str | None:
    """Why a readable checkpoint is not this run's (None: it is)."""
    if not isinstance(saved, dict) or saved.get("format") != CHECKPOINT_FORMAT:
        found = saved.get("format") if isinstance(saved, dict) else None
        return f"written in checkpoint format {found!r} (this pflkit writes {CHECKPOINT_FORMAT})"
    code, now = saved.get("code"), code_identity()
    if not isinstance(code, dict) or code.get("source") != now["source"]:
        return "written by other code (the pflkit source has changed since)"
    if code.get("twin") != now["twin"]:
        return "written by other code (the notebook has changed since)"
    if saved.get("fingerprint") != fingerprint:
        return "written for other settings"
    return None


def _check_rows(rows, start: int, rounds: int) -> list[tuple]:
    if not is_int(start) or not 0 <= start <= rounds:
        raise CheckpointError(f"round: {start!r} is not a round of this run (0..{rounds})")
    if not isinstance(rows, list) or not all(isinstance(r, (list, tuple)) and len(r) == len(HISTORY_COLUMNS)
                                             for r in rows):
        raise CheckpointError(f"rows: not a list of {len(HISTORY_COLUMNS)}-item history rows")
    return [tuple(r) for r in rows]


def _load_resumable(path: Path | None, fingerprint: str, template, rounds: int):
    """(state, rows, round) from the checkpoint at ``path`` if it is this run's and fits ``template``
    (a fresh state); else None, after saying why the run starts afresh."""
    if path is None or not path.exists():
        return None
    try:
        saved = load_checkpoint(path)
    except CheckpointError as exc:
        _say(f"cannot use checkpoint {path}: unreadable ({exc.reason}); starting this run afresh")
        return None
    stale = _stale_reason(saved, fingerprint)
    if stale is not None:
        _say(f"ignoring checkpoint {path}: {stale}; starting this run afresh")
        return None
    try:
        start = saved.get("round")
        rows = _check_rows(saved.get("rows"), start, rounds)
        state = state_from_payload(template, saved.get("state"))
        if getattr(state, "round", start) != start:
            raise CheckpointError(f"the state is at round {state.round}, the checkpoint says round {start}")
    except CheckpointError as exc:
        _say(f"cannot use checkpoint {path}: {exc.reason}; starting this run afresh")
        return None
    return state, rows, start


def _loss_at(rows: list[tuple], r: int) -> float | None:
    for row in rows:
        if row[0] == r and row[3] == "loss":
            return float(row[4])
    return None


# --------------------------------------------------------------------------- running
#: ``callback(round, state) -> {metric: value} | None``, called by :func:`run` at every evaluation
Callback = Callable[[int, object], "Mapping[str, float] | None"]


class RoundTimer:
    """A :func:`run` callback: wall seconds per round since the previous evaluation, as the metric
    ``seconds_per_round`` (0 rounds at round 0: not reported). Timing is not deterministic: keep it
    out of results that are compared exactly."""

    def __init__(self):
        self._last: tuple[int, float] | None = None

    def __call__(self, r: int, state) -> dict[str, float] | None:
        now = time.perf_counter()
        last, self._last = self._last, (r, now)
        if last is None or r <= last[0]:
            return None
        return {"seconds_per_round": (now - last[1]) / (r - last[0])}


def _check_run_arguments(rounds: int, eval_every: int, checkpoint_every: int, diverge_factor: float) -> None:
    """:func:`run`'s numbers, refused by name before any work."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds!r}")
    if eval_every < 1:
        raise ValueError(f"eval_every must be >= 1, got {eval_every!r}")
    check_int("checkpoint_every", checkpoint_every, 1)
    check_diverge_factor(diverge_factor)


def run_rounds(algorithm, state, rounds: int, eval_every: int, record: Callable[[int, object], bool | None],
               after_round: Callable[[int, object], None] | None = None, start: int = 0):
    """The one run loop: ``record(0, state)`` (the round-0 evaluation; skipped when resuming at round ``start``
    > 0), then for each round r = start + 1 .. ``rounds``: ``state = algorithm.round(state)``, ``record(r,
    state)`` at every ``eval_every``-th round and the last, then ``after_round(r, state)``. A ``record`` that
    returns False ends the run there (nothing left to train: every setting of a grid diverged). Returns the
    last state."""
    if start == 0 and record(0, state) is False:
        return state
    for r in range(start + 1, rounds + 1):
        state = algorithm.round(state)
        go_on = record(r, state) if r % eval_every == 0 or r == rounds else True
        if after_round is not None:
            after_round(r, state)
        if go_on is False:
            break
    return state


def run(algorithm, data: FederatedDataset, rounds: int, seed: int, eval_every: int = 1,
        method: str | None = None, progress: tqdm | None = None, keep: dict | None = None,
        checkpoint: str | Path | None = None, checkpoint_every: int = 5,
        checkpoint_tag: str | None = None, diverge_factor: float = DIVERGE_FACTOR,
        callbacks: Sequence[Callback] = ()) -> pd.DataFrame:
    """Train ``algorithm`` for ``rounds`` communication rounds and evaluate its personalized models
    on every client's test split at round 0, every ``eval_every`` rounds and at the last round.

    ``callbacks``: called at every evaluation as ``callback(round, state)`` after the built-in
    metrics; a returned mapping {metric: value} adds those rows to the history (extra metrics, timing:
    see :class:`RoundTimer`), None adds nothing. So nobody copies this loop to measure something.

    With ``checkpoint`` (a file path), the state and history are saved there every
    ``checkpoint_every`` rounds and at the end, and a matching checkpoint is resumed from.
    ``checkpoint_tag`` is part of the match (default: a digest of ``data``).
    NaN/Inf loss or parameters, a loss above ``ABORT_MULTIPLE * diverge_factor`` x the round-0 loss
    at any evaluation, or above ``diverge_factor`` x it at the last round, raise
    :class:`DivergenceError` naming method, seed, round and lr."""
    _check_run_arguments(rounds, eval_every, checkpoint_every, diverge_factor)
    method = method or algorithm.name
    rows: list[tuple] = []
    state = algorithm.init(data, seed)
    start = 0
    initial: list[float | None] = [None]  # the round-0 loss
    path = fingerprint = None
    if checkpoint is not None:
        path = Path(checkpoint)
        tag = data_digest(data) if checkpoint_tag is None else checkpoint_tag
        fingerprint = run_fingerprint(algorithm, method, seed, rounds, eval_every, tag)
        resumed = _load_resumable(path, fingerprint, state, rounds)
        if resumed is not None:
            state, rows, start = resumed
            initial[0] = reference_loss(_loss_at(rows, 0), data.num_classes)
            _say(f"resuming {method} seed {seed} from round {start} of {rounds} ({path})")
            if progress is not None:
                progress.update(start)

    lr = _describe_lr(algorithm)

    def record(r: int, state) -> None:
        personal = algorithm.personalized(state)
        summary = evaluate(algorithm.model, personal, data).summary()
        check_finite(method, seed, r, summary, is_finite(personal), lr)
        rows.extend((r, method, seed, k, float(v)) for k, v in summary.items())
        for callback in callbacks:
            extra = callback(r, state)
            rows.extend((r, method, seed, str(k), float(v)) for k, v in (extra or {}).items())
        if r == 0:
            initial[0] = reference_loss(summary.get("loss"), data.num_classes)
        check_loss_growth(method, seed, r, summary.get("loss"), initial[0], diverge_factor, lr, final=False)

    def after_round(r: int, state) -> None:
        if path is not None and (r % checkpoint_every == 0 or r == rounds):
            save_checkpoint(path, {"format": CHECKPOINT_FORMAT, "fingerprint": fingerprint, "code": code_identity(),
                                   "method": method, "seed": seed, "round": r, "rounds": rounds,
                                   "rows": list(rows), "state": state_to_payload(state)})
        if progress is not None:
            progress.update(1)

    state = run_rounds(algorithm, state, rounds, eval_every, record, after_round, start)
    last = max(row[0] for row in rows)  # the last round evaluated (also for a finished run read back)
    check_loss_growth(method, seed, last, _loss_at(rows, last), initial[0], diverge_factor, lr, final=True)
    if keep is not None:
        keep[(method, seed)] = state
    return pd.DataFrame(rows, columns=HISTORY_COLUMNS)


def run_methods(methods: Mapping[str, Callable[[], object]], data_for_seed: Callable[[int], FederatedDataset],
                seeds: Iterable[int], rounds: int, eval_every: int = 1, show_progress: bool = True,
                keep: dict | None = None, checkpoint_dir: str | Path | None = None,
                checkpoint_every: int = 5, checkpoint_tag: str = "",
                keep_checkpoints: bool = False, diverge_factor: float = DIVERGE_FACTOR,
                callbacks: Callable[[], Sequence[Callback]] | None = None) -> pd.DataFrame:
    """Every method x seed; ``methods`` maps a display name to a factory of the algorithm.
    ``callbacks`` (a factory: fresh callbacks for each run) is passed on to :func:`run`.
    With ``keep`` (a dict), the final state of every run is stored under (method, seed).

    With ``checkpoint_dir``, each (method, seed) run checkpoints to ``<dir>/<method>__seed<s>.pt``
    every ``checkpoint_every`` rounds and resumes from there when called again (a killed stage picks
    up where it stopped; finished runs are read back, not re-run). ``checkpoint_tag`` (e.g. the
    stage config as JSON) must match too. The files are deleted once every run has finished, unless
    ``keep_checkpoints``.

    A run that diverges (see :func:`run`; ``diverge_factor`` is passed on) raises
    :class:`DivergenceError` and stops the rest.

    Adds the per-client majority-class baseline as method "Majority class" (flat over rounds).
    """
    seeds = list(seeds)
    frames = []
    used: list[Path] = []
    runs, done, clock = len(methods) * len(seeds), 0, Timer()
    with progress_bar(len(methods) * len(seeds) * rounds, "rounds", disable=not show_progress) as bar:
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
                one = Timer()
                frames.append(run(make(), data, rounds, seed, eval_every, method=name, progress=bar, keep=keep,
                                  checkpoint=path, checkpoint_every=checkpoint_every, checkpoint_tag=tag,
                                  diverge_factor=diverge_factor, callbacks=callbacks() if callbacks else ()))
                done += 1
                final = frames[-1][(frames[-1]["round"] == rounds) & (frames[-1]["metric"] == "accuracy")]["value"]
                note(f"{name} seed {seed} done in {one} ({done}/{runs} runs, {clock} elapsed)"
                     + (f": accuracy {final.iloc[0]:.3f}" if len(final) else ""))
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
