"""Thread policy: a stage's wall time quiet and with the other core busy, by torch CPU thread count.

    python benchmarks/threads.py [--stage perm_fig1] [--threads default,1,2] [--out benchmarks/results]
    python benchmarks/threads.py --quick --out /tmp/bench      # seconds: tiny scale (what the test runs)

Each point runs the stage's experiment at params.yaml scale (nothing written to results/) in a fresh
process, once on a quiet machine and once while another process keeps one core busy
(``python -c "while True: pass"``, the load that made ``perm_fig1`` take 555 s instead of 35 s).
Thread counts: ``default`` is what the stage did before the ``threads`` setting existed (torch's own
choice: one OpenMP thread per core); a number is the setting ``threads: <n>``. Writes
``<out>/threads.json`` and ``<out>/threads.md`` and prints the table. A timing benchmark, not a test:
run it on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: stage -> (experiment module, function, tiny overrides for --quick)
STAGES = {
    "perm_fig1": ("pflkit.experiments.perm", "fig1",
                  {"num_clients": 4, "samples_per_client": 40, "rounds": 6, "local_steps": 2, "seeds": [0],
                   "eval_every": 1, "perm_torchfed": {"warmup_rounds": 1}}),
}


def point(stage: str, threads: str, quick: bool) -> float:
    """Run the stage's experiment once in this process; seconds."""
    import importlib

    import torch

    from pflkit.config import load_params, validate_stage

    if threads != "default":
        torch.set_num_threads(int(threads))
    module, func, tiny = STAGES[stage]
    params = load_params(ROOT / "params.yaml")
    if quick:
        params[stage] = {**params[stage], **tiny}
    params[stage] = {**params[stage], "device": "cpu"}
    cfg = validate_stage(params, stage)
    experiment = getattr(importlib.import_module(module), func)
    start = time.perf_counter()
    experiment(cfg, show_progress=False, checkpoint=False)
    return time.perf_counter() - start


def measure(stage: str, threads: str, busy: bool, quick: bool, timeout: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    load = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        cmd = [sys.executable, __file__, "--point", f"{stage}:{threads}"] + (["--quick"] if quick else [])
        start = time.perf_counter()
        try:
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=True)
            seconds, status = float(out.stdout.strip().splitlines()[-1]), "ok"
        except subprocess.TimeoutExpired:
            seconds, status = time.perf_counter() - start, f"stopped after {timeout:g} s"
    finally:
        if load is not None:
            load.kill()
            load.wait()
    return {"stage": stage, "threads": threads, "busy_core": busy, "seconds": round(seconds, 2), "status": status}


def table(rows: list[dict]) -> str:
    lines = ["| stage | torch threads | other core | wall time (s) | note |", "|---|---|---|---|---|"]
    for r in rows:
        label = "default (before: one per core)" if r["threads"] == "default" else r["threads"]
        note = "" if r["status"] == "ok" else r["status"]
        lines.append(f"| {r['stage']} | {label} | {'busy' if r['busy_core'] else 'idle'} | "
                     f"{r['seconds']:.1f} | {note} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", default="perm_fig1", choices=sorted(STAGES))
    p.add_argument("--threads", default="default,1,2")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before a point is stopped")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--quick", action="store_true", help="tiny scale: checks the code, not speed")
    p.add_argument("--point", help=argparse.SUPPRESS)  # internal: one measurement in this process
    a = p.parse_args(argv)
    if a.point:
        stage, threads = a.point.split(":")
        print(point(stage, threads, a.quick))
        return {}
    rows = [measure(a.stage, t, busy, a.quick, a.timeout)
            for busy in (False, True) for t in a.threads.split(",")]
    import torch

    from pflkit.io import write_report
    res = {"machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                       "cpus": os.cpu_count(), "torch": torch.__version__}, "quick": a.quick, "rows": rows}
    write_report(a.out, "threads", res, table(rows) + "\n")
    print(table(rows))
    return res


if __name__ == "__main__":
    main()
