"""The federated protocol of pflkit.flower without Flower: every method's server (its state, its draws,
its round cut into passes) and one-client ``FederatedClient`` objects reproduce the batched in-process
run (``runner.run``), round by round; the pieces fail clearly on bad input."""
from dataclasses import fields

import pytest
import torch

from reference.methods import FedAdam, FedClip

from pflkit.algorithms import (MAML, PERM, Ditto, FedAvg, Local, LocalizedFedAvg, PerFedAvg, PFedMe, ServerOpt, fedprox,
                               fomaml)
from pflkit.data import perm_synthetic
from pflkit.engine import FunctionalModel
from pflkit.flower.client import FederatedClient, Job, read_partition, write_partitions
from pflkit.flower.loopback import run_loopback
from pflkit.algorithms.round import drive
from pflkit.flower.server import FederatedServer, sizes_only
from pflkit.flower.spec import RunSpec, settings_of
from pflkit.models import build, logistic
from pflkit.runner import run

DATA = dict(num_clients=5, samples_per_client=30, dim=4, test_fraction=0.3, seed=2)
ROUNDS, SEED = 6, 4


def _model():
    return FunctionalModel(lambda: logistic((DATA["dim"],), 2))


METHODS = {
    "fedavg": lambda m: FedAvg(m, local_steps=3, lr=0.3, batch_size=4, clients_per_round=3),
    "fedavg_full_batch_by_samples": lambda m: FedAvg(m, local_steps=2, lr=0.3, batch_size=None, weighting="samples"),
    "localized_fedavg": lambda m: LocalizedFedAvg(m, local_steps=3, lr=0.3, batch_size=4, finetune_steps=2,
                                                  finetune_lr=0.5, clients_per_round=4),
    "perfedavg_hf": lambda m: PerFedAvg(m, alpha=0.1, beta=0.2, local_steps=3, batch_size=4, variant="hf"),
    "pfedme": lambda m: PFedMe(m, lr=0.1, personal_lr=0.05, lam=5.0, local_steps=3, batch_size=4, beta=1.5),
    "ditto": lambda m: Ditto(m, lr=0.3, local_steps=3, batch_size=4, lam=0.5, personal_lr=0.2, personal_steps=2,
                             clients_per_round=3, weighting="samples"),
    "perm": lambda m: PERM(m, local_steps=3, lr=0.5, batch_size=4, lam=10.0, update_every=2),
    "perm_warmup_estimate_sampled": lambda m: PERM(m, local_steps=3, lr=0.5, batch_size=4, lam=10.0,
                                                   alpha_solver="exact", warmup_rounds=2, alpha_init="estimate",
                                                   alpha_samples=5, global_steps=2, update_every=3),
    "perm_alpha_visits": lambda m: PERM(m, local_steps=3, lr=0.5, batch_size=4, lam=10.0, visit="alpha",
                                        alpha_init="estimate"),
    "fedavg_server_momentum": lambda m: FedAvg(m, local_steps=3, lr=0.3, batch_size=4, clients_per_round=3,
                                               server_opt=ServerOpt("nesterov", 0.8, momentum=0.5)),
    "fedprox_local_update": lambda m: fedprox(m, steps=3, gamma=0.2, alpha=0.5, batch_size=4, clients_per_round=3,
                                              server_opt=ServerOpt("heavy_ball", 0.2, momentum=0.3)),
    "fomaml": lambda m: fomaml(m, steps=3, gamma=0.2, lr=0.5, batch_size=4),
    "maml": lambda m: MAML(m, inner_steps=2, gamma=0.1, batch_size=4, clients_per_round=4,
                           server_opt=ServerOpt("gd", 0.5)),
    # methods added outside pflkit (tests/reference/methods.py): named by their import path
    "fedadam": lambda m: FedAdam(m, local_steps=3, lr=0.3, batch_size=4, server_lr=0.05, clients_per_round=3),
    "fedclip": lambda m: FedClip(m, local_steps=3, lr=0.3, batch_size=4, clip=0.05),
}


def _spec(alg, model: dict | None = None, **run_kw):
    return RunSpec.for_algorithm(alg, model=model or {"name": "logistic"}, data={"name": "perm_synthetic",
                                 "kwargs": DATA}, seed=SEED, rounds=ROUNDS, eval_every=2, **run_kw)


