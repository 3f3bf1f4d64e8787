"""The floor of a deployment round on this machine: Flower's transport and ClientApp start-up with no work at all.

    python benchmarks/flower_floor.py [--nodes 10] [--rounds 10] [--cores 1,2] [--out benchmarks/results]
                                      [--simulation benchmarks/results/flower.json]

Issue 32 asks for a 10-client deployment round within 5x of the simulation round (benchmarks/flower.py). This
benchmark measures what no change to pflkit's methods can remove: pflkit's deployment (``Deployment``, exactly
as ``deploy`` starts it: TLS, SuperNode authentication, forked ClientApps, polls that back off) runs a
ServerApp that sends every node one message per round and a ClientApp that answers at once (no data, no model,
no computation). Each round is timed from the first message pushed to the last reply pulled, through pflkit's
``PollingGrid`` as pflkit's ServerApp does; the first round is left out (it may meet nodes still starting).
Messages are pflkit's own (``pflkit.flower.apps.job_content`` and ``reply_content``), with two payloads: no
tensors, and one float32 tensor of the size of benchmarks/flower.py's model (its ``num_parameters``) sent, and
another of that size, of fresh values, returned, as a FedAvg round carries them. Each runs with the deployment pinned to
one core, then to all (``--cores``): how the floor moves with the cores it gets.

Writes ``<out>/flower_floor.json`` and ``<out>/flower_floor.md`` (docs/flower.md's block) and prints the table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from pflkit.device import cpu_model
from pflkit.io import write_report

ROOT = Path(__file__).resolve().parents[1]
#: the app the deployment runs instead of pflkit's: a module of the App Bundle's folder (Flower loads it from there)
APP = '''
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from pflkit.flower.apps import PollingGrid, job_content, job_from, reply_content
from pflkit.flower.client import Job, Reply

client_app = ClientApp()


@client_app.train()
def train(message: Message, context: Context) -> Message:
    job = job_from(message)  # no work: a reply of the same size, its own values (no object shared)
    rng = np.random.default_rng()
    arrays = {k: torch.from_numpy(rng.random(v.numel(), np.float32)) for k, v in job.arrays.items()}
    return Message(reply_content(Reply(arrays, {"seconds": 0.0})), reply_to=message)


server_app = ServerApp()


def cpu_jiffies():
    """(busy, total) jiffies of the cores this process may run on (its affinity, which the whole deployment
    shares), from /proc/stat's per-core lines."""
    cores = {f"cpu{i}" for i in os.sched_getaffinity(0)}
    busy = total = 0
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if name in cores:
            values = [int(v) for v in values]
            total += sum(values)
            busy += sum(values) - values[3] - values[4]  # all but idle and iowait
    return busy, total


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    nodes, deadline = [], time.monotonic() + 300
    while len(nodes) < int(cfg["nodes"]) and time.monotonic() < deadline:
        nodes = sorted(grid.get_node_ids())
        time.sleep(0.2)
    grid = PollingGrid(grid)
    out = {}
    for name, size in (("empty", 0), ("model", int(cfg["floats"]))):
        times, busy = [], []  # the first round apart: it may meet nodes still starting
        for _ in range(int(cfg["rounds"]) + 1):
            content = job_content(Job({"model.x": torch.zeros(size)} if size else {}, {"kind": "train", "round": 0}))
            t, c = time.perf_counter(), cpu_jiffies()
            replies = list(grid.send_and_receive(
                [Message(content, dst_node_id=n, message_type="train") for n in nodes], timeout=120))
            times.append(time.perf_counter() - t)
            c2 = cpu_jiffies()
            busy.append((c2[0] - c[0]) / max(1, c2[1] - c[1]))
            if len(replies) != len(nodes) or any(r.has_error() for r in replies):
                raise RuntimeError(f"{len(replies)} of {len(nodes)} replies, errors: "
                                   f"{[r.error.reason for r in replies if r.has_error()]}")
        out[name] = {"seconds": times[1:], "busy": busy[1:]}
    Path(cfg["results"]).write_text(json.dumps(out))
