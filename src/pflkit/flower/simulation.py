"""Flower's simulation engine (Ray backend): the ServerApp in a thread of this process, every client a
virtual SuperNode whose ClientApp runs in a pool of Ray actors (``num_cpus`` of them, one CPU each).
Ray is started here (``start_ray``: a small object store, no dashboard) before Flower's backend would, so
that a start-up Ray gives up on is retried and, failing that, reported as a :class:`RayStartError` that
names the fix; Flower's backend shuts Ray down at the end, also when the run fails. Ray's node serves on the
loopback only (``LOOPBACK``)."""
from __future__ import annotations

import logging
import os
import sys
import time

from ..checks import check_int
from . import OFFLINE_ENV, require_flower
from .spec import RunSpec, specs_to_json

#: how often ``start_ray`` tries: Ray gives its node a fixed 30 s to register (``ray/_private/node.py``),
#: which a loaded machine can miss once and then make
RAY_START_ATTEMPTS = 3
#: the address Ray's node serves on: this machine's loopback, so that the simulation is reachable from no other
LOOPBACK = "127.0.0.1"


class RayStartError(RuntimeError):
    """Ray, Flower's simulation backend, did not start: says how often it was tried, how busy the machine
    was, and what to do instead."""


def start_ray(init_args: dict, attempts: int = RAY_START_ATTEMPTS) -> None:
    """``ray.init(**init_args)`` (with this process's import path for the workers, as Flower's backend
    passes it), tried up to ``attempts`` times; raises :class:`RayStartError` when every try failed.
    Does nothing when Ray is already running (Flower's backend then uses it as it is)."""
    import ray

    if ray.is_initialized():
        return
    pythonpath = os.pathsep.join(filter(None, [*sys.path, os.environ.get("PYTHONPATH")]))
    failures = []
    for _ in range(attempts):
        try:
            ray.init(runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}, **init_args)
            return
        except Exception as exc:  # Ray raises a bare Exception when its node misses the start-up window
            failures.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            ray.shutdown()
    load = os.getloadavg()[0]
    raise RayStartError(
        f"Flower's simulation engine could not start Ray ({attempts} tries; last: {failures[-1]}). "
        f"Load average {load:.1f} on {os.cpu_count()} cores: Ray's processes must register within 30 s "
        "(fixed in Ray), which a busy machine misses. Fix: run it again when fewer jobs run (check `uptime`), "
        "or use the deployment engine instead (`python -m pflkit.flower deploy`, or flower_equivalence.engines: "
        "[deployment] in params.yaml), or skip Flower's engines (flower_equivalence.engines: [])")


def simulate(specs: list[RunSpec], *, num_cpus: int = 2, object_store_mb: int = 256, quiet: bool = True) -> dict:
    """Run ``specs`` (one or more methods on one federation, one after the other) on the simulation engine;
    returns what the ServerApp reports (``apps.serve``: per run its history, per-round seconds, traffic;
    the final states) plus ``wall_seconds`` of the whole call (Ray's start-up included). A run that fails
    raises the ServerApp's error (``FederationError``, ``RejectedReply``, ``DivergenceError``: which client,
    node, round and pass)."""
    require_flower()
    check_int("num_cpus", num_cpus, 1, "an integer >= 1 (Ray actors, one CPU each)")
    check_int("object_store_mb", object_store_mb, 80, "an integer >= 80 (Ray's minimum)")

    # offline before Flower and Ray start: Flower reads its switches when flwr is first imported (below), Ray
    # at ray.init, and Ray's workers inherit this process's environment
    os.environ.update(OFFLINE_ENV)
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # CPU only: Ray leaves device variables alone
    from flwr.simulation import run_simulation

    from .apps import client_app, server_app

    if quiet:
        logging.getLogger("flwr").setLevel(logging.WARNING)
    results: dict = {}
    specs = [specs] if isinstance(specs, RunSpec) else list(specs)
    text = specs_to_json(specs)
    num_nodes = specs[0].federation().num_clients
    backend = {"init_args": {"num_cpus": num_cpus, "num_gpus": 0, "object_store_memory": object_store_mb * 2**20,
                             "include_dashboard": False, "logging_level": logging.ERROR, "log_to_driver": not quiet,
                             "_node_ip_address": LOOPBACK},
               "client_resources": {"num_cpus": 1, "num_gpus": 0.0}}
    start = time.perf_counter()
    start_ray(backend["init_args"])
    run_simulation(server_app=server_app(text, results), client_app=client_app(text), num_supernodes=num_nodes,
                   backend_name="ray", backend_config=backend)
    if "error" in results:  # the ServerApp's own error (a client named, a divergence), as the other engines raise it
        raise results["error"]
    if "runs" not in results:
        raise RuntimeError("the simulation ended without results (the ServerApp failed: see the log above)")
    results["wall_seconds"] = time.perf_counter() - start
    results["engine"] = "simulation"
    return results
