"""Flower's deployment engine on this machine: one SuperLink and N SuperNodes as separate local processes
on 127.0.0.1 (free ports), the run submitted with ``flwr run`` as a Flower App Bundle.

``Deployment`` starts every process in its own process group and keeps their PIDs (also in
``<workdir>/pids.json``), records every process they start while it lives (``reaper.Descendants``, every
``WATCH_SECONDS``: Flower starts some in sessions of their own, and one whose parent dies is reparented to
init, out of reach of a process tree), and ``stop()`` ends every group and every recorded descendant (SIGTERM,
then SIGKILL after a grace period) and checks that none of their processes is left. When one of its processes
dies (the SuperLink, a SuperNode), the deployment says so in one line on stderr (which, when,
how: ``deaths``) and ends at once every process that one had started; a run whose SuperLink died stops with
that line as its error; it runs on leaving the ``with`` block, on an error, on
SIGTERM/SIGINT of the launcher, and at interpreter exit. Where none of those can run (the launcher killed
with SIGKILL, or a stage runner killed while its kernel holds the deployment), a watchdog process started
first (``reaper``) sees its owner gone and ends every process the deployment started. Every process is
stock Flower: ``flower-superlink`` (its SuperExec runs the ServerApp in a child process, ``flwr-serverapp``) and
one ``flower-supernode`` per client (its SuperExec starts a ``flwr-clientapp`` process for every message), started
with Flower's own options (TLS, ``--enable-supernode-auth``, ``flwr supernode register``); nothing of Flower is
patched, replaced or subclassed.

The App Bundle is written per run into ``<workdir>/pflkit-app``: pflkit's Flower App (the components and
the run config of pyproject.toml's ``[tool.flwr.app]``: ``pflkit.flower.apps:flower_server_app`` /
``flower_client_app``, imported from this environment, where pflkit is installed: nothing is installed at run
time) whose run config carries the ``RunSpec`` JSON (``specs``) and the results file the ServerApp writes.
Flower's home (``FLWR_HOME``: its config with the connection to this SuperLink, installed apps) is
``<workdir>/flwr-home``, never ``~/.flwr``.
``deploy`` gives every SuperNode its own data (``Deployment.hold_data``): client j's rows in
``<workdir>/node-data/partition-<j>.pt``, named by ``data-path`` in the node's config.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import torch

from ..checks import check_int
from ..data.federated import FederatedDataset
from ..io import write_text
from . import OFFLINE_ENV, require_flower
from .client import write_partitions
from .credentials import Credentials, make_credentials
from .reaper import Descendants, running
from .spec import RunSpec, specs_to_json

CONNECTION = "pflkit-local"
#: seconds a process group gets between SIGTERM and SIGKILL
GRACE_SECONDS = 10.0
#: seconds added per SuperNode to the wait for the deployment's processes to start (default startup_timeout)
STARTUP_SECONDS_PER_NODE = 1.0
#: seconds between the looks at the deployment's processes (their descendants recorded, a death noticed)
WATCH_SECONDS = 0.25


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 now (the OS picks them)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _tool(name: str) -> str:
    """A Flower command of this environment (beside its python), else from PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else name


def app_bundle(folder: Path, specs: list[RunSpec], results: Path) -> Path:
    """Write the Flower App directory for one run (see the module docstring)."""
    import tomli_w

    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "build-system": {"requires": ["setuptools>=68"], "build-backend": "setuptools.build_meta"},
        "project": {"name": "pflkit-app", "version": "1.0.0", "license": "MIT",
                    "description": "pflkit's methods on Flower (pflkit.flower.apps)", "dependencies": ["flwr>=1.42"]},
        "tool": {"flwr": {"app": {"publisher": "pflkit",
                                  "components": {"serverapp": "pflkit.flower.apps:flower_server_app",
                                                 "clientapp": "pflkit.flower.apps:flower_client_app"},
                                  "config": {"specs": specs_to_json(specs), "results": str(results)}}}},
    }
    (folder / "pyproject.toml").write_text(tomli_w.dumps(config))
    return folder


