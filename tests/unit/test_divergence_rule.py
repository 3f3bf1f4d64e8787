"""The one divergence rule (pflkit.divergence.DivergenceRule) and the one run loop (runner.run_rounds): every
engine that decides a run diverged -- the in-process runner, the federated server, the Charles et al. grids --
asks the rule, and the runner and the grids run on the same loop. The two engines' clauses keep each one's
verdicts: a run (run_rule) stops at a blow-up and fails when it ends above the factor; a grid setting
(grid_rule) is dropped at ``patience`` evaluations in a row above the factor."""
import math

import pytest

from pflkit import divergence, runner
from pflkit.algorithms import FedAvg
from pflkit.data import perm_synthetic
from pflkit.divergence import DivergenceError, DivergenceRule, grid_rule, run_rule
from pflkit.engine import FunctionalModel
from pflkit.experiments import charles_nn as E
from pflkit.flower.loopback import run_loopback
from pflkit.flower.spec import RunSpec
from pflkit.models import logistic

from test_local_update import tiny_data, tiny_model  # the same tiny problem (tests/unit is on sys.path)

NAN = float("nan")


def _first_verdict(rule: DivergenceRule, losses: list[float], reference: float):
    """(evaluation, reason) of the first evaluation the rule judges diverged (the last one is ``final``), else
    None; a non-finite loss stands for non-finite scores (named "loss" by a run's rule, unnamed by a grid's)."""
    streak = 0
    for i, loss in enumerate(losses):
        bad = None if math.isfinite(loss) else ("loss" if rule.at_end else "")
        streak, reason = rule.judge(loss, reference, streak, final=i == len(losses) - 1, non_finite=bad)
        if reason is not None:
            return i, reason
    return None


@pytest.mark.parametrize("rule, losses, reference, verdict", [
    # a run's rule (runner.run, the federated server): factor 10, blow-up at 100 x 10
    (run_rule(10.0), [0.5, 4.0, 6.0, 0.6], 0.5, None),  # a spike (12 x) that comes back
    (run_rule(10.0), [0.5, 0.6, 5.5], 0.5, (2, "loss 5.5 > 10 x initial 0.5 at the last round")),
    (run_rule(10.0), [0.5, 600.0, 0.5], 0.5, (1, "loss 600 > 1000 x initial 0.5")),
    (run_rule(10.0), [0.5, 501.0], 0.5, (1, "loss 501 > 1000 x initial 0.5")),  # the blow-up before the end
    (run_rule(10.0), [0.5, NAN], 0.5, (1, "non-finite loss")),
    (run_rule(math.inf), [0.5, 1e30], 0.5, None),  # inf: no loss-growth clause
    (run_rule(10.0), [0.5, 1e30], 0.0, None),  # no usable reference
    # a grid setting's rule (run_grid): factor 5, no blow-up clause, nothing at the end
    (grid_rule(5.0, 1, "train_loss"), [1.0, 10.0], 1.0, (1, "train_loss 10 > 5 x initial 1")),
    (grid_rule(5.0, 1, "train_loss"), [1.0, 600.0], 1.0, (1, "train_loss 600 > 5 x initial 1")),
    (grid_rule(5.0, 3, "test_loss"), [1.0, 10.0, 1.0, 10.0, 10.0, 10.0, 1.0], 1.0,
     (5, "test_loss 10 > 5 x initial 1 at 3 evaluations in a row")),
    (grid_rule(5.0, 3, "train_loss"), [1.0, 1.0, 10.0, 600.0], 1.0, None),  # ends above, but only 2 in a row
    (grid_rule(5.0, 3, "train_loss"), [1.0, NAN], 1.0, (1, "non-finite")),  # never waits
])
def test_the_rule_judges_each_evaluation(rule, losses, reference, verdict):
    assert _first_verdict(rule, losses, reference) == verdict


