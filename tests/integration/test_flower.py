"""pflkit's methods on Flower's engines reproduce the batched in-process run, leave no process behind and
stop with a clear error when a client dies (skipped when Flower, the extra ``pflkit[flower]``, is not
installed). Tiny sizes: 3 clients, 2 rounds (the dying-client tests run more and wait out a pass's 45 s
timeout). Every deployment is stock Flower (``flower-superlink``, ``flower-supernode``, Flower's SuperExec
starting a ClientApp process per message: seconds a pass here), and pflkit leaves every attribute of Flower's
modules as it found it (issue 55)."""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

pytest.importorskip("flwr")
psutil = pytest.importorskip("psutil")

from reference.methods import FedAdam, FedClip  # noqa: E402

from pflkit.algorithms import PERM, Ditto, FedAvg, ServerOpt, fedprox  # noqa: E402
from pflkit.data import perm_synthetic  # noqa: E402
from pflkit.engine import FunctionalModel  # noqa: E402
from pflkit.flower.deployment import Deployment  # noqa: E402
from pflkit.flower.simulation import simulate  # noqa: E402
from pflkit.flower.spec import RunSpec  # noqa: E402
from pflkit.models import logistic  # noqa: E402
from pflkit.runner import run  # noqa: E402
from repo_files import load  # noqa: E402

pytestmark = pytest.mark.slow

DATA = dict(num_clients=3, samples_per_client=40, dim=5, test_fraction=0.25, seed=1)
ROUNDS, SEED = 2, 3


def _algorithms(more: bool = False):
    """FedAvg and PERM; with ``more`` also LocalUpdate (FedProx with server momentum), two methods added
    outside pflkit in a few lines (tests/reference/methods.py: FedAdam, and FedClip's own client step) and Ditto
    (two passes a round, on 2 of the 3 clients)."""
    model = FunctionalModel(lambda: logistic((DATA["dim"],), 2))
    return [FedAvg(model, local_steps=3, lr=0.3, batch_size=4),
            # update_every=2: round 2 ends with the global step and the alpha update (two gradient passes)
            PERM(model, local_steps=3, lr=0.5, batch_size=4, lam=10.0, update_every=2)] + ([
            fedprox(model, steps=3, gamma=0.2, alpha=0.5, batch_size=4, server_opt=ServerOpt("heavy_ball", 0.2, 0.3)),
            FedAdam(model, local_steps=3, lr=0.3, batch_size=4, server_lr=0.05),
            FedClip(model, local_steps=3, lr=0.3, batch_size=4, clip=0.05),
            Ditto(model, lr=0.3, local_steps=3, batch_size=4, lam=0.5, personal_lr=0.2, personal_steps=2,
                  clients_per_round=2, weighting="uniform")] if more else [])


def _specs(rounds=ROUNDS, timeout=60.0, more=False):
    return [RunSpec.for_algorithm(a, model={"name": "logistic"}, data={"name": "perm_synthetic", "kwargs": DATA},
                                  seed=SEED, rounds=rounds, eval_every=rounds, timeout=timeout)
            for a in _algorithms(more)]


def _check_equivalence(results, more=False, methods=None):
    """Final personalized accuracy within 1e-4 of the in-process run, and the final server state (global
    model; PERM's personalized models and alpha) within float32 rounding (``methods``: default FedAvg and PERM,
    with ``more`` the rest of ``_algorithms``)."""
    algorithms = _algorithms(more) if methods is None else methods
    assert len(results["runs"]) == len(algorithms)
    for alg, out, state in zip(algorithms, results["runs"], results["states"]):
        keep = {}
        want = run(alg, perm_synthetic(**DATA), ROUNDS, SEED, eval_every=ROUNDS, keep=keep)
        final = lambda h: {r["metric"]: r["value"] for r in h if r["round"] == ROUNDS}  # noqa: E731
        got = final([dict(zip(out["history"], row)) for row in zip(*out["history"].values())])
        expect = final(want.to_dict("records"))
        assert abs(got["accuracy"] - expect["accuracy"]) <= 1e-4, (alg.name, got, expect)
        assert abs(got["loss"] - expect["loss"]) <= 1e-5, (alg.name, got, expect)
        s = keep[(alg.name, SEED)]
        for k, v in s.w.items():
            torch.testing.assert_close(state[f"w.{k}"], v, rtol=1e-5, atol=1e-6)
        if isinstance(alg, PERM):
            torch.testing.assert_close(state["alpha"], s.alpha, rtol=1e-5, atol=1e-8)
        if isinstance(alg, (PERM, Ditto)):  # the personalized models the server holds
            for k, v in s.v.items():
                torch.testing.assert_close(state[f"v.{k}"], v, rtol=1e-5, atol=1e-6)


