"""Time one FedAvg round, batched engine vs the reference per-client loop (same arithmetic, same draws).

    python benchmarks/fedavg_round.py [--clients 50] [--steps 20] [--repeats 5] [--device auto] [--threads N]

Workload: PERM's synthetic data (d = 60, 500 samples/client), logistic regression, batch 20.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from pflkit.algorithms import FedAvg
from pflkit.data import perm_synthetic
from pflkit.engine import FunctionalModel, resolve_device
from pflkit.models import logistic
from pflkit.reference import fedavg as ref


def _time(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        out.append(time.perf_counter() - start)
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    device = resolve_device(a.device)
    data = perm_synthetic(a.clients, 500, 60, seed=0).to(device)
    factory = lambda: logistic((60,), 2)  # noqa: E731
    algo = FedAvg(FunctionalModel(factory, device), local_steps=a.steps, lr=0.1, batch_size=a.batch_size)
    state = algo.init(data, 0)
    algo.round(state)  # warm-up (vmap tracing, allocator)
    batched = _time(lambda: algo.round(state), a.repeats)
    loop = _time(lambda: ref.fedavg(factory, state.w, data, 1, a.steps, 0.1, a.batch_size, seed=0),
                 max(1, a.repeats // 2 + 1))
    row = {"workload": f"synthetic logistic, N={a.clients}, K={a.steps}, B={a.batch_size}",
           "device": str(device), "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
           "batched_s_median": statistics.median(batched), "loop_s_median": statistics.median(loop)}
    row["speedup"] = row["loop_s_median"] / row["batched_s_median"]
    print(f"FedAvg round — {row['workload']} on {row['device']} ({row['threads']} threads)")
    print(f"  batched engine : {row['batched_s_median'] * 1e3:8.1f} ms  (median of {len(batched)}, "
          f"min {min(batched) * 1e3:.1f}, max {max(batched) * 1e3:.1f})")
    print(f"  reference loop : {row['loop_s_median'] * 1e3:8.1f} ms  (median of {len(loop)})")
    print(f"  speedup        : {row['speedup']:8.1f}x")
    return row


if __name__ == "__main__":
    main()
