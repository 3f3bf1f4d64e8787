"""One round, one loop (issue 53): partial-training FedAvg and PERM's warm-up are configurations of the one round
(``FederatedRound``), every server update is ``ServerOpt``'s, and only the one round, PERM, the vectorised grid and
Local write a round body."""
import ast
from pathlib import Path

import pytest
import torch

import pflkit.algorithms as algorithms_package
from pflkit.algorithms import (PERM, FedAvg, PartialFedAvg, PERMHetero)
from pflkit.algorithms.fedavg import FederatedRound
from pflkit.data import FederatedDataset, perm_synthetic
from pflkit.engine import FunctionalModel
from pflkit.models.width import mlp_spec


ALGORITHMS = Path(algorithms_package.__file__).parent
SPEC = mlp_spec((6,), 3, hidden=(8, 6))  # the `mixed` fixture: 5 clients, 6 features, 3 classes
SYN_SPEC = mlp_spec((5,), 2, hidden=(7,))  # perm_synthetic(6, 40, 5): 6 clients, 5 features, 2 classes


def _syn():
    return perm_synthetic(6, 40, 5, seed=0)


def _equal(a, b) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def rows(monkeypatch):
    """Every minibatch draw of the run, in order (``FederatedDataset.sample_indices``' results)."""
    drawn, original = [], FederatedDataset.sample_indices

    def recorded(self, clients, batch_size, generator):
        idx = original(self, clients, batch_size, generator)
        drawn.append(idx.clone())
        return idx

    monkeypatch.setattr(FederatedDataset, "sample_indices", recorded)
    return drawn


# --------------------------------------------------------------------------- partial training = the one round
@pytest.mark.parametrize("extraction", ["static", "rolling", "random"])
@pytest.mark.parametrize("batch_size", [4, None])
@pytest.mark.parametrize("stacked", [False, "dense"])
def test_partial_fedavg_at_full_width_is_fedavg_draw_for_draw(mixed, rows, extraction, batch_size, stacked):
    """Every fraction 1.0: the same minibatch rows in the same order as FedAvg and the same server model after
    every round, exactly (the masked average over all clients is FedAvg's mean bit for bit) when both take the
    one-step-at-a-time path (``stacked=False``). On a dense stacked network FedAvg's plain minibatch steps run
    all K at once (``FunctionalModel.sgd_steps``) while masked steps go one at a time: there the models agree
    to float rounding (measured: at most 9e-8 after 4 rounds; the draws stay identical)."""
    model = FunctionalModel(SPEC.factory(), stacked=stacked)
    kw = dict(local_steps=3, lr=0.2, batch_size=batch_size)
    fedavg = FedAvg(model, **kw)
    partial = PartialFedAvg(model, SPEC, fractions=[1.0] * mixed.num_clients, extraction=extraction, **kw)
    s, t = fedavg.init(mixed, 4), partial.init(mixed, 4)
    assert _equal(s.w, t.w)
    exact = stacked is False or batch_size is None
    for _ in range(4):
        s = fedavg.round(s)
        fedavg_rows = list(rows)
        rows.clear()
        before = t.w
        t = partial.round(t)
        assert len(rows) == len(fedavg_rows) == (0 if batch_size is None else 1)
        assert all(torch.equal(a, b) for a, b in zip(rows, fedavg_rows))
        rows.clear()
        if exact:
            assert _equal(t.w, s.w)
        else:
            for k in s.w:
                torch.testing.assert_close(t.w[k], s.w[k], atol=1e-6, rtol=1e-6)
        assert not _equal(t.w, before)  # it trained
    assert torch.equal(s.generator.get_state(), t.generator.get_state())


