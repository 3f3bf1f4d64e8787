"""One round, one loop (issue 53): partial-training FedAvg and PERM's warm-up are configurations of the one round
(``FederatedRound``), every server update is ``ServerOpt``'s, and only the one round, PERM, the vectorised grid and
Local write a round body."""
import ast
import importlib
import inspect
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import pflkit.algorithms as algorithms_package
from pflkit.algorithms import (MAML, PERM, Ditto, FedAvg, LocalizedFedAvg, LocalUpdate, PartialFedAvg, PerFedAvg,
                               PERMHetero, PFedMe, ServerOpt)
from pflkit.algorithms.fedavg import FederatedRound
from pflkit.algorithms.local_update import LocalUpdateGrid
from pflkit.algorithms.round import PassRound
from pflkit.data import FederatedDataset, perm_synthetic
from pflkit.engine import FunctionalModel
from pflkit.models.width import mlp_spec

from reference.fedavg import _module_with

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


# --------------------------------------------------------------------------- PERM's global step = ServerOpt
def _perm(server_opt=None, **kw):
    model = FunctionalModel(SYN_SPEC.factory())
    settings = dict(local_steps=2, lr=0.1, batch_size=5, lam=10.0, global_lr=0.4, global_steps=2, update_every=1)
    return PERM(model, **(settings | kw), server_opt=server_opt)


def test_perm_gd_global_step_is_w_minus_gamma_times_the_mean_gradient():
    """ServerOpt('gd', global_lr), PERM's default, gives the hand-written step exactly: w - gamma * (the clients'
    mean exact gradient the last alpha update kept at w)."""
    perm = _perm(global_steps=1, update_every=2, alpha_init="estimate")
    assert perm.server_opt == ServerOpt("gd", 0.4)
    s = perm.round(perm.init(_syn(), 0))  # the update is due after the next round; w has not moved yet
    assert s.grad_mean is not None
    t = perm.round(s)
    for k in s.w:
        assert torch.equal(t.w[k], s.w[k] - 0.4 * s.grad_mean[k])


def _mean_client_gradient(w: dict, data) -> dict:
    """(1/N) sum_j grad f_j(w), f_j the mean cross entropy on client j's training rows: one client at a time."""
    module = _module_with(SYN_SPEC.factory(), w)
    total = None
    for j in range(data.num_clients):
        x, y = data.client(j, "train")
        g = torch.autograd.grad(F.cross_entropy(module(x), y), list(module.parameters()))
        total = g if total is None else [a + b for a, b in zip(total, g)]
    return {name: t / data.num_clients for (name, _), t in zip(module.named_parameters(), total)}


@pytest.mark.parametrize("server_opt, make_optimizer", [
    (ServerOpt("heavy_ball", 0.4, momentum=0.6), lambda p: torch.optim.SGD(p, lr=0.4, momentum=0.6)),
    (ServerOpt("nesterov", 0.4, momentum=0.6), lambda p: torch.optim.SGD(p, lr=0.4, momentum=0.6, nesterov=True)),
    (ServerOpt("adam", 0.4), lambda p: torch.optim.Adam(p, lr=0.4)),
])
def test_perm_with_a_server_optimizer_equals_its_torch_optim_twin(server_opt, make_optimizer):
    """PERM's global model with server momentum (or Adam) is torch.optim's on the clients' mean exact gradient,
    step after step (w moves only through the global step: warm-up 0, an update every round, 2 steps each), and
    it is not gd's."""
    data, rounds = _syn(), 4
    perm = _perm(server_opt)
    s = perm.init(data, 3)
    w0 = {k: v.clone() for k, v in s.w.items()}
    for _ in range(rounds):
        s = perm.round(s)
    params = {k: torch.nn.Parameter(v.clone()) for k, v in w0.items()}
    optimizer = make_optimizer(list(params.values()))
    for _ in range(rounds * perm.global_steps):
        grads = _mean_client_gradient({k: p.detach() for k, p in params.items()}, data)
        for k, p in params.items():
            p.grad = grads[k]
        optimizer.step()
    for k in s.w:
        torch.testing.assert_close(s.w[k], params[k].detach(), atol=1e-5, rtol=1e-5)
    gd = _perm()
    t = gd.init(data, 3)
    for _ in range(rounds):
        t = gd.round(t)
    assert max(float((s.w[k] - t.w[k]).abs().max()) for k in s.w) > 1e-2


