"""Flower's simulation engine (Ray backend): the ServerApp in a thread of this process, every client a
virtual SuperNode whose ClientApp runs in a pool of Ray actors (``num_cpus`` of them, one CPU each).
Ray is started with a small object store and no dashboard, and shut down at the end (Flower's backend
does so, also when the run fails)."""
from __future__ import annotations

import time

from . import require_flower
from .spec import RunSpec, specs_to_json


def simulate(specs: list[RunSpec], *, num_cpus: int = 2, object_store_mb: int = 256, quiet: bool = True) -> dict:
    """Run ``specs`` (one or more methods on one federation, one after the other) on the simulation engine;
    returns what the ServerApp reports (``apps.serve``: per run its history, per-round seconds, traffic;
    the final states) plus ``wall_seconds`` of the whole call (Ray's start-up included)."""
    require_flower()
    if isinstance(num_cpus, bool) or not isinstance(num_cpus, int) or num_cpus < 1:
        raise ValueError(f"num_cpus must be an integer >= 1 (Ray actors, one CPU each), got {num_cpus!r}")
    if isinstance(object_store_mb, bool) or not isinstance(object_store_mb, int) or object_store_mb < 80:
        raise ValueError(f"object_store_mb must be an integer >= 80 (Ray's minimum), got {object_store_mb!r}")
    import logging
    import os

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
                             "include_dashboard": False, "logging_level": logging.ERROR, "log_to_driver": not quiet},
               "client_resources": {"num_cpus": 1, "num_gpus": 0.0}}
    start = time.perf_counter()
    run_simulation(server_app=server_app(text, results), client_app=client_app(text), num_supernodes=num_nodes,
                   backend_name="ray", backend_config=backend)
    if "runs" not in results:
        raise RuntimeError("the simulation ended without results (the ServerApp failed: see the log above)")
    results["wall_seconds"] = time.perf_counter() - start
    results["engine"] = "simulation"
    return results