@pytest.mark.parametrize("kwargs, match", [
    (dict(factor=1.0), "diverge_factor must be a number > 1"),
    (dict(factor="10"), "diverge_factor must be a number > 1"),
    (dict(patience=0), "diverge_patience must be a positive int or None"),
    (dict(patience=2.0), "diverge_patience must be a positive int or None"),
    (dict(blow_up=0.5), "blow_up must be a number >= 1 or None"),
])
def test_a_bad_rule_is_refused_naming_the_parameter(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DivergenceRule(**kwargs)


def _runner():
    data = perm_synthetic(5, 30, 4, 0.3, seed=2)
    runner.run(FedAvg(FunctionalModel(lambda: logistic((4,), 2)), local_steps=2, lr=0.1, batch_size=4), data, 3, 0)


def _federated():
    alg = FedAvg(FunctionalModel(lambda: logistic((4,), 2)), local_steps=2, lr=0.1, batch_size=4)
    run_loopback(RunSpec.for_algorithm(alg, model={"name": "logistic"}, data={"name": "perm_synthetic", "kwargs": dict(
        num_clients=5, samples_per_client=30, dim=4, test_fraction=0.3, seed=2)}, seed=0, rounds=3, eval_every=1))


def _grid():
    data, model = tiny_data(num_clients=4), tiny_model()
    run = E.run_grid(model, data, [E.Setting(0.05, 0.1), E.Setting(0.1, 0.2)], rounds=3, local_steps=2, batch_size=2,
                     clients_per_round=2, seed=0, evaluate=E.make_evaluator(model, {"train": E.eval_batch(
                         data, "train", 50, 0)}))
    if len(run.diverged):
        raise DivergenceError("; ".join(run.diverged["reason"]))


@pytest.mark.parametrize("engine", [_runner, _federated, _grid])
def test_every_engine_asks_the_one_rule(monkeypatch, engine):
    """A rule that judges every loss diverged ("probe") stops each engine at round 0; the engines run healthy
    otherwise."""
    engine()
    monkeypatch.setattr(DivergenceRule, "judge", lambda self, loss, reference, streak=0, final=False,
                        non_finite=None: (streak, None if loss is None else "probe"))
    with pytest.raises(DivergenceError, match=r"(round 0 .*: )?probe"):
        engine()


@pytest.mark.parametrize("engine, rounds, eval_every", [(_runner, 3, 1), (_grid, 3, 1)])
def test_the_runner_and_the_grids_run_on_the_one_loop(monkeypatch, engine, rounds, eval_every):
    calls = []
    loop = runner.run_rounds
    monkeypatch.setattr(runner, "run_rounds", lambda *a, **kw: calls.append(a[2:4]) or loop(*a, **kw))
    engine()
    assert calls == [(rounds, eval_every)]


class _Counter:
    """An 'algorithm' whose state is the number of rounds run."""

    def round(self, s):
        return s + 1


@pytest.mark.parametrize("rounds, eval_every, start, stop_at, evaluated, after", [
    (5, 2, 0, None, [0, 2, 4, 5], [1, 2, 3, 4, 5]),  # round 0, every 2nd and the last
    (5, 2, 3, None, [4, 5], [4, 5]),  # resumed after round 3: no round-0 evaluation
    (5, 1, 0, 2, [0, 1, 2], [1, 2]),  # the record at round 2 says nothing is left: the run ends there
    (5, 1, 0, 0, [0], []),  # nothing left at round 0: no round runs
    (4, 4, 4, None, [], []),  # a finished run read back
])
def test_the_run_loop_evaluates_at_round_0_every_eval_every_and_the_last(rounds, eval_every, start, stop_at,
                                                                        evaluated, after):
    seen, stepped = [], []

    def record(r, s):
        assert s == r
        seen.append(r)
        return r != stop_at

    final = runner.run_rounds(_Counter(), start, rounds, eval_every, record, lambda r, s: stepped.append(r), start)
    assert (seen, stepped) == (evaluated, after)
    assert final == (stop_at if stop_at is not None else rounds)


def test_the_divergence_module_is_the_only_place_a_verdict_is_made():
    """No engine compares a loss with a multiple of its initial value itself (issue 53: one rule in src)."""
    import inspect
    from pflkit.flower import server
    for module in (runner, E, server):
        source = inspect.getsource(module)
        assert "diverge_factor *" not in source and "* first" not in source, module.__name__
    assert "factor * reference" in inspect.getsource(divergence)