def _reproduces_in_process(alg, model: dict | None = None):
    """Run ``alg`` in process and over the protocol (``model``: the spec's model, default logistic): every
    evaluated metric and the final server state agree (float32 of one client alone vs inside the batch: 1e-6;
    accuracy within 1e-4). Returns the in-process history."""
    keep = {}
    want = run(alg, perm_synthetic(**DATA), ROUNDS, SEED, eval_every=2, keep=keep)
    got, server = run_loopback(_spec(alg, model))
    a, b = (h.set_index(["round", "metric"])["value"].sort_index() for h in (want, got))
    assert list(a.index) == list(b.index)  # rounds 0, 2, 4, 6 x 4 metrics
    acc = a.index.get_level_values("metric").str.startswith("accuracy")
    assert (a[acc] - b[acc]).abs().max() <= 1e-4
    torch.testing.assert_close(torch.tensor(b.values), torch.tensor(a.values), rtol=1e-5, atol=1e-6)
    state = keep[(alg.name, SEED)]
    for name in ("w", "v", "alpha"):
        if getattr(state, name, None) is not None:
            torch.testing.assert_close(getattr(server.state, name), getattr(state, name), rtol=1e-5, atol=1e-6)
    assert server.state.round == ROUNDS
    return want


@pytest.mark.parametrize("key", list(METHODS))
def test_federated_run_reproduces_the_batched_engine(key):
    """Same seed, same draws: the protocol reproduces the in-process run (``_reproduces_in_process``)."""
    _reproduces_in_process(METHODS[key](_model()))


def test_a_model_with_dropout_runs_federated_and_reproduces_the_batched_engine():
    """Dropout masks are per client too (drawn from the model's client stream): FedAvg of an MLP with dropout
    over the protocol gives the in-process run's metrics and model (tolerances as above)."""
    model = FunctionalModel(lambda: build("mlp", (DATA["dim"],), 2, hidden=(6,), dropout=0.4))
    assert model.dropout
    want = _reproduces_in_process(METHODS["fedavg"](model), {"name": "mlp", "kwargs": {"hidden": [6], "dropout": 0.4}})
    nodrop = METHODS["fedavg"](FunctionalModel(lambda: build("mlp", (DATA["dim"],), 2, hidden=(6,)), dropout=False))
    off = run(nodrop, perm_synthetic(**DATA), ROUNDS, SEED, eval_every=2)
    assert not off["value"].equals(want["value"])  # the masks took part


def test_the_server_sees_sizes_only_and_each_client_its_own_rows():
    data = perm_synthetic(**DATA)
    clients = [FederatedClient(_spec(METHODS["perm"](_model())), j, data) for j in range(5)]
    skeleton = sizes_only([c.info() for c in reversed(clients)])  # any order of registration
    assert skeleton.x_train.shape == (int(data.train_sizes.sum()), 0) and skeleton.x_test.shape[1] == 0
    assert torch.equal(skeleton.train_sizes, data.train_sizes)
    assert torch.equal(skeleton.train_offsets, data.train_offsets)
    for j, c in enumerate(clients):
        x, y = data.client(j)
        assert torch.equal(c.data.x_train, x) and torch.equal(c.data.y_train, y) and c.data.num_clients == 1
    # the PERM round's first pass: every client hosts exactly one personalized model (Alg. 1's Latin square)
    server = FederatedServer(clients[0].spec, [c.info() for c in clients])
    drive(server.start(), lambda jobs: {})  # uniform alpha: no pass before round 1
    jobs = next(server.round())
    assert sorted(jobs) == list(range(5))
    for job in jobs.values():  # its model, its step size and the pass's key: no rows (the client draws them)
        assert job.config["step"] == "visiting_steps" and job.arrays["extra.lr"].shape == (1,)
        assert set(job.arrays) == {"extra.lr"} | {f"model.{k}" for k in clients[0].model.init(0)}
    assert len({job.config["draws"] for job in jobs.values()}) == 1


