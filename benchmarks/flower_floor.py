"""Stock Flower's floor of a deployment round on this machine, beside pflkit's FedAvg and PERM rounds in the same run.

    python benchmarks/flower_floor.py [--nodes 10] [--rounds 5] [--cores 2] [--out benchmarks/results]
                                      [--simulation benchmarks/results/flower.json] [--floor-only] [--profile smoke]

One deployment (``pflkit.flower.deployment.Deployment``, as ``deploy`` starts it: TLS, SuperNode authentication,
Flower's own ``flower-superlink`` and ``flower-supernode``, whose SuperExec starts a ClientApp process for every
message) runs, one after the other:

* **the floor**: a Flower App of Flower's public API only (``APP``: no pflkit code), a ServerApp that sends every
  node one message per round and a ClientApp that answers at once (no data, no model, no computation). Its
  messages are Flower's own records, with two payloads: none, and one float32 ``Array`` of the size of the
  flower_equivalence model (benchmarks/flower.json's ``num_parameters``) sent, and another of that size, of fresh
  values, returned, as a FedAvg round carries them. Each round is timed from the first message pushed to the last
  reply pulled, the replies pulled every ``POLL`` s (as pflkit's ServerApp does: ``apps.POLL_SECONDS``); and once
  more with the model payload through Flower's own ``Grid.send_and_receive``, which waits 3 s between pulls.
  The first round of each is left out (it may meet nodes still starting).
* **pflkit**: the flower_equivalence stage's FedAvg and PERM (params.yaml's default profile, ``--nodes`` clients,
  ``--rounds`` rounds; each SuperNode holds its partition) through pflkit's App. A round's seconds are its
  training passes (PERM: with its global step and alpha update when due); its floor is the floor's model round
  times those passes, and its own compute the in-process round of benchmarks/flower.json (every client at once).

Every process of the deployment is pinned to the first ``--cores`` of this process's cores. Writes
``<out>/flower_floor.json`` and ``<out>/flower_floor.md`` (docs/flower.md's block) and prints the table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pflkit.device import cpu_model
from pflkit.io import write_report

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the sibling benchmark modules (flower.py: the stage's work)
#: seconds between the floor ServerApp's pulls (pflkit's ServerApp polls as often: ``apps.POLL_SECONDS``)
POLL = 0.05
#: the app the deployment runs for the floor: Flower's public API only, a module of the App Bundle's folder
APP = '''
import json
import os
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

client_app = ClientApp()


@client_app.train()
def train(message: Message, context: Context) -> Message:
    if message.content["config"]["import"]:  # the floor of a ClientApp of an ML library: its import, no work
        import torch  # noqa: F401
    rng = np.random.default_rng()  # no work: a reply of the same size, its own values (no object shared)
    arrays = {k: Array.from_numpy_ndarray(rng.random(a.numpy().size, np.float32))
              for k, a in message.content["arrays"].items()}
    return Message(RecordDict({"arrays": ArrayRecord(arrays), "metrics": MetricRecord({"seconds": 0.0})}),
                   reply_to=message)


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


def polled(grid, messages, timeout, poll):
    """Push, then pull every ``poll`` s until every reply is in (Flower's public Grid API)."""
    waiting, got, end = set(grid.push_messages(messages)), [], time.monotonic() + timeout
    while waiting and time.monotonic() < end:
        replies = list(grid.pull_messages(waiting))
        got += replies
        waiting.difference_update(m.metadata.reply_to_message_id for m in replies)
        if waiting:
            time.sleep(poll)
    return got


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    nodes, deadline = [], time.monotonic() + 300
    while len(nodes) < int(cfg["nodes"]) and time.monotonic() < deadline:
        nodes = sorted(grid.get_node_ids())
        time.sleep(0.2)
    out = {}
    floats = int(cfg["floats"])
    for name, size, flower, imports in (("empty", 0, False, 0), ("model", floats, False, 0),
                                        ("flower", floats, True, 0), ("torch", floats, False, 1)):
        times, busy = [], []  # the first round apart: it may meet nodes still starting
        for _ in range(int(cfg["rounds"]) + 1):
            arrays = ArrayRecord({"x": Array.from_numpy_ndarray(np.zeros(size, np.float32))} if size else {})
            config = ConfigRecord({"round": 0, "import": imports})
            messages = [Message(RecordDict({"arrays": arrays, "config": config}), dst_node_id=n, message_type="train")
                        for n in nodes]
            t, c = time.perf_counter(), cpu_jiffies()
            replies = list(grid.send_and_receive(messages, timeout=300) if flower
                           else polled(grid, messages, 300, float(cfg["poll"])))
            times.append(time.perf_counter() - t)
            c2 = cpu_jiffies()
            busy.append((c2[0] - c[0]) / max(1, c2[1] - c[1]))
            if len(replies) != len(nodes) or any(r.has_error() for r in replies):
                raise RuntimeError(f"{len(replies)} of {len(nodes)} replies, errors: "
                                   f"{[r.error.reason for r in replies if r.has_error()]}")
        out[name] = {"seconds": times[1:], "busy": busy[1:]}
    Path(cfg["results"]).write_text(json.dumps(out))
'''
#: the floor's rows: key, what it sends, how the ServerApp waits for the replies
FLOOR_ROWS = (("empty", "empty", f"pulled every {POLL:g} s"), ("model", "{floats:,} float32 each way",
              f"pulled every {POLL:g} s"), ("flower", "{floats:,} float32 each way",
              "Flower's send_and_receive (3 s between pulls)"),
              ("torch", "{floats:,} float32 each way, the ClientApp imports torch", f"pulled every {POLL:g} s"))


def bundle(folder: Path, nodes: int, rounds: int, floats: int, results: Path) -> Path:
    """The floor's App Bundle: floor_app.py and a pyproject naming its apps."""
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
                                  "config": {"nodes": nodes, "rounds": rounds, "floats": floats, "poll": POLL,
                                             "results": str(results)}}}}}))
    return folder


def pflkit_specs(nodes: int, rounds: int, profile: str = "default") -> list:
    """The flower_equivalence stage's FedAvg and PERM (params.yaml's ``profile``: default, or smoke's small
    sizes) with ``nodes`` clients and ``rounds`` rounds, evaluated at the start and the end (benchmarks/flower.py's
    work)."""
    import torch

    from flower import config  # benchmarks/flower.py

    from pflkit.engine import FunctionalModel
    from pflkit.experiments.flower import specs_for
    from pflkit.models import logistic

    torch.set_num_threads(1)
    cfg = config(nodes, rounds, profile == "smoke")
    model = FunctionalModel(lambda: logistic((cfg.dim,), 2), "cpu")
    return [spec for _, spec in specs_for(cfg, 0, model).values()]


def measure(nodes: int, rounds: int, floats: int, cores: int, specs: list | None = None) -> dict:
    """The floor run (and, with ``specs``, pflkit's run of them: ``pflkit``, the ServerApp's results) on one
    deployment pinned to the first ``cores`` of this process's cores: every process of it inherits that
    affinity. Raises when a process is left behind."""
    from pflkit.flower.deployment import CONNECTION, Deployment, _tool

    allowed = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, allowed[:cores])
    try:
        with tempfile.TemporaryDirectory(prefix="pflkit-floor-") as workdir:
            dep = Deployment(nodes, workdir)
            if specs:
                dep.hold_data(specs[0].federation(), specs[0].federation_key())
            with dep:
                results = dep.workdir / "floor.json"
                folder = bundle(dep.workdir / "floor-app", nodes, rounds, floats, results)
                proc = dep._spawn("flwr-run-floor", [_tool("flwr"), "run", str(folder), CONNECTION, "--stream"])
                deadline = time.monotonic() + 3600
                while proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.5)
                if not results.exists():
                    raise RuntimeError("the floor run failed:\n" + dep.log_tail("flwr-run-floor", 60))
                out = json.loads(results.read_text())
                if specs:
                    ran = dep.run(specs, timeout=3600)
                    out["pflkit"] = [{"method": r["spec"]["label"], "round_seconds": list(r["round_seconds"].values()),
                                      "passes": passes_per_round(r["traffic"], r["spec"]["rounds"])}
                                     for r in ran["runs"]]
    finally:
        os.sched_setaffinity(0, allowed)
    if dep.leftover:
        raise RuntimeError(f"processes left behind: {dep.leftover}")
    return out


def passes_per_round(traffic: list[dict], rounds: int) -> list[int]:
    """The training passes of each round 1..rounds (the ServerApp's traffic rows: one per pass)."""
    return [sum(1 for t in traffic if t["round"] == r and t["kind"] == "train") for r in range(1, rounds + 1)]


def table(out: dict) -> str:
    sim, floats = out["simulation_round"], out["floats"]
    rows = ["| run | message | replies | rounds | s / round (mean) | min | max | cores busy |",
            "|---|---|---|---|---|---|---|---|"]
    for key, label, how in FLOOR_ROWS:
        if key not in out["floor"]:
            continue
        t, busy = out["floor"][key]["seconds"], out["floor"][key]["busy"]
        rows.append(f"| floor | {label.format(floats=floats)} | {how} | {len(t)} | {statistics.mean(t):.3f} | "
                    f"{min(t):.3f} | {max(t):.3f} | {100 * statistics.mean(busy):.0f}% |")
    floor = statistics.mean(out["floor"]["model"]["seconds"])
    text = (f"{out['nodes']} SuperNodes on {out['machine']}, the deployment pinned to {out['cores']} of them (load "
            f"average {out['load'][0]:.2f} at start, {out['load'][1]:.2f} at end): stock Flower 1.42 (TLS, SuperNode "
            f"authentication, a ClientApp process per message). Floor: a Flower App that answers at once (Flower's "
            f"public API only). The simulation round: benchmarks/flower.md's FedAvg row, {sim:.3f} s "
            f"({out['nodes']} clients).\n\n" + "\n".join(rows) + "\n")
    if out.get("pflkit"):
        torch_floor = statistics.mean(out["floor"]["torch"]["seconds"]) if "torch" in out["floor"] else None
        lines = ["| method | rounds | training passes / round | s / round (mean) | floor x passes | + in-process round "
                 "| x (floor + compute) | x (torch floor + compute) | x simulation round |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for m in out["pflkit"]:
            t, passes = m["round_seconds"], statistics.mean(m["passes"])
            own = out["in_process"].get(m["method"], 0.0)
            mean = statistics.mean(t)
            with_torch = f"{mean / (torch_floor * passes + own):.2f}x" if torch_floor else "not run"
            lines.append(f"| {m['method']} | {len(t)} | {passes:.1f} | {mean:.3f} | {floor * passes:.3f} | {own:.3f} "
                         f"| {mean / (floor * passes + own):.2f}x | {with_torch} | {mean / sim:.0f}x |")
        text += ("\npflkit's rounds on the same deployment (the flower_equivalence stage's work, "
                 f"{out['profile']} profile, {out['nodes']} clients, each SuperNode holding its partition; pflkit's "
                 "ClientApps import torch): floor x passes is the floor's model round times the round's training "
                 "passes (PERM's global step and alpha update add passes when due); + in-process round: "
                 "benchmarks/flower.md's in-process round of the method, every client's compute at once; the torch "
                 "floor is the floor whose ClientApp imports torch before it answers.\n\n" + "\n".join(lines) + "\n")
    return text


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cores", default=str(len(os.sched_getaffinity(0))),
                    help="the number of this machine's cores to pin the deployment to (default: all)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--simulation", type=Path, default=ROOT / "benchmarks" / "results" / "flower.json",
                    help="benchmarks/flower.py's results: the simulation and in-process rounds to compare with")
    ap.add_argument("--floor-only", action="store_true", help="the floor without pflkit's rounds")
    ap.add_argument("--profile", choices=["default", "smoke"], default="default",
                    help="params.yaml profile of pflkit's work (smoke: its small sizes, for the test)")
    args = ap.parse_args(argv)
    available = len(os.sched_getaffinity(0))
    cores = int(args.cores) if args.cores.isdigit() else 0
    if not 1 <= cores <= available:
        raise SystemExit(f"--cores: an integer in 1..{available}, got {args.cores!r}")
    if args.rounds < 1 or args.nodes < 2:
        raise SystemExit(f"--rounds: an integer >= 1 and --nodes: an integer >= 2, got {args.rounds}, {args.nodes}")
    flower = json.loads(args.simulation.read_text())

    def rows(engine):
        return {m["method"]: statistics.mean(m["round_seconds"]) for r in flower["runs"]
                if r["engine"] == engine and r["clients"] == args.nodes for m in r["methods"]}

    sim, params = rows("simulation"), next((m["num_parameters"] for r in flower["runs"] if r["engine"] == "simulation"
                                            and r["clients"] == args.nodes for m in r["methods"]), None)
    if "FedAvg" not in sim:
        raise SystemExit(f"--nodes {args.nodes}: {args.simulation} has no simulation run of that many "
                         f"clients to compare with; allowed: "
                         f"{sorted(r['clients'] for r in flower['runs'] if r['engine'] == 'simulation')}")
    cpu = cpu_model() or "this machine"
    load0 = os.getloadavg()[0]
    specs = None if args.floor_only else pflkit_specs(args.nodes, args.rounds, args.profile)
    measured = measure(args.nodes, args.rounds, int(params), cores, specs)
    out = {"nodes": args.nodes, "cores": cores, "floats": int(params), "simulation_round": sim["FedAvg"],
           "in_process": rows("in-process"), "machine": f"{cpu}, {os.cpu_count()} cores",
           "load": [load0, os.getloadavg()[0]], "floor": {k: v for k, v in measured.items() if k != "pflkit"},
           "pflkit": measured.get("pflkit", []), "profile": args.profile}
    md = table(out)
    write_report(args.out, "flower_floor", out, md)
    print(md)
    return out


if __name__ == "__main__":
    main()
