"""Every request of a floor deployment, timed: what a deployment round costs at Flower's HTTP APIs.

    python benchmarks/flower_requests.py [--nodes 10] [--rounds 5] [--cores 2] [--out benchmarks/results]

Runs benchmarks/flower_floor.py's deployment (TLS, node authentication, stock SuperNodes, a ClientApp that
answers at once with a payload of the size it got: the model-sized message) while every Python process of it times each
HTTP request it makes. A ``sitecustomize`` module on the deployment's ``PYTHONPATH`` wraps ``httpx.Client.send``
(Flower 1.42's SuperNodes, SuperExec, ClientApps and ServerApp talk to the SuperLink and to their SuperNode
over HTTP through httpx) and appends one line per request to the file named by ``PFLKIT_REQUEST_LOG``; it does
nothing without that variable. Timing adds work to every process, so the rounds here are slower than
flower_floor.py's: read this for where a round goes, that one for how long it takes.

Per round (a round starts when the ServerApp pushes its messages, and the last ends with the ServerApp's last
request; the first round of each payload, which may meet nodes still starting, is left out), by the process that
asked and the API path:

* **requests** per round, and the seconds those requests took (their sum: the processes ask concurrently);
* **object waits**: a process that asks for a message's object before its sender has pushed it waits and asks
  again (Flower's ``pull_objects``: 1 s at first, doubling, in every process: pflkit changes none). Counted as
  two asks for objects by one process in one round with no other request between them and more than ``--gap``
  seconds from the end of one to the start of the next.

Writes ``<out>/flower_requests.json`` and ``<out>/flower_requests.md`` and prints the table.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
import tempfile
from pathlib import Path

from pflkit.device import cpu_model
from pflkit.io import write_report

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the sibling benchmark modules
from flower_floor import FLOOR_ROWS, measure  # noqa: E402  (its deployment, run here with every request timed)

LOG_VARIABLE = "PFLKIT_REQUEST_LOG"
#: the hook every process of the deployment imports at start (Python imports ``sitecustomize`` by itself)
HOOK = f'''
import os
import sys
import time

if os.environ.get("{LOG_VARIABLE}"):
    import httpx

    _send = httpx.Client.send

    def send(self, request, *args, **kwargs):
        start = time.time()
        try:
            return _send(self, request, *args, **kwargs)
        finally:
            end = time.time()
            role = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
            with open(os.environ["{LOG_VARIABLE}"], "a") as log:
                log.write(f"{{start:.6f}} {{end - start:.6f}} {{os.getpid()}} {{role}} {{request.url.path}}\\n")

    httpx.Client.send = send
'''
ROUND_START = ("flwr-serverapp", "/v1/runtime/push-messages")
OBJECT_PULLS = ("/v1/fleet/pull-object", "/v1/runtime/pull-object")


def read_log(text: str) -> list[tuple[float, float, int, str, str]]:
    """The log's requests (start, seconds, pid, role, path), by start time."""
    rows = []
    for line in text.splitlines():
        start, seconds, pid, role, path = line.split()
        rows.append((float(start), float(seconds), int(pid), role, path))
    return sorted(rows)


def summarize(rows: list[tuple[float, float, int, str, str]], skip: set[int], gap: float) -> dict:
    """Requests, their seconds and the object waits per round, by role and path, over the rounds whose index
    (0-based, in order of the ServerApp's pushes) is not in ``skip``. The last round ends with the ServerApp's
    last request: what comes after it (the deployment's teardown, its nodes polling meanwhile) is no round's."""
    end = max((r[0] for r in rows if r[3] == ROUND_START[0]), default=math.inf)
    rows = [r for r in rows if r[0] <= end]
    starts = [r[0] for r in rows if (r[3], r[4]) == ROUND_START]
    counted = [i for i in range(len(starts)) if i not in skip]
    if not counted:
        raise ValueError(f"the log has {len(starts)} rounds, none left after leaving out {sorted(skip)}")
    requests, seconds, waits, waited = (collections.Counter() for _ in range(4))
    last: dict[int, tuple[int, str, float]] = {}  # pid -> (round, path, end) of its previous request
    for start, took, pid, role, path in rows:
        index = sum(s <= start for s in starts) - 1
        previous = last.get(pid)
        last[pid] = (index, path, start + took)
        if index not in counted:
            continue
        key = f"{role} {path}"
        requests[key] += 1
        seconds[key] += took
        if path in OBJECT_PULLS and previous and previous[:2] == (index, path) and start - previous[2] > gap:
            waits[role] += 1
            waited[role] += start - previous[2]
    n = len(counted)
    return {"rounds": n,
            "requests": {k: {"per_round": requests[k] / n, "seconds_per_round": seconds[k] / n}
                         for k in sorted(requests, key=lambda k: -requests[k])},
            "object_waits": {r: {"per_round": waits[r] / n, "seconds_per_round": waited[r] / n} for r in sorted(waits)},
            "round_seconds": [starts[i + 1] - starts[i] for i in counted if i + 1 < len(starts)]}