# --------------------------------------------------------------------------- PERM's warm-up = FedAvg rounds
@pytest.mark.parametrize("rounds", [1, 3])
@pytest.mark.parametrize("batch_size, alpha_samples", [(5, None), (None, None), (5, 8)])
def test_perm_warmup_is_that_many_fedavg_rounds(rounds, batch_size, alpha_samples):
    """PERM's k warm-up rounds leave the global model of k FedAvg rounds (the same lr, K, batch and seed),
    exactly: the warm-up is the one round, drawing what FedAvg draws."""
    data = _syn()
    model = FunctionalModel(SYN_SPEC.factory())
    perm = PERM(model, local_steps=2, lr=0.7, warmup_lr=0.15, batch_size=batch_size, lam=10.0, global_lr=0.3,
                warmup_rounds=rounds, alpha_init="estimate", alpha_samples=alpha_samples, update_every=2)
    fedavg = FedAvg(model, local_steps=2, lr=0.15, batch_size=batch_size)
    s, t = perm.init(data, 2), fedavg.init(data, 2)
    for r in range(rounds):
        s, t = perm.round(s), fedavg.round(t)
        assert _equal(s.w, t.w), f"warm-up round {r + 1}"
        assert (s.v is None) == (r + 1 < rounds)  # personalization starts after the last warm-up round
    assert s.alpha is not None and not _equal(t.w, perm.init(data, 2).w)


def test_perm_warmup_rounds_are_the_one_round(monkeypatch):
    """PERM's and PERM-hetero's warm-up rounds run ``FederatedRound.round_passes`` (no FedAvg body of their own),
    once per warm-up round and never after."""
    calls = []
    original = FederatedRound.round_passes

    def counted(self, s):
        calls.append(type(self).__name__)
        return (yield from original(self, s))

    monkeypatch.setattr(FederatedRound, "round_passes", counted)
    data = _syn()
    model = FunctionalModel(SYN_SPEC.factory())
    kw = dict(local_steps=2, lr=0.1, batch_size=5, lam=10.0, global_lr=0.3, warmup_rounds=2, update_every=2)
    for algorithm in (PERM(model, **kw), PERMHetero(model, SYN_SPEC, fractions=[1.0, 0.5] * 3, **kw)):
        calls.clear()
        s = algorithm.init(data, 0)
        for _ in range(5):
            s = algorithm.round(s)
        assert calls == ["WarmupRound"] * 2


@pytest.mark.parametrize("extraction", ["static", "rolling", "random"])
def test_perm_hetero_warmup_is_that_many_partial_fedavg_rounds(extraction):
    """PERM-hetero's warm-up is partial training: the one round with its masks, PartialFedAvg's rounds exactly."""
    data = _syn()
    model = FunctionalModel(SYN_SPEC.factory())
    fractions = [1.0, 0.5, 0.25, 1.0, 0.5, 0.75]
    hetero = PERMHetero(model, SYN_SPEC, fractions=fractions, extraction=extraction, local_steps=2, lr=0.7,
                        warmup_lr=0.15, batch_size=5, lam=10.0, global_lr=0.3, warmup_rounds=3, update_every=2)
    partial = PartialFedAvg(model, SYN_SPEC, fractions=fractions, extraction=extraction, local_steps=2, lr=0.15,
                            batch_size=5)
    s, t = hetero.init(data, 1), partial.init(data, 1)
    for r in range(3):
        s, t = hetero.round(s), partial.round(t)
        assert _equal(s.w, t.w), f"warm-up round {r + 1}"


# --------------------------------------------------------------------------- structure
#: the round bodies of src/pflkit/algorithms: the one round, PERM's, the vectorised grid's and Local's (no server)
ROUND_BODIES = {("fedavg.py", "FederatedRound"), ("fedavg.py", "Local"), ("perm.py", "PERM"),
                ("local_update.py", "LocalUpdateGrid")}


def round_bodies(folder: Path) -> set[tuple[str, str]]:
    """(file, class) of every class in ``folder``'s modules that defines ``round_passes``."""
    found = set()
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == "round_passes"
                    for f in node.body):
                found.add((path.name, node.name))
    return found


def test_only_the_one_round_perm_the_grid_and_local_define_round_passes():
    assert round_bodies(ALGORITHMS) == ROUND_BODIES


def test_the_round_body_scan_finds_a_second_body(tmp_path):
    """The scan above sees a class that writes its own round (here PartialFedAvg's old body)."""
    (tmp_path / "partial.py").write_text("class PartialFedAvg(Base):\n    def round_passes(self, s):\n"
                                         "        yield None\n")
    assert round_bodies(tmp_path) == {("partial.py", "PartialFedAvg")}
