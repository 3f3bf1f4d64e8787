"""pFedMe: batched vs reference loop, the inner prox solve, server mixing, personalization gain."""
from dataclasses import replace

import pytest
import torch

from pflkit.algorithms.pfedme import PFedMe
from pflkit.data.draws import ClientDraws
from pflkit.data import perm_synthetic
from pflkit.engine import FunctionalModel
from pflkit.engine.params import broadcast
from pflkit.eval import evaluate
from pflkit.io import state_from_payload, state_to_payload
from pflkit.models import logistic, mlp

from reference import pfedme as ref
from reference.perfedavg import gradient

FACTORIES = {"logistic": lambda: logistic((6,), 3), "mlp": lambda: mlp((6,), 3, hidden=(8,))}
HP = dict(lr=0.05, personal_lr=0.05, lam=3.0, local_steps=3, inner_steps=4, batch_size=4)


def _close(a, b, tol=1e-5):
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=tol, rtol=tol)


def _clone(gen: torch.Generator) -> torch.Generator:
    g = torch.Generator()
    g.set_state(gen.get_state())
    return g


@pytest.mark.parametrize("arch", ["logistic", "mlp"])
@pytest.mark.parametrize("beta, per_round, weighting", [(1.0, None, "uniform"), (2.0, 3, "samples")])
def test_pfedme_equals_reference(mixed, arch, beta, per_round, weighting):
    factory = FACTORIES[arch]
    algo = PFedMe(FunctionalModel(factory), beta=beta, clients_per_round=per_round, weighting=weighting, **HP)
    s = algo.init(mixed, seed=3)
    w0 = s.w
    for _ in range(3):
        s = algo.round(s)
    want = ref.pfedme(factory, w0, mixed, rounds=3, seed=3, beta=beta, clients_per_round=per_round,
                      weighting=weighting, **HP)[-1]
    _close(s.w, want)
    assert max(float((s.w[k] - w0[k]).abs().max()) for k in w0) > 1e-2  # training moved the model
    personal = algo.personalized(s)
    want_p = ref.personalize(factory, s.w, mixed, generator=_clone(s.generator), clients_per_round=per_round,
                             **HP)
    for j in range(mixed.num_clients):
        _close({k: v[j] for k, v in personal.items()}, want_p[j])


def test_inner_solve_reaches_the_prox_point(mixed):
    """With R = 1 the K inner steps are gradient descent on h(theta) = f_i(theta; D) + lam/2 |theta - w|^2
    (w_local = w during them): after many small steps grad h(theta) must vanish, far from w. (Logistic
    model: h is smooth and strongly convex; a ReLU net's prox point can sit on a kink where no
    gradient vanishes.)"""
    factory = FACTORIES["logistic"]
    model = FunctionalModel(factory)
    lam = 2.0
    algo = PFedMe(model, lr=0.1, personal_lr=0.05, lam=lam, local_steps=1, inner_steps=600, batch_size=6)
    w = model.init(0)
    n = mixed.num_clients
    gen = torch.Generator().manual_seed(1)
    idx = mixed.sample_indices(torch.arange(n).unsqueeze(0), 6, _clone(gen))[0]
    local, theta = algo.client_updates(w, mixed, torch.arange(n), gen)
    for j in range(n):
        th = {k: v[j] for k, v in theta.items()}
        g = gradient(factory, th, mixed.x_train[idx[j]], mixed.y_train[idx[j]])
        grad_h = torch.cat([(g[k] + lam * (th[k] - w[k])).flatten() for k in w])
        moved = torch.cat([(th[k] - w[k]).flatten() for k in w])
        assert float(grad_h.norm()) < 1e-5, (j, float(grad_h.norm()))
        assert float(moved.norm()) > 1e-2
        # and the local model took its step towards that prox point: w_local = w - lr lam (w - theta)
        _close({k: v[j] for k, v in local.items()}, {k: w[k] - 0.1 * lam * (w[k] - th[k]) for k in w})