def table(out: dict) -> str:
    s = out["summary"]
    total = sum(v["per_round"] for v in s["requests"].values())
    rows = [f"{out['nodes']} SuperNodes on {out['machine']}, the deployment pinned to {out['cores']} cores; "
            f"{s['rounds']} rounds of {out['floats']:,} float32 each way (a ClientApp that answers at once), every "
            f"process timing each HTTP request it makes (slower than benchmarks/flower_floor.py's rounds: "
            f"{sum(s['round_seconds']) / max(1, len(s['round_seconds'])):.2f} s per round here). "
            f"{total:,.0f} requests per round, {total / out['nodes']:.0f} per node.",
            "", "| process | API path | requests / round | request seconds / round |", "|---|---|---|---|"]
    for key, v in s["requests"].items():
        role, path = key.split(" ", 1)
        rows.append(f"| {role} | `{path}` | {v['per_round']:.1f} | {v['seconds_per_round']:.3f} |")
    rows += ["", f"Object waits (an object asked for again after more than {out['gap']} s): "
             + ("; ".join(f"{r} {v['per_round']:.1f} per round, {v['seconds_per_round']:.2f} s"
                          for r, v in s["object_waits"].items()) or "none") + "."]
    return "\n".join(rows) + "\n"


def floor_skip(rounds: int) -> set[int]:
    """The round indices to leave out of a floor run's log: the floor sends ``rounds + 1`` messages per row of
    ``FLOOR_ROWS``, in that order; only the model row's rounds count, its first (nodes still starting) left out."""
    group = rounds + 1
    first = [k for k, *_ in FLOOR_ROWS].index("model") * group
    return set(range(len(FLOOR_ROWS) * group)) - set(range(first + 1, first + group))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--gap", type=float, default=0.3, help="seconds between two asks for objects that count as a wait")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    if not 1 <= args.cores <= len(os.sched_getaffinity(0)):
        raise SystemExit(f"--cores: an integer in 1..{len(os.sched_getaffinity(0))}, got {args.cores}")
    if args.nodes < 1 or args.rounds < 1:
        raise SystemExit(f"--nodes and --rounds: integers >= 1, got {args.nodes} and {args.rounds}")
    flower = json.loads((ROOT / "benchmarks" / "results" / "flower.json").read_text())
    floats = next(m["num_parameters"] for r in flower["runs"] for m in r["methods"] if m["method"] == "FedAvg")
    with tempfile.TemporaryDirectory(prefix="pflkit-requests-") as tmp:
        (Path(tmp) / "sitecustomize.py").write_text(HOOK)
        log = Path(tmp) / "requests.log"
        saved = {k: os.environ.get(k) for k in ("PYTHONPATH", LOG_VARIABLE)}
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (tmp, saved["PYTHONPATH"]) if p)
        os.environ[LOG_VARIABLE] = str(log)
        try:
            measure(args.nodes, args.rounds, int(floats), args.cores)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k)
                else:
                    os.environ[k] = v
        rows = read_log(log.read_text())
    skip = floor_skip(args.rounds)
    out = {"nodes": args.nodes, "cores": args.cores, "floats": int(floats), "gap": args.gap,
           "machine": f"{cpu_model() or 'this machine'}, {os.cpu_count()} cores",
           "summary": summarize(rows, skip, args.gap)}
    md = table(out)
    write_report(args.out, "flower_requests", out, md)
    print(md)
    return out


if __name__ == "__main__":
    main()