@pytest.mark.parametrize("kwargs, match", [
    (dict(server_opt="adam"), r"server_opt must be a ServerOpt \(gd, heavy_ball, nesterov, adam\), got 'adam'"),
    (dict(server_opt=ServerOpt("heavy_ball", 0.5, momentum=0.9)),
     r"server_opt's lr \(0.5\) is the global step's size gamma: global_lr must equal it, got global_lr=0.4"),
])
def test_perm_refuses_a_bad_server_optimizer_naming_it(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _perm(**kwargs)


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


def _grid(model):
    g = 3
    return LocalUpdateGrid(model, gamma=torch.full((g,), 0.1), eta=torch.tensor([0.5, 0.7, 0.9]),
                           momentum=torch.tensor([0.0, 0.5, 0.5]), nesterov=torch.tensor([False, False, True]),
                           alpha=[0.0, 0.0, 0.1], local_steps=2, batch_size=4, clients_per_round=3)


def _hetero_fractions(n):
    return [1.0, 0.5, 0.25, 1.0, 0.5, 0.75][:n]


_RADIUS = 1.0
#: every algorithm with a server model, run a few rounds on a small problem (factory(model, spec, data))
SERVER_MODELS = {
    "FedAvg": lambda m, spec, d: FedAvg(m, local_steps=2, lr=0.2, batch_size=4, clients_per_round=3,
                                        server_opt=ServerOpt("heavy_ball", 0.8, momentum=0.5)),
    # Alg. 3's projection onto an l2 ball: the server optimizer's (a radius the models leave within 6 rounds)
    "FedAvg in a ball": lambda m, spec, d: FedAvg(m, local_steps=2, lr=0.2, batch_size=4,
                                                  server_opt=ServerOpt("gd", 1.0, radius=_RADIUS)),
    "LocalizedFedAvg": lambda m, spec, d: LocalizedFedAvg(m, finetune_steps=1, finetune_lr=0.1, local_steps=2,
                                                          lr=0.2, batch_size=4),
    "Ditto": lambda m, spec, d: Ditto(m, lr=0.2, local_steps=2, batch_size=4, lam=0.5, personal_lr=0.1,
                                      personal_steps=2, clients_per_round=3, weighting="uniform"),
    "PerFedAvg": lambda m, spec, d: PerFedAvg(m, alpha=0.05, beta=0.1, local_steps=2, batch_size=4),
    "PFedMe": lambda m, spec, d: PFedMe(m, lr=0.1, personal_lr=0.05, lam=5.0, beta=1.5, local_steps=2,
                                        inner_steps=2, batch_size=4),
    "LocalUpdate": lambda m, spec, d: LocalUpdate(m, theta=[1.0, 0.5], gamma=0.1, alpha=0.1, batch_size=4,
                                                  server_opt=ServerOpt("adam", 0.05)),
    "MAML": lambda m, spec, d: MAML(m, inner_steps=1, gamma=0.1, batch_size=4, server_opt=ServerOpt("gd", 0.5)),
    "PartialFedAvg": lambda m, spec, d: PartialFedAvg(m, spec, fractions=_hetero_fractions(d.num_clients),
                                                      extraction="rolling", local_steps=2, lr=0.2, batch_size=4),
    "PERM": lambda m, spec, d: PERM(m, local_steps=2, lr=0.1, batch_size=4, lam=10.0, global_lr=0.3,
                                    warmup_rounds=2, update_every=2, alpha_init="estimate",
                                    server_opt=ServerOpt("nesterov", 0.3, momentum=0.5)),
    "PERMHetero": lambda m, spec, d: PERMHetero(m, spec, fractions=_hetero_fractions(d.num_clients),
                                                extraction="random", local_steps=2, lr=0.1, batch_size=4, lam=10.0,
                                                global_lr=0.3, warmup_rounds=2, update_every=2, global_steps=2),
    "LocalUpdateGrid": lambda m, spec, d: _grid(m),
}
#: the algorithms without a server model
NO_SERVER_MODEL = {"Local": "each client trains its own model"}


def _algorithm_classes() -> set[str]:
    """Every class of pflkit.algorithms' modules with a round (``PassRound``), but the warm-up round PERM runs."""
    names = set()
    for path in sorted(ALGORITHMS.glob("*.py")):
        module = importlib.import_module(f"pflkit.algorithms.{path.stem}") if path.stem != "__init__" else None
        for name, cls in inspect.getmembers(module, inspect.isclass) if module else ():
            if issubclass(cls, PassRound) and cls.__module__ == module.__name__ and hasattr(cls, "round_passes"):
                names.add(name)
    return names - {"FederatedRound", "WarmupRound"}


def test_every_algorithm_is_checked_for_its_server_update():
    assert _algorithm_classes() == {name.split()[0] for name in SERVER_MODELS} | set(NO_SERVER_MODEL)


@pytest.fixture
def server_steps(monkeypatch):
    """The models every server optimizer step of the run returned (``ServerOpt.step`` / ``step_to``, and the
    grid's vectorised ``momentum_step``), in order."""
    import pflkit.algorithms.local_update as local_update
    returned = []

    def recording(fn, first=True):
        def run(*args, **kwargs):
            out = fn(*args, **kwargs)
            returned.append(out[0] if first else out)
            return out
        return run

    monkeypatch.setattr(ServerOpt, "step", recording(ServerOpt.step))
    monkeypatch.setattr(ServerOpt, "step_to", recording(ServerOpt.step_to))
    monkeypatch.setattr(local_update, "momentum_step", recording(local_update.momentum_step))
    return returned


def _server_model(state):
    return state.x if hasattr(state, "x") else state.w


@pytest.mark.parametrize("name", sorted(SERVER_MODELS))
def test_the_new_server_model_is_what_the_server_optimizer_returned(name, mixed, server_steps):
    """After every round the server model is the old one (no server step that round) or exactly the model the
    round's last ServerOpt step returned: a server update written by hand in a round fails here."""
    perm_family = name.startswith("PERM")
    data, spec = (_syn(), SYN_SPEC) if perm_family else (mixed, SPEC)
    algorithm = SERVER_MODELS[name](FunctionalModel(spec.factory()), spec, data)
    s = algorithm.init(data, 0)
    stepped = 0
    for r in range(6):
        server_steps.clear()
        before = _server_model(s)
        s = algorithm.round(s)
        after = _server_model(s)
        if _equal(after, before):
            continue
        assert server_steps, f"{name} round {r + 1}: the server model moved without a server optimizer step"
        assert _equal(after, server_steps[-1]), f"{name} round {r + 1}: the server model is not ServerOpt's"
        stepped += 1
        if name.endswith("in a ball"):
            assert torch.sqrt(sum((v ** 2).sum() for v in after.values())) <= _RADIUS * (1 + 1e-6)
    assert stepped >= 2