class Deployment:
    """A SuperLink and ``num_nodes`` SuperNodes (partition-id 0..N-1) on 127.0.0.1; use as a context
    manager. ``workdir``: logs, pids.json, Flower's home and the app (default: a new temp folder).

    Secure by default: TLS between the SuperLink and its SuperNodes and ``flwr``, and SuperNode
    authentication (only the nodes whose public keys were registered may join), with credentials made for
    the run (``credentials.make_credentials`` in ``<workdir>/credentials``) or given as ``credentials``
    (real certificates). ``insecure=True`` turns both off: plain-text gRPC that any local process may join,
    for local experiments only."""

    def __init__(self, num_nodes: int, workdir: str | Path | None = None, startup_timeout: float | None = None,
                 threads: int = 1, insecure: bool = False, credentials: Credentials | None = None):
        require_flower()
        if insecure and credentials is not None:
            raise ValueError("insecure=True runs without TLS and authentication: it takes no credentials")
        self.num_nodes = check_int("num_nodes", num_nodes, 1)
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="pflkit-flower-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        # each SuperNode's start costs CPU time (Python's and Flower's imports), so the wait for processes to
        # start grows with the node count
        self.startup_timeout = float(60.0 + STARTUP_SECONDS_PER_NODE * num_nodes if startup_timeout is None
                                     else startup_timeout)
        self.home = self.workdir / "flwr-home"
        self.procs: dict[str, subprocess.Popen] = {}
        self._logs: list = []
        # the SuperLink and SuperNodes start flower-superexec, flwr-serverapp and flwr-clientapp by name
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        self.env = {**os.environ, **OFFLINE_ENV, "PATH": path, "FLWR_HOME": str(self.home),
                    "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
        self.port: int | None = None
        self.insecure = bool(insecure)
        self.credentials = credentials
        self.started_seconds: float | None = None
        self.leftover: list[int] = []  # PIDs still alive after the last stop()
        self._old_handlers: dict = {}
        self._reaper: subprocess.Popen | None = None
        self.node_data: list[Path] | None = None  # node j's data file (hold_data), named in its node config
        self.descendants = Descendants(self.workdir / "descendants.json")  # every process they started
        self.deaths: dict[str, str] = {}  # process name -> the line that said it died
        self._expected: set[str] = set()  # processes ended on purpose (kill_node, stop): no death to report
        self._stopped = threading.Event()
        self._watcher: threading.Thread | None = None

    def hold_data(self, whole: FederatedDataset, key: str) -> None:
        """Before ``start``: write each client's partition of ``whole`` (the federation ``key`` names) to
        ``<workdir>/node-data/partition-<j>.pt`` and start SuperNode j with ``data-path`` naming its file, as a
        real SuperNode holds its own data: its ClientApps read that file instead of rebuilding the federation
        (every message, since each ClientApp is a new process)."""
        if whole.num_clients != self.num_nodes:
            raise ValueError(f"the federation has {whole.num_clients} clients for {self.num_nodes} SuperNodes")
        self.node_data = write_partitions(whole, key, self.workdir / "node-data")

    # ------------------------------------------------------------------ processes
    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "w")
        self._logs.append(log)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir,
                                start_new_session=True)  # its own process group: stop() ends it and its children
        self.procs[name] = proc
        self._write_pids()
        return proc

    def _write_pids(self) -> None:
        # atomically: the reaper never reads half a file
        write_text(self.workdir / "pids.json", json.dumps({n: p.pid for n, p in self.procs.items()}, indent=1))

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def start(self) -> "Deployment":
        t0 = time.perf_counter()
        self._install_handlers()
        self._start_reaper()
        ports = free_ports(self.num_nodes + 1)
        self.port = ports[0]
        self.home.mkdir(parents=True, exist_ok=True)
        if not self.insecure and self.credentials is None:
            self.credentials = make_credentials(self.workdir / "credentials", self.num_nodes)
        cred = self.credentials
        security = ("insecure = true" if self.insecure else f'root-certificates = "{cred.ca_cert}"')
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\n{security}\n')
        link_security = ["--insecure"] if self.insecure else [
            "--ssl-ca-certfile", str(cred.ca_cert), "--ssl-certfile", str(cred.server_cert),
            "--ssl-keyfile", str(cred.server_key), "--enable-supernode-auth"]
        try:
            link = self._spawn("superlink", [_tool("flower-superlink"), *link_security, "--host", "127.0.0.1",
                                             "--port", str(self.port), "--disable-runtime-dependency-installation"])
            self._wait(lambda: _listening(self.port), "the SuperLink to listen on port %d" % self.port, [link])
            if not self.insecure:
                for j in range(self.num_nodes):
                    self.register(cred.node_public_key(j))
            for j in range(self.num_nodes):
                node_security = ["--insecure"] if self.insecure else [
                    "--root-certificates", str(cred.ca_cert), "--auth-supernode-private-key", str(cred.node_keys[j])]
                self._spawn(f"supernode-{j}", [
                    _tool("flower-supernode"), *node_security, "--superlink", f"127.0.0.1:{self.port}",
                    "--host", "127.0.0.1", "--port", str(ports[j + 1]),
                    "--node-config", f"partition-id={j} num-partitions={self.num_nodes}" + (
                        "" if self.node_data is None else f" data-path={json.dumps(str(self.node_data[j]))}")])
            nodes = [p for n, p in self.procs.items() if n.startswith("supernode")]
            self._wait(lambda: all(_listening(ports[j + 1]) for j in range(self.num_nodes)),
                       "every SuperNode to start", nodes + [link])
        except BaseException:
            self.stop()
            raise
        self._start_watch()
        self.started_seconds = time.perf_counter() - t0
        return self

    # ------------------------------------------------------------------ the watch
    def _start_watch(self) -> None:
        self._stopped.clear()
        self._watcher = threading.Thread(target=self._watch, name="pflkit deployment watch", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        """Every ``WATCH_SECONDS`` until ``stop``: record the descendants of every running process, and end
        those of one that died (``_died``)."""
        while not self._stopped.wait(WATCH_SECONDS):
            self.look()

    def look(self) -> None:
        """One look: the running processes' descendants recorded, a newly ended process reported and the
        processes it started ended."""
        procs = dict(self.procs)
        self.descendants.record({n: p.pid for n, p in procs.items() if p.poll() is None})
        for name, proc in procs.items():
            if proc.poll() is not None and name not in self.deaths and not self._stopped.is_set():
                self._died(name, proc)

    def _died(self, name: str, proc: subprocess.Popen) -> None:
        """``name`` has ended: say so in one line (unless it was meant to: ``kill_node``, a finished ``flwr
        run``) and end every process it had started."""
        code = proc.returncode
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        line = f"pflkit deployment: {name} (pid {proc.pid}) died at {datetime.now():%H:%M:%S} ({how})"
        left = self.descendants.alive(name)
        if left:
            line += f"; ending the {len(left)} process(es) it had started ({', '.join(_named(p) for p in left)})"
        self.deaths[name] = line
        if name not in self._expected and not name.startswith("flwr-run"):
            print(line, file=sys.stderr, flush=True)
        self.descendants.end(name, GRACE_SECONDS)

    def _start_reaper(self) -> None:
        """The watchdog (``reaper``) that ends this deployment's processes if this process dies first."""
        import psutil

        (self.workdir / "stopped").unlink(missing_ok=True)
        self._write_pids()
        owner = psutil.Process()
        self._reaper = subprocess.Popen(
            [sys.executable, "-m", "pflkit.flower.reaper", str(owner.pid), repr(owner.create_time()),
             str(self.workdir / "pids.json")], env=self.env, cwd=self.workdir, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _wait(self, ready, what: str, procs: list[subprocess.Popen]) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while not ready():
            for name, p in self.procs.items():
                if p in procs and p.poll() is not None:
                    raise RuntimeError(f"{name} exited with code {p.returncode} while waiting for {what}:\n"
                                       + self.log_tail(name))
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {self.startup_timeout:g} s waiting for {what}")
            time.sleep(0.1)

    def register(self, public_key: Path) -> None:
        """Register a SuperNode's public key with the SuperLink (``flwr supernode register``): only registered
        nodes may join a SuperLink started with ``--enable-supernode-auth``."""
        out = subprocess.run([_tool("flwr"), "supernode", "register", str(public_key), CONNECTION], env=self.env,
                             cwd=self.workdir, capture_output=True, text=True, timeout=self.startup_timeout)
        if out.returncode != 0:
            raise RuntimeError(f"registering {public_key.name} with the SuperLink failed:\n{out.stdout}{out.stderr}")

    def kill_node(self, j: int) -> int:
        """Kill SuperNode j at once (SIGKILL to its process group): a client dying mid-run. Its ClientApp, if one
        runs, fails at its next call to the node and exits; the SuperExec's loop for the node retries unanswered.
        Returns its PID."""
        node = self.procs[f"supernode-{j}"]
        self._expected.add(f"supernode-{j}")
        _signal_group(node, signal.SIGKILL)
        node.wait()
        return node.pid

    def pids(self) -> list[int]:
        """The PIDs of every process this deployment runs now: its processes and all their descendants, also
        those recorded while their parent lived (``descendants``) that outlived it."""
        import psutil

        out = [p.pid for p in self.descendants.alive()]
        for p in self.procs.values():
            try:
                root = psutil.Process(p.pid)
                out += [root.pid] + [c.pid for c in root.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        return sorted(set(out))

    def stop(self) -> list[int]:
        """End every process this deployment started and their descendants (Flower starts some detached,
        in their own sessions: flower-superexec, flwr-serverapp, flwr-clientapp): SIGTERM to every process
        group, then to each process left, SIGKILL after ``GRACE_SECONDS``; every descendant recorded while it
        lived (also one its parent left behind, reparented to init) the same way. Returns the PIDs still alive
        afterwards (none expected)."""
        import psutil

        self._expected.update(self.procs)
        self._stopped.set()
        if self._watcher is not None:
            self._watcher.join(GRACE_SECONDS + 5.0)
            self._watcher = None
        self.descendants.record({n: p.pid for n, p in self.procs.items() if p.poll() is None})
        tracked = self.descendants.alive()
        for pid in set(self.pids()) - {p.pid for p in tracked}:
            try:
                tracked.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGTERM)
        _, alive = psutil.wait_procs(tracked, timeout=GRACE_SECONDS)
        for sig, wait in ((signal.SIGTERM, GRACE_SECONDS), (signal.SIGKILL, 5.0)):
            for p in alive:
                try:
                    p.send_signal(sig)
                except psutil.NoSuchProcess:
                    pass
            _, alive = psutil.wait_procs(alive, timeout=wait)
        for proc in self.procs.values():
            try:
                proc.wait(1)
            except subprocess.TimeoutExpired:
                pass
        left = [p.pid for p in alive if running(p)]
        self.leftover = left
        if self._reaper is not None:  # stopped by its owner: the watchdog exits without touching anything
            (self.workdir / "stopped").write_text("")
            try:
                self._reaper.wait(5)
            except subprocess.TimeoutExpired:
                self._reaper.kill()
                self._reaper.wait()
            self._reaper = None
        for log in self._logs:
            log.close()
        self._logs = []
        self._restore_handlers()
        return left

    # ------------------------------------------------------------------ a run
    def submit(self, specs: list[RunSpec]) -> "Run":
        """Submit ``specs`` (one or more methods on one federation) with ``flwr run`` (its log streamed to
        ``flwr-run-<i>.log``); returns at once."""
        specs = [specs] if isinstance(specs, RunSpec) else list(specs)
        i = len([n for n in self.procs if n.startswith("flwr-run")])
        results = self.workdir / "results" / f"run-{i}.json"
        folder = app_bundle(self.workdir / "pflkit-app", specs, results)
        name = f"flwr-run-{i}"
        return Run(self, name, self._spawn(name, [_tool("flwr"), "run", str(folder), CONNECTION, "--stream"]),
                   results, specs)

    def run(self, specs: list[RunSpec], timeout: float | None = None, on_round=None) -> dict:
        """Submit ``specs``, wait for them to end and return the ServerApp's results (``Run.wait``)."""
        return self.submit(specs).wait(timeout, on_round)

    # ------------------------------------------------------------------ clean-up hooks
    def _install_handlers(self) -> None:
        atexit.register(self.stop)
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread: atexit and the with block still stop everything
                pass

    def _restore_handlers(self) -> None:
        atexit.unregister(self.stop)
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers = {}

    def _on_signal(self, signum, frame):
        self.stop()
        raise KeyboardInterrupt(f"stopped by signal {signum}")

    def __enter__(self) -> "Deployment":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class Run:
    """A submitted run: ``progress()`` (rounds done so far), ``wait()`` (its results)."""

    def __init__(self, deployment: Deployment, name: str, proc: subprocess.Popen, results: Path,
                 specs: list[RunSpec]):
        self.deployment, self.name, self.proc, self.results, self.specs = deployment, name, proc, results, specs
        self.t0 = time.perf_counter()

    def progress(self) -> int:
        """The rounds the ServerApp has finished, all its specs together (its ``.progress`` file)."""
        path = self.results.with_suffix(".progress")
        return len(path.read_text().split()) if path.exists() else 0

    def wait(self, timeout: float | None = None, on_round=None) -> dict:
        """Wait for the run to end (at most ``timeout`` seconds; default: the spec's per-pass timeout times
        a bound on its passes) and return the ServerApp's results; a run that failed raises RuntimeError
        with the end of its log (the ServerApp's error: which client, node, round and pass).
        ``on_round(done, total)`` is called whenever more rounds (all specs together) have finished."""
        limit = timeout if timeout is not None else sum(s.timeout * (4 * s.rounds + 4) for s in self.specs)
        total, seen, deadline = sum(s.rounds for s in self.specs), 0, time.monotonic() + limit
        while self.proc.poll() is None:
            if "superlink" in self.deployment.deaths:  # the run cannot go on: say why in one line
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the run did not end within {limit:g} s:\n" + self.deployment.log_tail(self.name))
            done = self.progress()
            if on_round is not None and done > seen:
                seen = done
                on_round(done, total)
            time.sleep(0.5)
        if "superlink" in self.deployment.deaths and not self.results.exists():
            raise RuntimeError(f"{self.deployment.deaths['superlink']}: the run cannot go on (its log: "
                               f"{self.deployment.workdir / (self.name + '.log')})")
        if not self.results.exists():
            log = self.deployment.log_tail(self.name, 60)
            errors = [line for line in log.splitlines() if "Error:" in line and not line.startswith(" ")]
            raise RuntimeError("the ServerApp failed" + (f": {errors[-1]}" if errors else "") + " (no results; "
                               f"`flwr run` exited with {self.proc.returncode}); the end of its log:\n" + log)

        out = json.loads(self.results.read_text())
        out["states"] = torch.load(self.results.with_suffix(".pt"), weights_only=True)
        out["wall_seconds"] = time.perf_counter() - self.t0
        out["engine"] = "deployment"
        return out


def _named(proc) -> str:
    try:
        return f"{proc.name()} pid {proc.pid}"
    except Exception:  # it ended meanwhile
        return f"pid {proc.pid}"


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the group start_new_session made: the process and its children
    except (ProcessLookupError, PermissionError):
        pass


def deploy(specs: list[RunSpec], workdir: str | Path | None = None, threads: int = 1, keep: bool = False,
           insecure: bool = False, on_round=None) -> dict:
    """Start a deployment with one SuperNode per client of the specs' federation, run them, stop
    everything; returns the results with ``startup_seconds`` (processes up) and ``leftover_pids`` (none
    expected). Prints the working folder (logs, Flower's home, the app) first. A folder this call made
    (``workdir`` None) is removed after a run that succeeded unless ``keep``; after a failure it stays,
    and the error is preceded by a line naming it. TLS and SuperNode authentication are on unless ``insecure``
    (``Deployment``); ``on_round(done, total)``: called as rounds finish (``Run.wait``)."""
    specs = [specs] if isinstance(specs, RunSpec) else list(specs)
    whole = specs[0].federation()
    dep = Deployment(whole.num_clients, workdir, threads=threads, insecure=insecure)
    dep.hold_data(whole, specs[0].federation_key())
    remove = workdir is None and not keep
    print(f"Flower deployment: working folder {dep.workdir} (logs, Flower's home, the app; "
          f"{'removed at the end unless the run fails' if remove else 'kept'})", flush=True)
    try:
        with dep:
            out = dep.run(specs, on_round=on_round)
    except BaseException:
        print(f"Flower deployment failed: its logs are in {dep.workdir}", flush=True)
        raise
    if remove:
        shutil.rmtree(dep.workdir, ignore_errors=True)
    out["leftover_pids"] = dep.leftover
    out["startup_seconds"] = dep.started_seconds
    return out
