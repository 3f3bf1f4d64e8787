"""Where a batched round's time goes: arithmetic in kernels vs Python, dispatch and launch overhead.

    python benchmarks/overhead.py [--device auto] [--threads 1] [--clients 10,50,200,1000]
    python benchmarks/overhead.py --quick --out /tmp/bench     # seconds: checks the code, not speed

For each workload of ``speed.py`` (synthetic logistic, MLP 2 x 200, CNN 8/16/64) one batched FedAvg
round (K = 20 local steps, batch 20) runs under ``torch.profiler``:

* **CPU**: kernel time = the summed time inside the outermost ``aten::`` operators (the arithmetic plus
  each op's own dispatch inside ATen, so an upper bound on arithmetic); overhead = wall time - kernel
  time (Python, the engine's loop, torch.func wrapping, and the dispatch into ATen).
* **CUDA**: kernel time = the summed device time of the CUDA kernels (the GPU is busy); overhead =
  wall time - kernel time (the GPU waits on Python, launches and host syncs).
* per local step: wall and overhead per step (the round's time / K);
* achieved GFLOP/s of the round (FLOPs counted by ``FlopCounterMode`` on one reference client step,
  times N x K) against a same-size batched matmul and the machine's large-matmul peak (``speed.py``);
* rounds per second of the synthetic FedAvg round for N in ``--clients``;
* **K steps at once vs one step at a time** (issue 20, part 2): one FedAvg round per workload with the
  default client update (``FunctionalModel(fast_steps=True)``: a dense network's K plain SGD steps in one
  ``sgd_steps`` call, ``engine.stacked``) and with the path it replaced (``fast_steps=False``: one
  ``sgd_step_`` per step, kept as the reference), side by side in one run at 1 thread, repeats
  interleaved, and the largest parameter difference after one round from the same state and draws.
  Targets: logistic >= 2.5x, MLP no slower (>= 0.95x: within timing noise), CNN >= 1.5x (issue 31: its
  K steps in ``engine.stacked_conv``, against vmap one step at a time).

Writes ``<out>/overhead_<device>.json`` and ``.md`` (next to the CPU results when run on a GPU) and
prints the markdown.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from pflkit.algorithms import FedAvg
from pflkit.engine import FunctionalModel, resolve_device
from pflkit.io import write_report

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark modules
from speed import (LR, flops_per_client_step, largest_matmul, machine_info, machine_peak,  # noqa: E402
                   matmul_ceiling, time_it, workload)

HERE = Path(__file__).resolve().parent


def kernel_seconds(prof, device) -> float:
    """Summed kernel time of a profile: CUDA kernels' device time, or the leaf aten ops' self CPU time."""
    events = prof.events()
    if device.type == "cuda":
        return sum(e.device_time_total for e in prof.key_averages() if e.device_time_total
                   and not e.key.startswith(("aten::", "cuda"))) / 1e6
    outer = [e for e in events if e.name.startswith("aten::")
             and not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"))]
    return sum(e.cpu_time_total for e in outer) / 1e6


def split_row(name: str, n: int, steps: int, batch: int, repeats: int, device, quick: bool, peak: float) -> dict:
    label, factory, data = workload(name, n, width=8 if quick else 200, quick=quick)
    data = data.to(device)
    algo = FedAvg(FunctionalModel(factory, device), local_steps=steps, lr=LR, batch_size=batch)
    state = algo.init(data, 0)
    algo.round(state)  # warm-up
    wall = statistics.median(time_it(lambda: algo.round(state), repeats, device))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        algo.round(state)
        if device.type == "cuda":
            torch.cuda.synchronize()
        profiled_wall = time.perf_counter() - start
    kernels = kernel_seconds(prof, device)
    share = min(kernels / profiled_wall, 1.0)  # the profiler slows the round: use its share, not its seconds
    flops = flops_per_client_step(factory, data, batch) * n * steps
    rows, fan_in, fan_out = largest_matmul(factory, batch, data.feature_shape)
    ceiling = matmul_ceiling(n, rows, fan_in, fan_out, device, repeats)
    achieved = flops / wall / 1e9
    return {"workload": name, "label": label, "clients": n, "local_steps": steps, "batch_size": batch,
            "device": str(device), "threads": torch.get_num_threads(), "round_s": wall,
            "step_us": wall / steps * 1e6, "kernel_share": share, "overhead_share": 1 - share,
            "overhead_per_step_us": wall * (1 - share) / steps * 1e6, "achieved_gflops": achieved,
            "same_size_bmm_gflops": ceiling, "share_of_bmm": achieved / ceiling, "machine_peak_gflops": peak,
            "share_of_peak": achieved / peak}


STEPS_TARGETS = {"synthetic": 2.5, "mlp": 0.95, "cnn": 1.5}  # reference round / new round


def steps_row(name: str, n: int, steps: int, batch: int, repeats: int, device, quick: bool) -> dict:
    """One FedAvg round, K-step client update vs one step at a time (the reference), same state and draws."""
    label, factory, data = workload(name, n, width=8 if quick else 200, quick=quick)
    data = data.to(device)
    algos = {fast: FedAvg(FunctionalModel(factory, device, fast_steps=fast), local_steps=steps, lr=LR,
                          batch_size=batch) for fast in (True, False)}
    after = {fast: algo.round(algo.init(data, 0)).w for fast, algo in algos.items()}  # same start, same draws
    diff = max((after[True][k] - after[False][k]).abs().max().item() for k in after[True])
    states = {fast: algo.init(data, 0) for fast, algo in algos.items()}
    times = {True: [], False: []}
    for _ in range(repeats):  # interleaved, so a change in machine load hits both alike
        for fast in (False, True):
            times[fast] += time_it(lambda a=algos[fast], s=states[fast]: a.round(s), 1, device)
    new, ref = (statistics.median(times[f]) for f in (True, False))
    return {"workload": name, "label": label, "clients": n, "local_steps": steps, "batch_size": batch,
            "threads": torch.get_num_threads(), "new_s": new, "reference_s": ref,
            "new_range_s": [min(times[True]), max(times[True])],
            "reference_range_s": [min(times[False]), max(times[False])], "speedup": ref / new,
            "max_abs_diff": diff, "target": STEPS_TARGETS[name], "met": ref / new >= STEPS_TARGETS[name]}


def rounds_per_second(ns, steps, batch, repeats, device, quick) -> list[dict]:
    out = []
    for n in ns:
        _, factory, data = workload("synthetic", n, quick=quick)
        algo = FedAvg(FunctionalModel(factory, device), local_steps=steps, lr=LR, batch_size=batch)
        state = algo.init(data.to(device), 0)
        algo.round(state)
        t = statistics.median(time_it(lambda a=algo, s=state: a.round(s), repeats, device))
        out.append({"clients": n, "round_s": t, "rounds_per_s": 1 / t})
    return out


def markdown(res: dict) -> str:
    m = res["machine"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, device {res['device']}, "
             f"{res['threads']} thread(s); one batched FedAvg round, K = {res['local_steps']}, batch "
             f"{res['batch_size']}; median of {res['repeats']} rounds, the split from one profiled round.", "",
             "| workload | round | per step | kernels | overhead | overhead per step | GFLOP/s | "
             "share of same-size bmm | share of machine peak |", "|---|---|---|---|---|---|---|---|---|"]
    for r in res["split"]:
        lines.append(f"| {r['label']} | {r['round_s'] * 1e3:,.1f} ms | {r['step_us']:,.0f} us | "
                     f"{r['kernel_share']:.0%} | {r['overhead_share']:.0%} | {r['overhead_per_step_us']:,.0f} us | "
                     f"{r['achieved_gflops']:.1f} | {r['share_of_bmm']:.0%} | {r['share_of_peak']:.0%} |")
    lines += ["", "Synthetic logistic FedAvg round by N: "
              + "; ".join(f"N = {r['clients']}: {r['round_s'] * 1e3:.1f} ms ({r['rounds_per_s']:.0f} rounds/s)"
                          for r in res["rounds"])]
    if res.get("steps"):
        lines += ["", f"K steps at once (the default) vs one step at a time (the reference, `fast_steps=False`): "
                  f"one FedAvg round, {res['steps'][0]['threads']} thread(s), median of {res['steps_repeats']} "
                  "interleaved rounds each (the CNN a third; min-max), the largest parameter difference after one "
                  "round from the same state and draws:", "",
                  "| workload | one step at a time | K steps at once | speedup | target | max abs difference |",
                  "|---|---|---|---|---|---|"]
        for r in res["steps"]:
            lines.append(f"| {r['label']} | {_ms(r['reference_s'])} ({_ms(r['reference_range_s'][0])}-"
                         f"{_ms(r['reference_range_s'][1])}) ms | {_ms(r['new_s'])} ({_ms(r['new_range_s'][0])}-"
                         f"{_ms(r['new_range_s'][1])}) ms | {r['speedup']:.2f}x | >= {r['target']:.2f}x | "
                         f"{r['max_abs_diff']:.1e} |")
        lines += ["", "Targets:", ""]
        for r in res["steps"]:
            lines.append(f"- [{'x' if r['met'] else ' '}] {r['workload']} FedAvg round, K steps at once vs one "
                         f"step at a time >= {r['target']:.2f}x: {r['speedup']:.2f}x")
    return "\n".join(lines) + "\n"


def _ms(s: float) -> str:
    return f"{s * 1e3:,.2f}"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", default="10,50,200,1000", help="N for the rounds-per-second line")
    p.add_argument("--local-steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps-repeats", type=int, default=21,
                   help="interleaved rounds per path in the K-steps comparison (the CNN takes a third, >= 3)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="auto")
    p.add_argument("--workloads", default="synthetic,mlp,cnn")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--quick", action="store_true", help="tiny sizes, one repeat: checks the code, not speed")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    device = resolve_device(a.device)
    repeats = 1 if a.quick else a.repeats
    ns = [4, 8] if a.quick else [int(n) for n in a.clients.split(",")]
    steps = 2 if a.quick else a.local_steps
    peak = machine_peak(device, a.quick)
    res = {"device": device.type, "threads": a.threads, "local_steps": steps, "batch_size": a.batch_size,
           "repeats": repeats, "machine": machine_info(device),
           "split": [split_row(w, 4 if a.quick else 50, steps, a.batch_size, repeats, device, a.quick, peak)
                     for w in a.workloads.split(",")],
           "rounds": rounds_per_second(ns, steps, a.batch_size, repeats, device, a.quick)}
    steps_repeats = 1 if a.quick else a.steps_repeats
    res["steps_repeats"] = steps_repeats
    res["steps"] = [steps_row(w, 4 if a.quick else 50, steps, a.batch_size,
                              steps_repeats if w != "cnn" else max(1 if a.quick else 3, steps_repeats // 3), device,
                              a.quick) for w in a.workloads.split(",")]
    text = markdown(res)
    write_report(a.out, f"overhead_{device.type}", res, text)
    print(text)
    return res


if __name__ == "__main__":
    main()
