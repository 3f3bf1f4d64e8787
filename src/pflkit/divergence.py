"""The divergence rule: when a run, or one setting of a grid, has diverged, judged at each of its evaluations.
Every engine applies it: the in-process runner (``runner.run``), the federated server
(``flower.server.FederatedServer``) and the Charles et al. grids (``experiments.charles_nn.run_grid``), so a
deployment with no in-process twin stops where the batched run would.

:class:`DivergenceRule` holds the rule's clauses; at an evaluation a run diverged when

- its scores or its parameters are not finite (at once);
- its watched loss is above ``blow_up x factor`` times the reference (a blow-up, at once; ``blow_up`` None: off);
- its watched loss is above ``factor`` times the reference at ``patience`` evaluations in a row (None: off);
- at its last evaluation (``at_end``), its watched loss is still above ``factor`` times the reference.

The reference is the first evaluation's loss, capped at the chance level log(C) where the engine gives the
number of classes C (:func:`reference_loss`). A runner's run (:data:`RUN_RULE`'s clauses: blow-up, at the end)
raises :class:`DivergenceError` naming method, seed, round and learning rates; a grid (patience, no blow-up
clause, nothing at the end) drops the setting and records :meth:`DivergenceRule.judge`'s reason.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .checks import is_int, is_real

DIVERGE_FACTOR = 10.0  # default: final loss > 10 x the round-0 loss is divergence
ABORT_MULTIPLE = 100.0  # a loss above ABORT_MULTIPLE x diverge_factor x initial stops the run at once


class DivergenceError(RuntimeError):
    """A run produced NaN/Inf parameters or loss, or a loss that grew past its limits (see the module
    docstring)."""


def check_diverge_factor(diverge_factor) -> float:
    """``diverge_factor`` if it is a number > 1 (inf: no loss-growth check), else a ValueError naming it."""
    if not is_real(diverge_factor) or not diverge_factor > 1:
        raise ValueError(f"diverge_factor must be a number > 1 (inf: no loss-growth check), got {diverge_factor!r}")
    return diverge_factor


@dataclass(frozen=True)
class DivergenceRule:
    """The rule's clauses (module docstring): ``factor`` (> 1; inf: no loss-growth clause fires), ``patience``
    (evaluations in a row above ``factor`` x reference that diverge; None: that clause is off), ``blow_up``
    (a loss above ``blow_up`` x ``factor`` x reference diverges at once; None: off), ``at_end`` (the last
    evaluation above ``factor`` x reference diverges) and ``metric``, the watched loss's name in reasons."""
    factor: float = DIVERGE_FACTOR
    patience: int | None = None
    blow_up: float | None = ABORT_MULTIPLE
    at_end: bool = True
    metric: str = "loss"

    def __post_init__(self):
        check_diverge_factor(self.factor)
        if self.patience is not None and (not is_int(self.patience) or self.patience < 1):
            raise ValueError(f"diverge_patience must be a positive int or None (no such clause), got {self.patience!r}")
        if self.blow_up is not None and not (is_real(self.blow_up) and self.blow_up >= 1):
            raise ValueError(f"blow_up must be a number >= 1 or None (no such clause), got {self.blow_up!r}")

    def judge(self, loss: float | None, reference: float | None, streak: int = 0, final: bool = False,
              non_finite: str | None = None) -> tuple[int, str | None]:
        """One evaluation: (the evaluations in a row whose ``loss`` is above ``factor`` x ``reference``, this one
        included after ``streak`` before it; why the run diverged here, or None). ``non_finite``: None when the
        scores and parameters are finite, else what is not (``""``: unnamed). ``final``: the run's last
        evaluation. No loss or no usable reference (None, not finite, <= 0): no loss-growth clause applies."""
        usable = loss is not None and reference is not None and math.isfinite(reference) and reference > 0
        above = usable and loss > self.factor * reference
        streak = streak + 1 if above else 0
        if non_finite is not None:
            return streak, f"non-finite {non_finite}".rstrip()
        if not usable:
            return streak, None
        if self.blow_up is not None and loss > self.blow_up * self.factor * reference:
            return streak, self._growth(loss, reference, self.blow_up * self.factor, "")
        if self.patience is not None and streak >= self.patience:
            return streak, self._growth(loss, reference, self.factor, f" at {self.patience} evaluations in a row"
                                        if self.patience > 1 else "")
        if final and self.at_end and above:
            return streak, self._growth(loss, reference, self.factor, " at the last round")
        return streak, None

    def _growth(self, loss: float, reference: float, limit: float, when: str) -> str:
        return f"{self.metric} {loss:.3g} > {limit:g} x initial {reference:.3g}{when}"