'''


def bundle(folder: Path, nodes: int, rounds: int, floats: int, results: Path) -> Path:
    """The App Bundle: floor_app.py and a pyproject naming its apps (pflkit's ``app_bundle``, other components)."""
    import tomli_w

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "floor_app.py").write_text(APP)
    (folder / "pyproject.toml").write_text(tomli_w.dumps({
        "build-system": {"requires": ["setuptools>=68"], "build-backend": "setuptools.build_meta"},
        "project": {"name": "floor-app", "version": "1.0.0", "license": "MIT", "dependencies": ["flwr>=1.42"],
                    "description": "a deployment round with no work (benchmarks/flower_floor.py)"},
        "tool": {"flwr": {"app": {"publisher": "pflkit",
                                  "components": {"serverapp": "floor_app:server_app",
                                                 "clientapp": "floor_app:client_app"},
                                  "config": {"nodes": nodes, "rounds": rounds, "floats": floats,
                                             "results": str(results)}}}}}))
    return folder


def measure(nodes: int, rounds: int, floats: int, cores: int) -> dict:
    """The floor run on the first ``cores`` of this process's cores: every process of the deployment inherits
    that affinity."""
    from pflkit.flower.deployment import CONNECTION, Deployment, _tool

    allowed = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, allowed[:cores])
    try:
        with tempfile.TemporaryDirectory(prefix="pflkit-floor-") as workdir, Deployment(nodes, workdir) as dep:
            results = dep.workdir / "floor.json"
            folder = bundle(dep.workdir / "floor-app", nodes, rounds, floats, results)
            proc = dep._spawn("flwr-run-floor", [_tool("flwr"), "run", str(folder), CONNECTION, "--stream"])
            deadline = time.monotonic() + 600
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
            if not results.exists():
                raise RuntimeError("the floor run failed:\n" + dep.log_tail("flwr-run-floor", 60))
            seconds = json.loads(results.read_text())
    finally:
        os.sched_setaffinity(0, allowed)
    if dep.leftover:
        raise RuntimeError(f"processes left behind: {dep.leftover}")
    return seconds


def table(out: dict) -> str:
    rows = ["| cores | message | rounds | s / round (mean) | min | max | vs simulation round (FedAvg) | cores busy |",
            "|---|---|---|---|---|---|---|---|"]
    for cores, by_payload in out["seconds"].items():
        for name, label in (("empty", "empty"), ("model", f"{out['floats']:,} float32 each way")):
            t, busy = by_payload[name]["seconds"], by_payload[name]["busy"]
            rows.append(f"| {cores} | {label} | {len(t)} | {statistics.mean(t):.3f} | {min(t):.3f} | {max(t):.3f} | "
                        f"{statistics.mean(t) / out['simulation_round']:.0f}x | {100 * statistics.mean(busy):.0f}% |")
    head = (f"{out['nodes']} SuperNodes on {out['machine']} (load average {out['load'][0]:.2f} at start, "
            f"{out['load'][1]:.2f} at end): pflkit's deployment (TLS, node authentication, forked ClientApps), "
            f"a ClientApp that answers at once (pflkit's messages). The simulation round: benchmarks/flower.md's "
            f"FedAvg row, {out['simulation_round']:.3f} s ({out['nodes']} clients, mean of its rounds); 5x of it is "
            f"{5 * out['simulation_round']:.3f} s. Cores: the deployment's processes pinned to that many of the "
            f"machine's cores; cores busy: the share of their time spent outside idle during the timed rounds "
            f"(/proc/stat).")
    return head + "\n\n" + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--cores", default=f"1,{len(os.sched_getaffinity(0))}",
                    help="comma-separated core counts to pin the deployment to, one run each (default: 1 and all)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--simulation", type=Path, default=ROOT / "benchmarks" / "results" / "flower.json",
                    help="benchmarks/flower.py's results: the simulation round to compare with")
    args = ap.parse_args(argv)
    available = len(os.sched_getaffinity(0))
    try:
        cores = sorted({int(c) for c in args.cores.split(",")})
    except ValueError:
        cores = []
    if not cores or not all(1 <= c <= available for c in cores):
        raise SystemExit(f"--cores: comma-separated integers in 1..{available}, got {args.cores!r}")
    flower = json.loads(args.simulation.read_text())
    sim = next((m for r in flower["runs"] if r["engine"] == "simulation" and r["clients"] == args.nodes
                for m in r["methods"] if m["method"] == "FedAvg"), None)
    if sim is None:
        raise SystemExit(f"--nodes {args.nodes}: {args.simulation} has no simulation run of that many "
                         f"clients to compare with; allowed: "
                         f"{sorted(r['clients'] for r in flower['runs'] if r['engine'] == 'simulation')}")
    cpu = cpu_model() or "this machine"
    load0 = os.getloadavg()[0]
    seconds = {str(c): measure(args.nodes, args.rounds, int(sim["num_parameters"]), c) for c in cores}
    out = {"nodes": args.nodes, "floats": int(sim["num_parameters"]), "seconds": seconds,
           "simulation_round": statistics.mean(sim["round_seconds"]), "machine": f"{cpu}, {os.cpu_count()} cores",
           "load": [load0, os.getloadavg()[0]]}
    md = table(out)
    write_report(args.out, "flower_floor", out, md)
    print(md)
    return out


if __name__ == "__main__":
    main()
