"""The divergence rule every engine applies to a run's evaluations: the in-process runner (``runner.run``) and
the federated server (``flower.server.FederatedServer``), so a deployment with no in-process twin stops where
the batched run would.

A run diverged (:class:`DivergenceError`, naming method, seed, round and learning rates) when, at an evaluation,
its personalized scores or its parameters are not finite; when its evaluated loss is above ``ABORT_MULTIPLE x
diverge_factor`` times the initial loss (a blow-up: stopped at once, round 0 included); or when the loss at
the last evaluated round is still above ``diverge_factor`` times the initial loss. The initial loss is the
round-0 loss capped at the chance level log(C) (:func:`reference_loss`).
"""
from __future__ import annotations

import math
from collections.abc import Mapping

DIVERGE_FACTOR = 10.0  # default: final loss > 10 x the round-0 loss is divergence
ABORT_MULTIPLE = 100.0  # a loss above ABORT_MULTIPLE x diverge_factor x initial stops the run at once


class DivergenceError(RuntimeError):
    """A run produced NaN/Inf parameters or loss, or a loss that grew past its limits (see the module
    docstring)."""


def check_diverge_factor(diverge_factor) -> float:
    """``diverge_factor`` if it is a number > 1 (inf: no loss-growth check), else a ValueError naming it."""
    if isinstance(diverge_factor, bool) or not isinstance(diverge_factor, (int, float)) \
            or not diverge_factor > 1:
        raise ValueError(f"diverge_factor must be a number > 1 (inf: no loss-growth check), got {diverge_factor!r}")
    return diverge_factor


def describe_lr(algorithm) -> str:
    """The algorithm's learning rates as a divergence message names them (``lr=0.1, personal_lr=...``)."""
    parts = [f"{k}={getattr(algorithm, k)}" for k in ("lr", "personal_lr", "finetune_lr", "global_lr")
             if hasattr(algorithm, k)]
    return ", ".join(parts) or "n/a"


def reference_loss(round0: float | None, num_classes: int | None) -> float | None:
    """What a run's loss is compared with: its round-0 loss, but never more than the chance-level loss
    log(C) of C classes (a uniform prediction). The cap is what a run broken from its first evaluation
    cannot move: methods that personalize before they are evaluated (pFedMe's inner problem, Per-FedAvg's
    step, localized FedAvg's fine-tuning) already take steps at round 0, so with a huge learning rate their
    round-0 loss is itself huge, and a rule relative to it alone would let the run finish."""
    if num_classes is None or num_classes < 2:
        return round0
    chance = math.log(num_classes)
    return chance if round0 is None or not math.isfinite(round0) else min(round0, chance)


def check_finite(method: str, seed: int, r: int, summary: Mapping[str, float], parameters_finite: bool,
                 lr: str) -> None:
    """Raise :class:`DivergenceError` if an evaluation's ``summary`` holds a non-finite value or its parameters
    are not finite (``parameters_finite`` False)."""
    bad = [k for k, v in summary.items() if not math.isfinite(v)]
    if bad or not parameters_finite:
        raise DivergenceError(f"{method} diverged at round {r} (seed {seed}, {lr}): "
                              f"non-finite {'parameters' if not bad else ', '.join(bad)}; "
                              "lower the learning rate")


def check_loss_growth(method: str, seed: int, r: int, loss: float | None, initial: float | None,
                      factor: float, lr: str, final: bool) -> None:
    """Raise :class:`DivergenceError` if ``loss`` at round ``r`` grew too far from ``initial`` (the
    round-0 loss): above ``ABORT_MULTIPLE * factor`` x initial at any round, above ``factor`` x
    initial at the ``final`` round. Nothing to compare (no loss, or initial <= 0): no check."""
    if loss is None or initial is None or not math.isfinite(initial) or initial <= 0:
        return
    limit = factor if final else ABORT_MULTIPLE * factor
    if loss > limit * initial:
        raise DivergenceError(
            f"{method} diverged at round {r} (seed {seed}, {lr}): loss {loss:.3g} > {limit:g} x initial "
            f"{initial:.3g}" + (" at the last round" if final else "") + "; lower the learning rate")