def test_a_client_reading_its_partition_file_is_the_client_that_rebuilds_the_federation(tmp_path):
    """A deployment's SuperNode holds its own partition (``write_partitions``; ``data-path`` in its node config):
    the client read from that file has the rebuilt client's data, field by field, and runs a job to the same
    reply, bit for bit; a file of another federation or partition is refused."""
    data = perm_synthetic(**DATA)
    spec = _spec(METHODS["fedavg"](_model()))
    paths = write_partitions(data, spec.federation_key(), tmp_path)
    assert [p.name for p in paths] == [f"partition-{j}.pt" for j in range(DATA["num_clients"])]
    for j, path in enumerate(paths):
        rebuilt = FederatedClient(spec, j, data)
        read = FederatedClient(spec, j, own=read_partition(path, spec.federation_key(), j))
        assert read.info() == rebuilt.info() and read.num_clients == DATA["num_clients"]
        for f in (f for f in fields(rebuilt.data) if not f.name.startswith("_")):
            a, b = getattr(read.data, f.name), getattr(rebuilt.data, f.name)
            assert torch.equal(a, b) if isinstance(b, torch.Tensor) else a == b, f.name
    record = torch.load(paths[1], weights_only=True)  # its own rows only, not a view of the federation's storage
    assert all(t.untyped_storage().nbytes() == t.nbytes for t in (*record["train"], *record["test"]))
    server = FederatedServer(spec, [FederatedClient(spec, j, data).info() for j in range(DATA["num_clients"])])
    drive(server.start(), lambda jobs: {})
    job = next(iter(next(server.round()).items()))
    client, one = job
    replies = [FederatedClient(spec, client, data).run(one),
               FederatedClient(spec, client, own=read_partition(paths[client], spec.federation_key(), client)).run(one)]
    assert replies[0].arrays.keys() == replies[1].arrays.keys()
    assert all(torch.equal(replies[0].arrays[k], replies[1].arrays[k]) for k in replies[0].arrays)
    other = _spec(METHODS["fedavg"](_model()), batch_order="shuffled").federation_key()
    with pytest.raises(ValueError, match="holds partition 0 of another federation"):
        read_partition(paths[0], other, 0)
    with pytest.raises(ValueError, match="holds partition 0 of another federation than this run's partition 1"):
        read_partition(paths[0], spec.federation_key(), 1)


def test_sizes_only_needs_one_client_per_partition():
    infos = [FederatedClient(_spec(METHODS["fedavg"](_model())), j).info() for j in (0, 1, 3)]
    with pytest.raises(ValueError, match=r"one client per partition 0\.\.4, got partitions \[0, 1, 3\]"):
        sizes_only(infos)


def test_a_client_runs_only_its_methods_steps():
    client = FederatedClient(_spec(METHODS["fedavg"](_model())), 0)
    w = {f"model.{k}": v.unsqueeze(0) for k, v in client.model.init(0).items()}
    config = {"kind": "train", "step": "local_models", "shared": True, "models": 1, "draws": 7, "round": 1, "seed": 0}
    assert client.run(Job(w, config)).arrays.keys() == w.keys()
    with pytest.raises(ValueError, match=r"step one of FedAvg's client steps \('given', 'global_model', "
                                         r"'local_models'\), got kind 'train', step 'visiting_steps'"):
        client.run(Job(w, {**config, "step": "visiting_steps"}))  # a method's own steps only
    with pytest.raises(ValueError, match=r"got kind 'query', step 'local_models'"):
        client.run(Job(w, {**config, "kind": "query"}))


def test_spec_rebuilds_the_algorithm_and_rejects_what_it_cannot_run():
    for make in METHODS.values():
        alg = make(_model())
        spec = RunSpec.from_json(_spec(alg).to_json())
        assert settings_of(spec.algorithm(_model())) == settings_of(alg) and spec.name == alg.name
    assert _spec(METHODS["fedclip"](_model())).method == "reference.methods:FedClip"
    # a class declares what a federated engine cannot run, and why
    with pytest.raises(ValueError, match="cannot run Local: Alone trains every client by itself"):
        _spec(Local(_model(), local_steps=1, lr=0.1, batch_size=2))
    with pytest.raises(ValueError, match="cannot run PERMHetero: PERM-hetero's alpha update reads every client's"):
        RunSpec("PERMHetero", {}, {"name": "logistic"}, {"name": "perm_synthetic"}, 0, 1)

    class Variant(PERM):  # no process but this one could import it
        pass

    with pytest.raises(ValueError, match="defined at a module's top level.*got .*Variant"):
        _spec(Variant(_model(), local_steps=1, lr=0.1, batch_size=2, lam=1.0))
    with pytest.raises(ValueError, match="method must be one of .* or an import path"):
        RunSpec("SCAFFOLD", {}, {"name": "logistic"}, {"name": "perm_synthetic"}, 0, 1)
    with pytest.raises(ValueError, match="method 'reference.methods:Nope' cannot be imported here"):
        RunSpec("reference.methods:Nope", {}, {"name": "logistic"}, {"name": "perm_synthetic"}, 0, 1)
    with pytest.raises(ValueError, match=r"model.name must be one of"):
        RunSpec("FedAvg", {}, {"name": "transformer"}, {"name": "perm_synthetic"}, 0, 1)
    with pytest.raises(ValueError, match=r"data.name must be one of \['perm_synthetic'\], got 'cifar'"):
        RunSpec("FedAvg", {}, {"name": "logistic"}, {"name": "cifar"}, 0, 1)
    with pytest.raises(ValueError, match="rounds must be an integer >= 1, got 0"):
        RunSpec("FedAvg", {}, {"name": "logistic"}, {"name": "perm_synthetic"}, 0, 0)
    with pytest.raises(ValueError, match="timeout must be a number of seconds > 0"):
        RunSpec("FedAvg", {}, {"name": "logistic"}, {"name": "perm_synthetic"}, 0, 1, timeout=0)
    with pytest.raises(ValueError, match="partition-id must be in \\[0, 5\\)"):
        FederatedClient(_spec(METHODS["fedavg"](_model())), 5)


