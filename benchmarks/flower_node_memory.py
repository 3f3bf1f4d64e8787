"""What one SuperNode costs in memory on Flower's deployment engine, per process role, idle (no run):

    python benchmarks/flower_node_memory.py [--nodes 3] [--out benchmarks/results]

Starts a ``pflkit.flower.deployment.Deployment`` of ``--nodes`` SuperNodes (insecure: TLS changes no process)
(stock Flower: each SuperNode's own SuperExec starts a ClientApp process per message), waits until every
process is up, and sums
the proportional set size (PSS: a shared page counted once over the processes that share it, unlike the RSS
sums of benchmarks/flower.py) of every process per role. The ClientApps themselves come and go per message
and are not counted. Writes ``flower_node_memory.{json,md}``: per role, per node for the roles every node has
and once for the roles the deployment has once, and what N nodes would hold (the roles it has once, plus N
times a node's), next to the machine's memory.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from pflkit.io import write_report  # noqa: E402
SETTLE_SECONDS = 8.0
PROJECT = (10, 50, 100)
#: roles a deployment has once, whatever its number of nodes
ONCE = ("SuperLink", "SuperLink's SuperExec", "pflkit's SuperExec (every node)", "fork server (torch imported)",
        "resource tracker")


def role(proc: psutil.Process, link_pid: int) -> str:
    cmd = " ".join(proc.cmdline())
    if "flower-superlink" in cmd:
        return "SuperLink"
    if "flower-supernode" in cmd:
        return "SuperNode"
    if "multiprocessing.forkserver" in cmd:
        return "fork server (torch imported)"
    if "multiprocessing.resource_tracker" in cmd:
        return "resource tracker"
    if "pflkit.flower.superexec" in cmd:
        return "pflkit's SuperExec (every node)"
    if "flower-superexec" in cmd:
        return "SuperLink's SuperExec" if proc.ppid() == link_pid else "SuperNode's SuperExec"
    return "other: " + cmd[:60]


def measure(nodes: int, clientapps: str = "per-message") -> dict:
    from pflkit.flower.deployment import Deployment
    with Deployment(nodes, insecure=True) as dep:
        time.sleep(SETTLE_SECONDS)  # the SuperExecs (and fork servers) start after the SuperNodes listen
        link_pid = dep.procs["superlink"].pid
        mb: dict[str, float] = {}
        count: dict[str, int] = {}
        for pid in dep.pids():
            try:
                proc = psutil.Process(pid)
                name, pss = role(proc, link_pid), proc.memory_full_info().pss / 2**20
            except psutil.Error:
                continue
            mb[name] = mb.get(name, 0.0) + pss
            count[name] = count.get(name, 0) + 1
    once = {k: v for k, v in mb.items() if k in ONCE}
    per_node = {k: v / nodes for k, v in mb.items() if k not in once}
    return {"clientapps": clientapps, "nodes": nodes, "pss_mb": mb, "processes": count, "once_mb": once,
            "shared_mb": sum(once.values()), "per_node_mb": per_node, "node_mb": sum(per_node.values())}


def markdown(res: dict) -> str:
    total = psutil.virtual_memory().total / 2**30
    lines = [f"Idle deployments of {res['runs'][0]['nodes']} SuperNodes on this machine ({total:.0f} GiB of memory), "
             "PSS summed per process role (MB; ClientApps not counted: they live for one message).", "",
             "| ClientApps | role | processes | MB once | MB per node |", "|---|---|---|---|---|"]
    for r in res["runs"]:
        for name, mb in sorted(r["once_mb"].items()):
            lines.append(f"| {r['clientapps']} | {name} | {r['processes'][name]} | {mb:,.0f} | |")
        for name, mb in sorted(r["per_node_mb"].items()):
            lines.append(f"| {r['clientapps']} | {name} | {r['processes'][name]} | | {mb:,.0f} |")
        lines.append(f"| {r['clientapps']} | **all roles** | | **{r['shared_mb']:,.0f}** | **{r['node_mb']:,.0f}** |")
    lines += ["", "| ClientApps | " + " | ".join(f"{n} nodes, GiB" for n in PROJECT) + " |",
              "|---|" + "---|" * len(PROJECT)]
    for r in res["runs"]:
        lines.append(f"| {r['clientapps']} | " + " | ".join(
            f"{(r['shared_mb'] + n * r['node_mb']) / 1024:.1f}" for n in PROJECT) + " |")
    lines += ["", "N nodes: the roles a deployment has once plus N times a node's, before any ClientApp runs."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    a = p.parse_args(argv)
    if a.nodes < 1:
        p.error(f"--nodes must be at least 1, got {a.nodes}")
    res = {"runs": [measure(a.nodes)]}
    text = markdown(res)
    write_report(a.out, "flower_node_memory", res, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
