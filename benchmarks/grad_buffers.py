"""A CNN's minibatch gradient into reused buffers (``FunctionalModel.batched_grad(..., out=)``) against a fresh
gradient per call, on perm_fig2's paper-profile CNN (conv32-conv64-fc512, 50 clients, batch 10, random 28 x 28
images), and what it does to the client steps that take a gradient per step.

    python benchmarks/grad_buffers.py [--threads 1,2] [--repeats 7] [--quick] [--out benchmarks/results]

Rows, per thread count (repeats interleaved, so a change in machine load hits every row alike; medians):
* one ``batched_grad``, fresh (``out=None``) and into one set of buffers;
* a pFedMe inner step (a gradient and the prox update) and a Per-FedAvg (FO) local step (two gradients and
  two updates): ``client_updates`` of 2 local steps x 5 inner steps, and of 4 local steps, divided by its
  steps (its set-up, the copies of the global model and the buffers, shared out), with fresh gradients (the
  method as it was: ``batched_grad`` monkeypatched to drop ``out``) and with buffers (as it is).

A fresh [50, 512, 3136] weight gradient is 320 MB, above glibc's largest mmap threshold (32 MB), so every
call gets new pages from the OS and faults them in; buffers are faulted once. Writes
``<out>/grad_buffers.{json,md}``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))
from speed import machine_info, time_it  # noqa: E402

from pflkit.algorithms.perfedavg import PerFedAvg  # noqa: E402
from pflkit.algorithms.pfedme import PFedMe  # noqa: E402
from pflkit.data import FederatedDataset  # noqa: E402
from pflkit.engine import FunctionalModel, broadcast  # noqa: E402
from pflkit.io import write_report  # noqa: E402
from pflkit.models import cnn  # noqa: E402

ROWS = ("gradient", "pFedMe inner step", "Per-FedAvg (FO) local step")


def workload(quick: bool) -> dict:
    if quick:
        return {"channels": (2, 4), "hidden": 8, "clients": 3, "batch": 4, "samples": 12}
    return {"channels": (32, 64), "hidden": 512, "clients": 50, "batch": 10, "samples": 40}


def _without_out(model: FunctionalModel):
    """``model.batched_grad`` that ignores ``out``: a fresh gradient per call, as before the buffers."""
    plain = model.batched_grad
    return lambda params, x, y, out=None: plain(params, x, y)


def measure(w: dict, threads: int, repeats: int) -> dict:
    torch.set_num_threads(threads)
    model = FunctionalModel(lambda: cnn((1, 28, 28), 10, w["channels"], w["hidden"]))
    g = torch.Generator().manual_seed(0)
    n, b = w["clients"], w["batch"]
    clients = [(torch.randn(w["samples"], 1, 28, 28, generator=g), torch.randint(0, 10, (w["samples"],), generator=g))
               for _ in range(n)]
    data = FederatedDataset.from_client_arrays(clients, clients, 10, "random 28 x 28")
    params = {k: v.clone() for k, v in broadcast(model.init(0), n).items()}
    x, y = torch.randn(n, b, 1, 28, 28, generator=g), torch.randint(0, 10, (n, b), generator=g)
    buffers = {k: torch.empty_like(v) for k, v in params.items()}
    pfedme = PFedMe(model, lr=0.1, personal_lr=0.05, lam=15.0, local_steps=2, inner_steps=5, batch_size=b)
    perfedavg = PerFedAvg(model, alpha=0.05, beta=0.3, local_steps=4, batch_size=b)
    w0, clients_all = model.init(0), torch.arange(n)

    def step(algo, fresh: bool):
        def run():
            if fresh:
                model.batched_grad = _without_out(model)
            try:
                algo.client_updates(w0, data, clients_all, torch.Generator().manual_seed(1))
            finally:
                model.__dict__.pop("batched_grad", None)
        return run

    cases = {("gradient", "fresh"): lambda: model.batched_grad(params, x, y),
             ("gradient", "buffers"): lambda: model.batched_grad(params, x, y, out=buffers),
             ("pFedMe inner step", "fresh"): step(pfedme, True),
             ("pFedMe inner step", "buffers"): step(pfedme, False),
             ("Per-FedAvg (FO) local step", "fresh"): step(perfedavg, True),
             ("Per-FedAvg (FO) local step", "buffers"): step(perfedavg, False)}
    times: dict = {key: [] for key in cases}
    for fn in cases.values():  # warm-up
        fn()
    for _ in range(repeats):
        for key, fn in cases.items():
            times[key] += time_it(fn, 1, torch.device("cpu"))
    per = {"gradient": 1, "pFedMe inner step": pfedme.local_steps * pfedme.inner_steps,
           "Per-FedAvg (FO) local step": perfedavg.local_steps}
    return {row: {kind: statistics.median(times[(row, kind)]) / per[row] for kind in ("fresh", "buffers")}
            for row in ROWS}


def markdown(res: dict) -> str:
    m, w = res["machine"], res["workload"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}; written by benchmarks/grad_buffers.py.", "",
             f"CNN conv{w['channels'][0]}-conv{w['channels'][1]}-fc{w['hidden']}, {w['clients']} clients, batch "
             f"{w['batch']}, random 28 x 28 images; median of {res['repeats']} interleaved repeats; the steps: "
             "client_updates of 2 x 5 pFedMe inner steps or 4 Per-FedAvg steps, divided by the steps.", "",
             "| row | threads | fresh gradient per call | into buffers | speedup |", "|---|---|---|---|---|"]
    for threads, rows in res["threads"].items():
        for row, t in rows.items():
            lines.append(f"| {row} | {threads} | {t['fresh'] * 1e3:,.0f} ms | {t['buffers'] * 1e3:,.0f} ms | "
                         f"{t['fresh'] / t['buffers']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks the code in seconds")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args(argv)
    w = workload(args.quick)
    res = {"machine": machine_info(torch.device("cpu")), "workload": w, "repeats": args.repeats,
           "threads": {int(t): measure(w, int(t), args.repeats) for t in args.threads.split(",")}}
    write_report(args.out, "grad_buffers", res, markdown(res))
    print(markdown(res))
    return res


if __name__ == "__main__":
    main()