def _gone(pids):
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive == []


def _intruder_is_refused(dep, tmp_path):
    """A fourth SuperNode with a key of its own (not registered), the run's CA certificate and the right address
    tries to join: the SuperLink refuses it for its key and lists only the registered nodes."""
    import subprocess

    from pflkit.flower.credentials import node_key
    from pflkit.flower.deployment import CONNECTION, _tool

    key = node_key(tmp_path / "intruder")
    log = (tmp_path / "intruder.log").open("w")
    intruder = subprocess.Popen([_tool("flower-supernode"), "--root-certificates", str(dep.credentials.ca_cert),
                                 "--auth-supernode-private-key", str(key), "--superlink", f"127.0.0.1:{dep.port}",
                                 "--max-retries", "2", "--node-config", "partition-id=0 num-partitions=3"],
                                stdout=log, stderr=subprocess.STDOUT, env=dep.env, start_new_session=True)
    try:
        intruder.wait(90)
    finally:
        if intruder.poll() is None:
            intruder.kill()
            intruder.wait()
    assert intruder.returncode != 0, (tmp_path / "intruder.log").read_text()[-2000:]
    assert "No SuperNode found with the given public key" in dep.log_tail("superlink", 200)  # refused for its key
    listed = subprocess.run([_tool("flwr"), "supernode", "list", CONNECTION, "--format", "json"], env=dep.env,
                            cwd=dep.workdir, capture_output=True, text=True, timeout=60)
    assert listed.stdout.count('"node-id"') == DATA["num_clients"], listed.stdout + listed.stderr


def test_deployment_reproduces_fedavg_and_perm_and_leaves_no_process(tmp_path):
    """With TLS and SuperNode authentication (the default): an unregistered SuperNode is refused, and the run
    reproduces in-process; nothing is left running afterwards."""
    dep = Deployment(DATA["num_clients"], tmp_path / "dep")
    specs = _specs()
    dep.hold_data(specs[0].federation(), specs[0].federation_key())  # each SuperNode reads its own partition file
    with dep:
        assert "data-path=" in " ".join(dep.procs["supernode-1"].args)
        assert {Path(p.args[0]).name for n, p in dep.procs.items() if n.startswith("super")} == {
            "flower-superlink", "flower-supernode"}  # Flower's own commands, nothing of pflkit's between
        link_args = dep.procs["superlink"].args
        assert {"--enable-supernode-auth", "--ssl-certfile"} <= set(link_args) and "--insecure" not in link_args
        _intruder_is_refused(dep, tmp_path)
        handle = dep.submit(specs)
        results = handle.wait(600)
        pids = dep.pids()
        groups = [p.pid for p in dep.procs.values()]
    assert len(pids) >= 1 + DATA["num_clients"]  # a SuperLink and 3 SuperNodes (and their helpers)
    assert dep.leftover == [] and _gone(pids)
    for pgid in groups:  # every process group the launcher started is empty
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)
    _check_equivalence(results)
    assert [len(r["round_seconds"]) for r in results["runs"]] == [ROUNDS, ROUNDS]


def test_deployment_reproduces_ditto_whose_rounds_take_two_passes(tmp_path):
    """Ditto (a FedAvg pass, then the personal pass on the same 2 of 3 participants) on stock SuperNodes with TLS and
    node authentication: the final metrics and the server's global and personal models equal the in-process run's
    (tolerances of ``_check_equivalence``)."""
    ditto = _algorithms(more=True)[-1]
    assert isinstance(ditto, Ditto)
    spec = RunSpec.for_algorithm(ditto, model={"name": "logistic"}, data={"name": "perm_synthetic", "kwargs": DATA},
                                 seed=SEED, rounds=ROUNDS, eval_every=ROUNDS, timeout=120.0)
    dep = Deployment(DATA["num_clients"], tmp_path / "dep")
    dep.hold_data(spec.federation(), spec.federation_key())
    with dep:
        results = dep.submit([spec]).wait(600)
    _check_equivalence(results, methods=[ditto])


