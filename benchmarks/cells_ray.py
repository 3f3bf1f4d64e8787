"""A small CPU grid's cells, locally and on a two-node local Ray cluster: the speed-up and the per-cell overhead.

    python benchmarks/cells_ray.py      -> benchmarks/results/cells_ray.{json,md} (docs/running.md shows the table)

The grid: charles_fig12 at the smoke profile with 8 client learning rates x 2 tasks (16 cells), at 8 rounds
(cells of about 0.4 s here) and at 48 (about 2.5 s). For each, three runs of the same cells into empty stores
(``pflkit.cells.run_cells``, the stage's own ``compute_cells``), one thread per process:

- local, one call per task (the default: a task's cells batched in one ``run_grid``);
- local, one call per cell (the unit Ray dispatches);
- Ray, one task per cell, on ``ray.cluster_utils.Cluster``: a head without CPUs and two one-CPU worker nodes on
  the loopback (the cluster's start is not counted).

Overhead per cell on Ray = (workers x wall - the cells' own compute seconds, as the workers timed them) / cells:
dispatch, a worker's start and imports, the task's data set-up, the result's trip back and its write to the
store. The results of the three runs are checked equal (they must be: tests/integration/test_cells_ray.py).
Needs the Flower extra (Ray): ``make flower``. Run it on an idle machine.
"""
from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import torch  # noqa: E402

from pflkit import cells  # noqa: E402
from pflkit.experiments import charles_nn as E  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
GAMMAS = [0.0, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0]
ROUNDS = (8, 48)
WORKERS = 2


def grid(rounds: int):
    cfg = E.CharlesFig12Config.from_namespace({"stage": "charles_fig12", "profile": "smoke",
                                               "results_dir": "build/bench/cells_ray/charles_fig12"})
    cfg = cfg.model_copy(update={"gammas": GAMMAS, "tasks": {k: t.model_copy(update={"rounds": rounds})
                                                            for k, t in cfg.tasks.items()}})
    settings = [E.Setting(gamma=g, eta=cfg.eta) for g in GAMMAS]
    everything = [c for name, t in cfg.tasks.items() for c in E.grid_cells(cfg, name, settings,
                                                                             E._task_setup(cfg, t)[1])]
    return cfg, everything


def run(cfg, everything, executor: cells.Executor, pack_size):
    with tempfile.TemporaryDirectory() as tmp:
        store = cells.CellStore(tmp)
        start = time.perf_counter()
        done = cells.run_cells(cfg.stage, everything, E.compute_cells, cfg, store=store, executor=executor,
                               pack_size=pack_size, log=lambda _: None)
        wall = time.perf_counter() - start
    compute = sum(record["seconds"] for record, _ in done.results)
    return wall, compute, done


def same(a, b) -> bool:
    return all(ra["history"] == rb["history"] and all(torch.equal(ta[k], tb[k]) for k in ta)
               for (ra, ta), (rb, tb) in zip(a.results, b.results))


def measure(rounds: int, address: str) -> dict:
    """The three runs of the grid at ``rounds`` rounds (Ray: the cluster at ``address``); their results must agree."""
    cfg, everything = grid(rounds)
    E._KEPT.clear()
    local_task = run(cfg, everything, cells.Executor("local"), None)
    E._KEPT.clear()
    local_cell = run(cfg, everything, cells.Executor("local"), 1)
    on_ray = run(cfg, everything, cells.Executor("ray", address), 1)
    assert same(local_task[2], on_ray[2]) and same(local_cell[2], on_ray[2]), "results differ between executors"
    n = len(everything)
    return {"rounds": rounds, "cells": n, "local_batched_s": local_task[0], "local_per_cell_s": local_cell[0],
            "ray_s": on_ray[0], "cell_compute_local_s": local_cell[1] / n, "cell_compute_ray_s": on_ray[1] / n,
            "speedup_vs_local_per_cell": local_cell[0] / on_ray[0],
            "speedup_vs_local_batched": local_task[0] / on_ray[0],
            "overhead_per_cell_s": (WORKERS * on_ray[0] - on_ray[1]) / n, "ray_places": len(set(on_ray[2].where))}


def main() -> dict:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "node_ip_address": "127.0.0.1",
                                                            "include_dashboard": False})
    try:
        for _ in range(WORKERS):
            cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        rows = [measure(r, cluster.address) for r in ROUNDS]
    finally:
        cluster.shutdown()
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    out = {"workers": WORKERS, "rows": rows, "machine": machine,
           "overhead_per_cell_s": round(max(r["overhead_per_cell_s"] for r in rows), 2)}
    (RESULTS / "cells_ray.json").write_text(json.dumps(out, indent=1) + "\n")
    lines = ["| rounds | a cell's compute, local (s) | local, a task's cells in one call (s) | local, one call per "
             f"cell (s) | Ray, {WORKERS} workers, one task per cell (s) | speed-up vs one call per cell | overhead "
             "per cell (s) |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['rounds']} | {r['cell_compute_local_s']:.2f} | {r['local_batched_s']:.1f} | "
              f"{r['local_per_cell_s']:.1f} | {r['ray_s']:.1f} | {r['speedup_vs_local_per_cell']:.2f}x | "
              f"{r['overhead_per_cell_s']:.2f} |" for r in rows]
    lines += ["", f"{rows[0]['cells']} cells (charles_fig12 at the smoke profile, {len(GAMMAS)} client learning rates "
              f"x 2 tasks; one thread per process) on {machine}: a Ray cluster of a head without CPUs and {WORKERS} "
              "one-CPU worker nodes, all on this machine beside the driver. Overhead per cell = (workers x Ray's "
              "wall - the cells' compute as the workers timed it) / cells: dispatch, a worker's start and imports, "
              "the task's data set-up, the result back, the store write. Every run's results are identical. "
              "Generated by benchmarks/cells_ray.py."]
    (RESULTS / "cells_ray.md").write_text("\n".join(lines) + "\n")
    return out


if __name__ == "__main__":
    main()
    print((RESULTS / "cells_ray.md").read_text())