@pytest.mark.parametrize("beta", [1.0, 2.0, 0.5])
def test_server_mixes_the_local_models(mixed, beta):
    """w <- (1 - beta) w + beta mean_i w_local_i; beta = 1 is the plain average, bit for bit."""
    model = FunctionalModel(FACTORIES["logistic"])
    algo = PFedMe(model, beta=beta, **HP)
    s = algo.init(mixed, seed=0)
    local, _ = algo.client_updates(s.w, mixed, torch.arange(mixed.num_clients), _clone(s.generator))
    avg = {k: v.mean(0) for k, v in local.items()}
    new = algo.round(s)
    if beta == 1.0:
        for k in avg:
            assert torch.equal(new.w[k], avg[k])
    else:
        _close(new.w, {k: (1 - beta) * s.w[k] + beta * avg[k] for k in avg}, tol=1e-6)
        assert max(float((new.w[k] - avg[k]).abs().max()) for k in avg) > 1e-3


def test_personalization_beats_the_global_model():
    """Two groups label the same inputs oppositely (mu = 0): the global model stays near chance, each
    client's theta (its prox point around w) fits its own group."""
    model = FunctionalModel(lambda: logistic((20,), 2))
    algo = PFedMe(model, lr=0.05, personal_lr=0.05, lam=2.0, local_steps=10, inner_steps=5, batch_size=20)
    gains = []
    for seed in (0, 1):
        data = perm_synthetic(10, 150, 20, seed=seed, mu=0.0)
        s = algo.init(data, seed)
        for _ in range(10):
            s = algo.round(s)
        glob = evaluate(model, broadcast(s.w, data.num_clients), data).summary()["accuracy"]
        pers = evaluate(model, algo.personalized(s), data).summary()["accuracy"]
        assert glob < 0.6, (seed, glob)
        gains.append(pers - glob)
    assert min(gains) > 0.12, gains


@pytest.mark.parametrize("per_round", [3, None])
def test_same_seed_same_states_and_evaluation_leaves_training_alone(mixed, per_round):
    """Bit for bit; with every client taking part (None) the rounds after an evaluation reuse its local rounds."""
    algo = PFedMe(FunctionalModel(FACTORIES["mlp"]), beta=2.0, clients_per_round=per_round, **HP)
    a, b = algo.init(mixed, 7), algo.init(mixed, 7)
    a = algo.round(a)
    _close(algo.personalized(a), algo.personalized(a), tol=0)
    a, b = algo.round(a), algo.round(algo.round(b))  # b never evaluated
    _close(a.w, b.w, tol=0)
    _close(algo.personalized(a), algo.personalized(b), tol=0)
    c = algo.round(algo.round(algo.init(mixed, 8)))
    assert not torch.equal(c.w["3.weight"], a.w["3.weight"])


@pytest.mark.parametrize("kwargs, match", [
    (dict(lr=0.0), "lr must be a number > 0, got 0.0"),
    (dict(personal_lr=-1), "personal_lr must be a number > 0, got -1"),
    (dict(lam=0), "lam must be a number > 0, got 0"),
    (dict(inner_steps=0), "inner_steps must be an integer > 0, got 0"),
    (dict(inner_steps=2.0), "inner_steps must be an integer > 0, got 2.0"),
    (dict(local_steps=-3), "local_steps must be an integer > 0, got -3"),
    (dict(batch_size=None), "batch_size must be an integer > 0"),
    (dict(beta=0.0), "beta must be a number > 0, got 0.0"),
    (dict(clients_per_round=2.5), r"clients_per_round must be an integer > 0, got 2.5"),
    (dict(weighting="max"), "weighting must be"),
])
def test_bad_hyperparameters_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PFedMe(FunctionalModel(FACTORIES["logistic"]), **{**HP, **kwargs})