def test_pflkit_leaves_every_attribute_of_flower_as_it_found_it(tmp_path):
    """tests/integration/flower_untouched.py: every attribute of every imported flwr module (and of the classes
    they define) recorded, a simulation run (its ServerApp in that process) and a deployment run, recorded again:
    nothing rebound (the fork server, SuperExec, SuperNode wrapper and object-pull patches of before each rebound
    some)."""
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("flower_untouched.py")), str(tmp_path / "dep")],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["modules"] > 100 and seen["attributes"] > 5000, seen
    assert seen["changed"] == []


def test_flwr_run_runs_a_pflkit_method_from_the_run_config_on_a_stock_deployment(tmp_path):
    """pflkit is a Flower App (pyproject.toml [tool.flwr.app]): `flwr run <the repository> <connection>
    --run-config <file>` on a stock deployment (TLS, node authentication; no partition files: each ClientApp
    builds its client from the run config) runs PERM with the dataset, rounds and settings the run config names,
    and reproduces the in-process run."""
    import tomli_w

    from pflkit.flower.deployment import CONNECTION, _tool

    alg = _algorithms()[1]  # PERM (update_every=2: round 2 has the global step and the alpha update)
    settings = RunSpec.for_algorithm(alg, model={"name": "logistic"}, data={"name": "perm_synthetic"}, seed=SEED,
                                     rounds=ROUNDS).settings
    results = tmp_path / "results.json"
    config = tmp_path / "run-config.toml"
    config.write_text(tomli_w.dumps({"method": "PERM", "settings": json.dumps(settings),
                                     "data-kwargs": json.dumps(DATA), "seed": SEED, "num-server-rounds": ROUNDS,
                                     "eval-every": ROUNDS, "timeout": 60.0, "results": str(results)}))
    root = Path(__file__).resolve().parents[2]
    with Deployment(DATA["num_clients"], tmp_path / "dep") as dep:
        launched = subprocess.run([_tool("flwr"), "run", str(root), CONNECTION, "--run-config", str(config),
                                   "--stream"], env=dep.env, cwd=dep.workdir, capture_output=True, text=True,
                                  timeout=600)
        assert results.exists(), launched.stdout[-3000:] + launched.stderr[-3000:]
        pids = dep.pids()
    assert dep.leftover == [] and _gone(pids)
    out = json.loads(results.read_text())
    assert out["runs"][0]["spec"]["method"] == "PERM" and out["runs"][0]["spec"]["rounds"] == ROUNDS
    out["states"] = torch.load(results.with_suffix(".pt"), weights_only=True)
    assert "pflkit: PERM finished 2 rounds: personalized accuracy" in launched.stdout + launched.stderr
    _check_equivalence(out, methods=[alg])


#: seconds after the node's death the worst-moment test watches the run (a known Flower limitation: docs/flower.md)
HELD_BOUND = 300.0


