"""A small CPU grid's cells, locally and on a two-node local Ray cluster: the speed-up and the per-cell overhead.

    python benchmarks/cells_ray.py      -> benchmarks/results/cells_ray.{json,md} (docs/running.md shows the table)

The grid: charles_fig12 at the smoke profile with 8 client learning rates x 2 tasks and 8 rounds (16 cells of
about a second each here). Three runs of the same cells into empty stores (``pflkit.cells.run_cells``, the
stage's own ``compute_cells``), one thread per process:

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
ROUNDS = 8
WORKERS = 2


def grid():
    cfg = E.CharlesFig12Config.from_namespace({"stage": "charles_fig12", "profile": "smoke",
                                               "results_dir": "build/bench/cells_ray/charles_fig12"})
    cfg = cfg.model_copy(update={"gammas": GAMMAS, "tasks": {k: t.model_copy(update={"rounds": ROUNDS})
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


def main() -> dict:
    from ray.cluster_utils import Cluster

    cfg, everything = grid()
    n = len(everything)
    E._KEPT.clear()
    local_task = run(cfg, everything, cells.Executor("local"), None)
    E._KEPT.clear()
    local_cell = run(cfg, everything, cells.Executor("local"), 1)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "node_ip_address": "127.0.0.1",
                                                            "include_dashboard": False})
    try:
        for _ in range(WORKERS):
            cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        on_ray = run(cfg, everything, cells.Executor("ray", cluster.address), 1)
    finally:
        cluster.shutdown()
    assert same(local_task[2], on_ray[2]) and same(local_cell[2], on_ray[2]), "results differ between executors"
    overhead = (WORKERS * on_ray[0] - on_ray[1]) / n
    rows = [{"run": "local, a task's cells in one call", "wall_s": local_task[0], "compute_s": local_task[1]},
            {"run": "local, one call per cell", "wall_s": local_cell[0], "compute_s": local_cell[1]},
            {"run": f"Ray, {WORKERS} worker nodes x 1 CPU, one task per cell", "wall_s": on_ray[0],
             "compute_s": on_ray[1]}]
    out = {"cells": n, "rounds": ROUNDS, "workers": WORKERS, "rows": rows,
           "speedup_vs_local_per_cell": local_cell[0] / on_ray[0],
           "speedup_vs_local_batched": local_task[0] / on_ray[0],
           "overhead_per_cell_s": round(overhead, 2), "cell_compute_s": round(on_ray[1] / n, 2),
           "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
           "ray_places": len(set(on_ray[2].where))}
    (RESULTS / "cells_ray.json").write_text(json.dumps(out, indent=1) + "\n")
    lines = ["| run | wall (s) | the cells' own compute (s) |", "|---|---|---|"]
    lines += [f"| {r['run']} | {r['wall_s']:.1f} | {r['compute_s']:.1f} |" for r in rows]
    lines += ["", f"{n} cells (charles_fig12, smoke, {len(GAMMAS)} client learning rates x 2 tasks, {ROUNDS} rounds; "
              f"one thread per process) on {out['machine']}. Speed-up on {WORKERS} workers: "
              f"{out['speedup_vs_local_per_cell']:.2f}x against local one call per cell, "
              f"{out['speedup_vs_local_batched']:.2f}x against local batched. Overhead per cell on Ray: "
              f"{overhead:.2f} s (dispatch, a worker's start and imports, data set-up, the result back, the store "
              f"write) against {out['cell_compute_s']:.2f} s of the cell's own compute. Every run's results are "
              "identical. Generated by benchmarks/cells_ray.py."]
    (RESULTS / "cells_ray.md").write_text("\n".join(lines) + "\n")
    return out


if __name__ == "__main__":
    main()
    print((RESULTS / "cells_ray.md").read_text())