def run_rule(factor: float = DIVERGE_FACTOR) -> DivergenceRule:
    """A run's rule (``runner.run``, the federated server): blow-up at ``ABORT_MULTIPLE x factor`` at once,
    above ``factor`` at the last evaluation; a spike in between that comes back down is not divergence."""
    return DivergenceRule(factor, patience=None, blow_up=ABORT_MULTIPLE, at_end=True)


def grid_rule(factor: float, patience: int, metric: str) -> DivergenceRule:
    """A grid setting's rule (``experiments.charles_nn.run_grid``): above ``factor`` x its first ``metric`` at
    ``patience`` evaluations in a row (1: at the first), no blow-up clause, nothing more at the last round."""
    return DivergenceRule(factor, patience=patience, blow_up=None, at_end=False, metric=metric)


def describe_lr(algorithm) -> str:
    """The algorithm's learning rates as a divergence message names them (``lr=0.1, personal_lr=...``)."""
    parts = [f"{k}={getattr(algorithm, k)}" for k in ("lr", "personal_lr", "finetune_lr", "global_lr")
             if hasattr(algorithm, k)]
    return ", ".join(parts) or "n/a"


def reference_loss(round0: float | None, num_classes: int | None) -> float | None:
    """What a run's loss is compared with: its round-0 loss, but never more than the chance-level loss
    log(C) of C classes (a uniform prediction; ``num_classes`` None: no cap). The cap is what a run broken from
    its first evaluation cannot move: methods that personalize before they are evaluated (pFedMe's inner
    problem, Per-FedAvg's step, localized FedAvg's fine-tuning) already take steps at round 0, so with a huge
    learning rate their round-0 loss is itself huge, and a rule relative to it alone would let the run finish."""
    if num_classes is None or num_classes < 2:
        return round0
    chance = math.log(num_classes)
    return chance if round0 is None or not math.isfinite(round0) else min(round0, chance)


def non_finite_scores(summary: Mapping[str, float], parameters_finite: bool) -> str | None:
    """What of an evaluation is not finite, as :meth:`DivergenceRule.judge` names it: its non-finite scores'
    names, else ``"parameters"`` if they are not finite, else None."""
    bad = [k for k, v in summary.items() if not math.isfinite(v)]
    return ", ".join(bad) if bad else None if parameters_finite else "parameters"


def diverged(method: str, seed: int, r: int, lr: str, reason: str) -> DivergenceError:
    """The error a run raises for the ``reason`` :meth:`DivergenceRule.judge` gave at round ``r``."""
    return DivergenceError(f"{method} diverged at round {r} (seed {seed}, {lr}): {reason}; lower the learning rate")


def check_finite(method: str, seed: int, r: int, summary: Mapping[str, float], parameters_finite: bool,
                 lr: str) -> None:
    """Raise :class:`DivergenceError` if an evaluation's ``summary`` holds a non-finite value or its parameters
    are not finite (``parameters_finite`` False): the rule's first clause."""
    what = non_finite_scores(summary, parameters_finite)
    if what is not None:
        raise diverged(method, seed, r, lr, run_rule().judge(None, None, non_finite=what)[1])


def check_loss_growth(method: str, seed: int, r: int, loss: float | None, initial: float | None,
                      factor: float, lr: str, final: bool) -> None:
    """Raise :class:`DivergenceError` if ``loss`` at round ``r`` grew too far from ``initial`` under
    :func:`run_rule` (``factor``): above ``ABORT_MULTIPLE * factor`` x initial at any round, above ``factor`` x
    initial at the ``final`` round. Nothing to compare (no loss, or initial <= 0): no check."""
    _, reason = run_rule(factor).judge(loss, initial, final=final)
    if reason is not None:
        raise diverged(method, seed, r, lr, reason)