def test_a_node_dying_between_its_reply_and_its_objects_holds_the_run_past_its_timeout(tmp_path, monkeypatch,
                                                                                     record_property):
    """A known Flower limitation, measured: SuperNode 1 (stock flower-supernode with the test's fault,
    tests/integration/dying_supernode.py) dies after round 1 right after pushing a reply message and before its
    objects. Flower's object pull inside the Grid's pull_messages keeps asking for those objects, so the pass does
    not end at its 45-s timeout: the test records how long after the death the run stopped (the error then names
    client 1 alone, the other replies kept), or that it still ran ``HELD_BOUND`` s after it (``held_seconds``,
    printed and in the JUnit properties); either way the deployment then ends every process."""
    flag = tmp_path / "die"
    spawn = Deployment._spawn

    def spawn_dying_node_1(self, name, cmd):
        if name == "supernode-1":  # Flower's flower-supernode, with the test's fault
            cmd = [sys.executable, str(Path(__file__).with_name("dying_supernode.py")), str(flag), *cmd[1:]]
        return spawn(self, name, cmd)

    monkeypatch.setattr(Deployment, "_spawn", spawn_dying_node_1)
    dep = Deployment(DATA["num_clients"], tmp_path)
    with dep:
        # 45 s: long enough for 3 SuperNodes to register while `make test` keeps both cores busy (15 s was not)
        handle = dep.submit(_specs(rounds=50, timeout=45.0)[1:])  # PERM
        deadline = time.monotonic() + 300
        while handle.progress() < 1 and handle.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert handle.progress() >= 1, dep.log_tail(handle.name)
        flag.touch()
        node = dep.procs["supernode-1"]
        while node.poll() is None and handle.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert node.poll() == 9, dep.log_tail("supernode-1")  # it died where it was meant to
        died = time.monotonic()
        try:
            handle.wait(HELD_BOUND)
            ended = None
        except RuntimeError as exc:  # the run stopped: within its timeout it names client 1 alone
            ended = time.monotonic() - died
            assert re.search(r"FederationError: round \d+, \w+ pass: no reply from client\(s\) \[1\] within 45 s",
                             str(exc)), str(exc)[-2000:]
        except TimeoutError:
            ended = None
        held = ended if ended is not None else time.monotonic() - died
        record_property("held_seconds", round(held, 1))
        record_property("ended", ended is not None)
        print(f"worst-moment death: the run {'stopped' if ended is not None else 'still ran'} {held:.0f} s after "
              f"the node died (pass timeout 45 s)")
        assert held > 45.0  # Flower holds the pass past its timeout: the limitation docs/flower.md names
        pids = dep.pids()
    assert dep.leftover == [] and _gone(pids)


def test_a_client_dying_mid_run_is_left_out_and_the_run_completes(tmp_path):
    """FedAvg with min_clients=2 of 3 (issue 32): SuperNode 1 is killed after round 1; the pass waiting for it
    ends after the spec's timeout, the run goes on without it and completes; client 1 is sent nothing after;
    replaying the recorded participation in the in-process protocol reproduces the run (final accuracy within
    1e-4, the global model within float32 rounding); no process is left."""
    import dataclasses

    from pflkit.flower.loopback import run_loopback

    spec = dataclasses.replace(_specs(rounds=5, timeout=45.0)[0], min_clients=2)
    dep = Deployment(DATA["num_clients"], tmp_path)
    with dep:
        handle = dep.submit([spec])
        deadline = time.monotonic() + 300
        while handle.progress() < 1 and handle.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert handle.progress() >= 1, dep.log_tail(handle.name)
        dep.kill_node(1)
        results = handle.wait(400)
        pids = dep.pids()
    assert dep.leftover == [] and _gone(pids)
    out = results["runs"][0]
    lost = {int(c): p for c, p in out["lost"].items()}
    assert list(lost) == [1] and len(out["round_seconds"]) == 5
    rows = out["participation"]
    assert all((1 in row["answered"]) == (row["pass"] < lost[1]) for row in rows)
    assert any(row["step"] == "local_models" and row["pass"] > lost[1] for row in rows)  # rounds after the loss
    history, server = run_loopback(spec, participation=rows)
    final = lambda h: h[h["round"] == 5].set_index("metric")["value"]  # noqa: E731
    got = pd.DataFrame(out["history"])
    assert abs(final(got)["accuracy"] - final(history)["accuracy"]) <= 1e-4
    for k, v in server.state.w.items():
        torch.testing.assert_close(results["states"][0][f"w.{k}"], v, rtol=1e-5, atol=1e-6)