@pytest.mark.parametrize("arch", ["logistic", "mlp"])
def test_evaluation_and_the_next_round_run_one_local_round(mixed, arch, monkeypatch):
    """The personalized models are the thetas of the next round's local round (from the current global model,
    with that round's draws); the round reuses the evaluation's instead of running it again: the same numbers
    as computing it again (bit for bit: a second, fresh instance computes everything), and with an
    evaluation after every round the run takes rounds + 1 local rounds, not 2 x rounds + 1."""
    factory = FACTORIES[arch]
    runs = _count_local_rounds(monkeypatch)
    algo = PFedMe(FunctionalModel(factory), beta=2.0, **HP)
    s = algo.init(mixed, seed=5)
    personal = [algo.personalized(s)]
    for _ in range(3):
        s = algo.round(s)
        personal.append(algo.personalized(s))
    assert len(runs) == 3 + 1
    fresh = PFedMe(FunctionalModel(factory), beta=2.0, **HP)  # never evaluated: every round computes its own
    t = fresh.init(mixed, seed=5)
    for r in range(3):  # every client takes part: the round draws its pass key and nothing before it
        draws = ClientDraws.drawn_from(_clone(t.generator))
        _, theta = PFedMe(FunctionalModel(factory), beta=2.0, **HP).client_updates(
            t.w, mixed, torch.arange(mixed.num_clients), draws)
        _close(personal[r], theta, tol=0)
        t = fresh.round(t)
    _close(s.w, t.w, tol=0)
    # 3 of the 5 clients a round: the evaluation's local rounds (all 5 clients) are not the round's, nothing is kept
    runs.clear()
    algo = PFedMe(FunctionalModel(factory), beta=2.0, clients_per_round=3, **HP)
    s = algo.init(mixed, seed=5)
    algo.personalized(s)
    for _ in range(3):
        s = algo.round(s)
        algo.personalized(s)
    assert len(runs) == 2 * 3 + 1 and s.ahead is None


def _count_local_rounds(monkeypatch) -> list:
    """Every pFedMe local round computed from now on (``PFedMe.client_updates``) appends to the returned list."""
    runs = []
    original = PFedMe.client_updates
    monkeypatch.setattr(PFedMe, "client_updates", lambda self, *a: runs.append(1) or original(self, *a))
    return runs


# a script of steps on two runs a and b of ONE algorithm object: e = evaluate, r = round, m = touch the global
# model in place (the same values, a new version), c = a copy of the state with a copy of w (the same values)
KEPT_ROUND_SCRIPTS = [
    # (clients per round, script, local rounds computed)
    (None, "ea ra ea ra", 2),  # each round reuses the evaluation before it
    (None, "ra ra", 2),  # nothing evaluated, nothing kept
    (None, "ea ea ra", 1),  # a second evaluation of the same state and the round reuse the first's local round
    (None, "ea eb ra rb", 2),  # each run's kept round is its own (held in its state, not on the algorithm)
    (None, "ea ma ra", 2),  # w changed in place since: computed again
    (None, "ea ca ra", 2),  # another state (dataclasses.replace) starts without the kept round
    (3, "ea ra ea ra", 4),  # not every client takes part: the evaluation's local rounds are not the round's
]


@pytest.mark.parametrize("per_round, script, computed", KEPT_ROUND_SCRIPTS)
def test_the_evaluations_local_round_is_kept_in_the_state_for_the_next_round(mixed, monkeypatch, per_round, script,
                                                                            computed):
    """The kept local round lives in the run's state (``PFedMeState.ahead``): it serves only the next round of that
    state, from the same unmodified global model and draws, and the run's numbers are the same bit for bit as a
    run never evaluated; a checkpoint of the state leaves it out (and resumes to the same numbers)."""
    model = FunctionalModel(FACTORIES["mlp"])
    algo = PFedMe(model, beta=2.0, clients_per_round=per_round, **HP)
    states = {"a": algo.init(mixed, 5), "b": algo.init(mixed, 6)}
    runs = _count_local_rounds(monkeypatch)
    for op, run in script.split():
        s = states[run]
        if op == "e":
            algo.personalized(s)
        elif op == "r":
            states[run] = algo.round(s)
            assert states[run].ahead is None
        elif op == "m":
            with torch.no_grad():
                for t in s.w.values():
                    t.mul_(1.0)
        else:
            states[run] = replace(s, w={k: v.clone() for k, v in s.w.items()})
    assert len(runs) == computed
    monkeypatch.undo()
    fresh = PFedMe(model, beta=2.0, clients_per_round=per_round, **HP)
    for run, seed in (("a", 5), ("b", 6)):
        t = fresh.init(mixed, seed)
        for _ in range(script.count("r" + run)):
            t = fresh.round(t)
        _close(states[run].w, t.w, tol=0)
    s = states["a"]
    algo.personalized(s)
    payload = state_to_payload(s)
    assert "ahead" not in payload["fields"]
    back = state_from_payload(algo.init(mixed, 5), payload)
    assert back.ahead is None
    _close(algo.round(back).w, algo.round(s).w, tol=0)