def test_a_round_goes_on_without_silent_clients_and_the_participation_replays():
    """FedAvg (4 of 5 clients a round) with min_clients=2: client 1 falls silent from pass 3 (the evaluation
    after round 2), client 3 from pass 5 (round 4's training; silent from the first pass it is drawn for).
    The run completes; neither is sent anything after; the recorded participation, replayed in the protocol,
    gives the same history and final model bit for bit; and the batched in-process round, fed the same
    participation (``Outputs``: the answered clients' outputs), gives the same final model (float32 of one
    client alone vs inside the batch: 1e-6)."""
    from pflkit.algorithms.round import Outputs, run_step

    alg = FedAvg(_model(), local_steps=3, lr=0.3, batch_size=4, clients_per_round=4)
    spec = _spec(alg, min_clients=2)
    history, server = run_loopback(spec, fail_from={1: 3, 3: 5})
    first = min(row["pass"] for row in server.participation if row["pass"] >= 5 and 3 in row["clients"])
    assert server.lost == {1: 3, 3: first} and server.state.round == ROUNDS
    for row in server.participation:
        for c, since in server.lost.items():
            assert (c in row["answered"]) == (c in row["clients"] and row["pass"] < since)
    assert len(history) == 4 * 4  # rounds 0, 2, 4, 6 evaluated (over the clients still answering)
    again, replay = run_loopback(spec, participation=server.participation)
    assert again.equals(history) and all(torch.equal(replay.state.w[k], v) for k, v in server.state.w.items())

    data, s = perm_synthetic(**DATA), alg.init(perm_synthetic(**DATA), SEED)
    trains = iter(row for row in server.participation if row["step"] == "local_models")
    for _ in range(ROUNDS):
        passes, row = alg.round_passes(s), next(trains)
        p = next(passes)
        out = run_step(alg, p, data)
        kept = torch.tensor([i for i, c in enumerate(p.clients.tolist()) if c in row["answered"]])
        if len(kept) < len(p.clients):
            out = Outputs({k: v[kept] for k, v in out.items()}, kept)
        try:
            passes.send(out)
        except StopIteration as stop:
            s = stop.value
    for k, v in s.w.items():
        torch.testing.assert_close(server.state.w[k], v, rtol=1e-5, atol=1e-6)


def test_too_few_clients_or_a_method_that_needs_every_client_stops_the_run_clearly():
    from pflkit.flower.server import FederationError

    alg = FedAvg(_model(), local_steps=3, lr=0.3, batch_size=4)
    with pytest.raises(FederationError, match=r"round 2, local_models pass: no reply from client\(s\) \[1, 3\] "
                                              r"within 120 s: only 3 of the pass's 5 clients answered, fewer than "
                                              r"min_clients=4"):
        run_loopback(_spec(alg, min_clients=4), fail_from={1: 2, 3: 2})  # pass 2: round 2's training
    with pytest.raises(FederationError, match=r"round 2, local_models pass: no reply from client\(s\) \[1\] within "
                                              r"120 s; .* needs every client"):
        run_loopback(_spec(alg), fail_from={1: 2})
    perm = METHODS["perm"](_model())
    with pytest.raises(FederationError, match=r"round 1, visiting_steps pass: no reply from client\(s\) \[2\]"):
        run_loopback(_spec(perm), fail_from={2: 1})
    with pytest.raises(ValueError, match="min_clients must be None for PERM: its rounds need every client's output"):
        _spec(perm, min_clients=3)
    with pytest.raises(ValueError, match="min_clients must be None .* or an integer >= 1, got 0"):
        _spec(alg, min_clients=0)