def test_killing_the_superlink_mid_run_ends_its_serverapp_and_says_so_in_one_line(tmp_path):
    """The SuperLink killed mid-run (SIGKILL): the flwr-serverapp its SuperExec started, reparented to init and
    out of reach of the deployment's process trees, is ended within seconds (it was recorded while its parent
    lived); the run stops with one line naming the process, its pid, when and how it died, and nothing is left
    after stop()."""
    import re

    dep = Deployment(DATA["num_clients"], tmp_path)
    with dep:
        handle = dep.submit(_specs(rounds=400, timeout=45.0)[:1])
        deadline = time.monotonic() + 300
        while handle.progress() < 1 and handle.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert handle.progress() >= 1, dep.log_tail(handle.name)
        serverapps = [p for p in dep.descendants.alive("superlink") if p.name() == "flwr-serverapp"]
        assert len(serverapps) == 1, [p.name() for p in dep.descendants.alive()]
        link = dep.procs["superlink"].pid
        os.kill(link, 9)
        with pytest.raises(RuntimeError) as failed:
            handle.wait(120)
        message = str(failed.value)
        assert "\n" not in message and re.fullmatch(
            rf"pflkit deployment: superlink \(pid {link}\) died at \d\d:\d\d:\d\d \(killed by SIGKILL\); ending the "
            rf"\d+ process\(es\) it had started \(.*flwr-serverapp pid {serverapps[0].pid}.*\): the run cannot go on "
            r"\(its log: .*flwr-run-0.log\)", message), message
        deadline = time.monotonic() + 15  # SIGTERM at once, SIGKILL after 10 s (left alone, it outlived 120 s)
        while not _gone([serverapps[0].pid]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _gone([serverapps[0].pid])  # ended by the deployment at once, not only at stop()
        pids = dep.pids()
    assert dep.leftover == [] and _gone(pids + [p.pid for p in dep.descendants.alive()])


def test_poisoned_clients_on_the_deployment_engine_are_refused_dropped_or_caught(tmp_path):
    """tests/unit/test_flower_poisoned.py's table on the deployment engine (TLS, node authentication; the
    poisoned client is pflkit client code its ClientApp imports from tests/reference): with min_clients=2 every
    refused poison drops client 1, recorded with its node, round, pass and key, and the median bounds a scaled
    model; without it a bad reply stops the run naming client 1 and its node; the scaled model with the mean
    stops as the in-process run does (DivergenceError)."""
    import re

    from reference.poisoned import REFUSED, poisoned, refusal
    from reference.poisoned import model as poisoned_model
    from reference.poisoned import spec as poisoned_spec

    from pflkit.flower.loopback import run_loopback

    dep = Deployment(DATA["num_clients"], tmp_path)
    tests = str(Path(__file__).resolve().parents[1])  # every process imports reference.poisoned from there
    dep.env["PYTHONPATH"] = os.pathsep.join(filter(None, [tests, dep.env.get("PYTHONPATH")]))
    tolerated = [poisoned_spec(poisoned(poisoned_model(), p), min_clients=2) for p in REFUSED]
    tolerated.append(poisoned_spec(poisoned(poisoned_model(), "scale", aggregator="median")))
    with dep:
        results = dep.run(tolerated, timeout=600)
        nodes = set()
        for poison, out in zip(REFUSED, results["runs"]):
            key, why = REFUSED[poison]
            got = out["rejected"]["1"]
            assert (got["pass"], got["round"], got["step"], got["key"]) == (1, 1, "poisoned_models", key), poison
            assert re.match(why, got["reason"]) and out["lost"] == {"1": 1}, (poison, got)
            nodes.add(got["node"])
        assert len(nodes) == 1 and isinstance(nodes.pop(), int)  # client 1's node, every run
        history, _ = run_loopback(tolerated[-1])
        bounded = pd.DataFrame(results["runs"][-1]["history"])
        final = lambda h: h[h["round"] == h["round"].max()].set_index("metric")["value"]  # noqa: E731
        assert abs(final(bounded)["loss"] - final(history)["loss"]) <= 1e-5
        with pytest.raises(RuntimeError, match="RejectedReply: " + refusal("nan", r"node \d+")):
            dep.run([poisoned_spec(poisoned(poisoned_model(), "nan"))], timeout=300)
        with pytest.raises(RuntimeError, match=r"DivergenceError: Poisoned FedAvg diverged at round 2 \(seed 3"):
            dep.run([poisoned_spec(poisoned(poisoned_model(), "scale"))], timeout=300)
        pids = dep.pids()
    assert dep.leftover == [] and _gone(pids)


def test_simulation_reproduces_every_kind_of_method_and_shuts_ray_down():
    """FedAvg, PERM, LocalUpdate with a server optimizer, the methods added in tests/reference/methods.py
    (their ClientApps import them by path) and Ditto reproduce in-process on the simulation engine."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    results = simulate(_specs(more=True), num_cpus=1, object_store_mb=128)
    _check_equivalence(results, more=True)
    after = [p.pid for p in psutil.Process().children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs([psutil.Process(p) for p in after if psutil.pid_exists(p)], timeout=30)
    assert [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []


def test_the_floor_benchmark_runs_stock_flowers_floor_beside_pflkits_rounds(tmp_path):
    """benchmarks/flower_floor.py (docs/flower.md's side-by-side table) on 2 stock SuperNodes pinned to one core:
    1 timed round of each floor payload (a Flower App of Flower's public API only) and pflkit's FedAvg and PERM
    (smoke sizes, 2 rounds) on the same deployment, compared with crafted simulation and in-process rounds; the
    rounds' training passes are counted (PERM's round 2: its global step and alpha update add 2); nothing is left
    running (``measure`` raises otherwise); bad arguments are refused before anything starts."""
    floor = load("benchmarks/flower_floor.py")
    simulation = tmp_path / "flower.json"
    methods = lambda s: [{"method": m, "round_seconds": [s, 3 * s], "num_parameters": 12}  # noqa: E731
                         for m in ("FedAvg", "PERM")]
    simulation.write_text(json.dumps({"runs": [{"engine": "simulation", "clients": 2, "methods": methods(0.1)},
                                               {"engine": "in-process", "clients": 2, "methods": methods(0.001)}]}))
    out = floor.main(["--nodes", "2", "--rounds", "2", "--cores", "1", "--out", str(tmp_path), "--simulation",
                      str(simulation), "--profile", "smoke"])
    assert out["floats"] == 12 and out["simulation_round"] == pytest.approx(0.2) and out["cores"] == 1
    for payload in ("empty", "model", "flower", "torch"):
        measured = out["floor"][payload]
        assert len(measured["seconds"]) == 2 and min(measured["seconds"]) > 0
        assert len(measured["busy"]) == 2 and all(0 <= b <= 1 for b in measured["busy"])
    assert min(out["floor"]["flower"]["seconds"]) >= 3.0  # Flower's send_and_receive: 3 s before its second pull
    assert [(m["method"], m["passes"], len(m["round_seconds"])) for m in out["pflkit"]] == [
        ("FedAvg", [1, 1], 2), ("PERM", [1, 3], 2)]
    md = (tmp_path / "flower_floor.md").read_text()
    assert "| floor | empty | pulled every 0.05 s | 2 |" in md and "| floor | 12 float32 each way | Flower's" in md
    assert "| FedAvg | 2 | 1.0 |" in md and "| PERM | 2 | 2.0 |" in md
    assert "| floor | 12 float32 each way, the ClientApp imports torch | pulled every 0.05 s | 2 |" in md
    for bad, says in ((["--cores", "0"], "--cores: an integer in 1"),
                      (["--nodes", "3"], "--nodes 3: .* allowed: \\[2\\]")):
        with pytest.raises(SystemExit, match=says):
            floor.main([*bad, "--simulation", str(simulation)])


def test_the_request_benchmark_times_every_request_of_a_floor_deployment(tmp_path):
    """benchmarks/flower_requests.py on 2 stock nodes pinned to one core for 2 counted rounds: every process of
    the deployment logged its HTTP requests (the ServerApp, the SuperNodes, their SuperExecs and the ClientApps
    each appear), the rounds' requests are counted, and bad arguments are refused before anything starts."""
    bench = load("benchmarks/flower_requests.py")
    out = bench.main(["--nodes", "2", "--rounds", "2", "--cores", "1", "--out", str(tmp_path)])
    summary = out["summary"]
    assert summary["rounds"] == 2
    roles = {key.split()[0] for key in summary["requests"]}
    assert {"flwr-serverapp", "flower-supernode", "flower-superexec", "flwr-clientapp"} <= roles
    assert summary["requests"]["flwr-serverapp /v1/runtime/push-messages"]["per_round"] == 1
    assert summary["requests"]["flwr-clientapp /v1/runtime/push-messages"]["per_round"] == 2  # a node each
    assert "| flwr-clientapp | `/v1/runtime/push-messages` | 2.0 |" in (tmp_path / "flower_requests.md").read_text()
    with pytest.raises(SystemExit, match="--cores: an integer in 1"):
        bench.main(["--cores", "0"])
