"""Speed of the batched engine: batched vs the reference per-client loop, matmul ceiling, scaling in N.

    python benchmarks/speed.py [--threads 1,2] [--device auto] [--repeats 7] [--out benchmarks/results]
    python benchmarks/speed.py --quick --out /tmp/bench     # seconds: tiny sizes (what the test runs)

What it measures, in one run on one machine (no DVC):

1. **Speedup.** For each workload -- PERM's synthetic data with logistic regression (N = 50, d = 60),
   the MLP 2 x 200 on 28 x 28 inputs and the 2-layer CNN (channels 8, 16, hidden 64: the CNN the
   pipeline runs) -- one FedAvg round and one PERM shuffle round (K = 20 local steps, batch 20) are
   timed with the batched engine (``FedAvg.round`` / ``perm.shuffle_steps``) and with the reference
   per-client loops of tests/reference (``reference.fedavg.fedavg`` / ``reference.perm.shuffle_round``:
   plain autograd, one client at a time), on the same draws. A PERM epoch is N shuffle rounds of identical cost, so
   its time is N x the round's median. Median, min and max over the repeats are reported.
2. **Ceiling.** The GFLOP/s of a plain ``torch.bmm`` of the workload's largest layer (N models x
   [B, fan_in] @ [fan_in, fan_out]; a convolution counts as its im2col matmul) on this machine, and
   each workload's achieved GFLOP/s (``FlopCounterMode`` FLOPs of the reference arithmetic / batched
   time) as a share of it.
3. **Scaling.** Time and peak memory of one batched FedAvg round of the synthetic workload for
   N in {10, 50, 200, 1000}, and of the MLP for hidden widths {50, 200, 800} (N = 50). Every point runs
   in a fresh process so its peak resident memory (CPU) or ``max_memory_allocated`` (CUDA) is its own.

Writes ``<out>/speed.json`` and ``<out>/speed.md`` and prints the markdown tables.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from pflkit.algorithms import FedAvg
from pflkit.algorithms.perm import shuffle_steps
from pflkit.data import FederatedDataset, perm_synthetic
from pflkit.device import cpu_model
from pflkit.engine import FunctionalModel, make_generator, resolve_device
from pflkit.io import write_report
from pflkit.models import cnn, logistic, mlp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the reference twins (tests/reference)
from reference import fedavg as ref_fedavg  # noqa: E402
from reference import perm as ref_perm  # noqa: E402

HERE = Path(__file__).resolve().parent
LR = 0.05
TARGETS = {"synthetic": 20.0, "mlp": 20.0, "cnn": 5.0}  # required speedup over the reference loop
CEILING_SHARE_TARGET = 0.30  # MLP: achieved / matmul ceiling
SCALING_TARGET = 25.0  # time(N = 1000) / time(N = 50), synthetic


# ------------------------------------------------------------------------------------ workloads
def image_data(num_clients: int, per_client: int, seed: int = 0) -> FederatedDataset:
    """Random 28 x 28 images, 10 classes (speed does not depend on the pixel values)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(num_clients, per_client + 2, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (num_clients, per_client + 2), generator=g)
    return FederatedDataset.from_client_arrays([(x[j, :-2], y[j, :-2]) for j in range(num_clients)],
                                               [(x[j, -2:], y[j, -2:]) for j in range(num_clients)], 10,
                                               "random-28x28")


def workload(name: str, n: int, *, width: int = 200, quick: bool = False):
    """(label, factory, data) of a named workload with n clients."""
    if name == "synthetic":
        return (f"synthetic logistic (d=60), N={n}", lambda: logistic((60,), 2),
                perm_synthetic(max(n, 2), 500 if not quick else 20, 60, seed=0))
    per_client = 100 if not quick else 8
    if name == "mlp":
        return (f"MLP 2x{width} on 28x28, N={n}", lambda: mlp((1, 28, 28), 10, hidden=(width, width)),
                image_data(n, per_client))
    if name == "cnn":
        ch, hid = ((8, 16), 64) if not quick else ((2, 4), 8)
        return (f"CNN conv{ch[0]}-conv{ch[1]}-fc{hid} on 28x28, N={n}",
                lambda: cnn((1, 28, 28), 10, channels=ch, hidden=hid), image_data(n, per_client))
    raise ValueError(f"workload must be synthetic, mlp or cnn, got {name!r}")


# ------------------------------------------------------------------------------------ timing
def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak_rss() -> int | None:
    """Reset the kernel's peak-RSS mark (Linux: ``5 > /proc/self/clear_refs``); current RSS in bytes."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    rss = _status_kb("VmRSS")
    return None if rss is None else rss * 1024


def peak_rss() -> int | None:
    hwm = _status_kb("VmHWM")
    return None if hwm is None else hwm * 1024


def time_pair(batched, reference, repeats: int, ref_repeats: int, device) -> tuple[list[float], list[float]]:
    """Interleave the two (b, r, b, r, ..., then the remaining b) so that a change in machine load
    during the run hits both sides alike."""
    b, r = [], []
    for i in range(max(repeats, ref_repeats)):
        if i < repeats:
            b += time_it(batched, 1, device)
        if i < ref_repeats:
            r += time_it(reference, 1, device)
    return b, r


def time_it(fn, repeats: int, device) -> list[float]:
    out = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        out.append(time.perf_counter() - start)
    return out


def summary(times: list[float]) -> dict:
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "repeats": len(times)}


def flops_per_client_step(factory, data: FederatedDataset, batch_size: int) -> int:
    """FLOPs of one reference client step (forward + autograd backward), counted by torch."""
    from torch.utils.flop_counter import FlopCounterMode
    module = factory().to(data.device)
    x, y = data.x_train[:batch_size], data.y_train[:batch_size]
    with FlopCounterMode(display=False) as counter:
        loss = F.cross_entropy(module(x), y)
        torch.autograd.grad(loss, list(module.parameters()))
    return int(counter.get_total_flops())


def largest_matmul(factory, batch_size: int, input_shape) -> tuple[int, int, int]:
    """(rows, fan_in, fan_out) of the layer with the most multiply-adds, as a per-model matmul."""
    module = factory()
    best, shape = 0, (batch_size, 1, 1)
    hooks = []

    def hook(layer, inputs, output):
        nonlocal best, shape
        if isinstance(layer, torch.nn.Linear):
            cand = (batch_size, layer.in_features, layer.out_features)
        elif isinstance(layer, torch.nn.Conv2d):
            k = math.prod(layer.kernel_size)
            cand = (batch_size * output.shape[-1] * output.shape[-2], layer.in_channels * k, layer.out_channels)
        else:
            return
        if math.prod(cand) > best:
            best, shape = math.prod(cand), cand
    for layer in module.modules():
        hooks.append(layer.register_forward_hook(hook))
    with torch.no_grad():
        module(torch.zeros(batch_size, *input_shape))
    return shape


def matmul_ceiling(n: int, rows: int, fan_in: int, fan_out: int, device, repeats: int) -> float:
    """GFLOP/s of torch.bmm on N x [rows, fan_in] @ [fan_in, fan_out] (best of ``repeats``)."""
    a = torch.randn(n, rows, fan_in, device=device)
    b = torch.randn(n, fan_in, fan_out, device=device)
    torch.bmm(a, b)
    reps = max(3, repeats)
    best = min(time_it(lambda: torch.bmm(a, b), reps, device))
    return 2.0 * n * rows * fan_in * fan_out / best / 1e9


def machine_peak(device, quick: bool = False) -> float:
    """GFLOP/s of one large square-ish batched matmul (16 x [256, 1024] @ [1024, 256])."""
    size = (16, 256, 1024, 256) if not quick else (2, 16, 32, 16)
    return matmul_ceiling(size[0], size[1], size[2], size[3], device, 5)


def speed_rows(name: str, n: int, steps: int, batch: int, repeats: int, ref_repeats: int, device,
               quick: bool, peak: float) -> list[dict]:
    """FedAvg round and PERM shuffle round, batched vs reference, for one workload."""
    label, factory, data = workload(name, n, width=8 if quick else 200, quick=quick)
    data = data.to(device)
    model = FunctionalModel(factory, device)
    flops = flops_per_client_step(factory, data, batch) * n * steps
    rows, fan_in, fan_out = largest_matmul(factory, batch, data.feature_shape)
    ceiling = matmul_ceiling(n, rows, fan_in, fan_out, device, repeats)
    out = []

    algo = FedAvg(model, local_steps=steps, lr=LR, batch_size=batch)
    state = algo.init(data, 0)
    algo.round(state)  # warm-up
    batched, ref = time_pair(lambda: algo.round(state),
                             lambda: ref_fedavg.fedavg(factory, state.w, data, 1, steps, LR, batch, seed=0),
                             repeats, ref_repeats, device)
    out.append(("FedAvg round", batched, ref))

    g = torch.Generator().manual_seed(1)
    alpha = torch.rand(n, n, generator=g, dtype=torch.float64)
    alpha = (alpha / alpha.sum(1, keepdim=True)).to(device)
    sigma = torch.randperm(n, generator=g)
    v = {k: p.unsqueeze(0).expand(n, *p.shape).clone() for k, p in state.w.items()}

    def batched_perm():
        return shuffle_steps(model, v, data, alpha, sigma, 1, local_steps=steps, lr=LR, batch_size=batch,
                             generator=make_generator(3))
    batched_perm()
    batched, ref = time_pair(batched_perm,
                             lambda: ref_perm.shuffle_round(factory, v, data, alpha, sigma, 1, steps, LR, batch,
                                                            make_generator(3)), repeats, ref_repeats, device)
    out.append(("PERM shuffle round", batched, ref))

    result = []
    for what, b, r in out:
        sb, sr = summary(b), summary(r)
        achieved = flops / sb["median_s"] / 1e9
        result.append({
            "workload": name, "label": label, "algorithm": what, "clients": n, "local_steps": steps,
            "batch_size": batch, "threads": torch.get_num_threads(), "device": str(device),
            "batched": sb, "reference": sr, "speedup": sr["median_s"] / sb["median_s"],
            "speedup_range": [sr["min_s"] / sb["max_s"], sr["max_s"] / sb["min_s"]],
            "epoch_batched_s": sb["median_s"] * n if what.startswith("PERM") else None,
            "epoch_reference_s": sr["median_s"] * n if what.startswith("PERM") else None,
            "gflop_per_round": flops / 1e9, "achieved_gflops": achieved,
            "reference_gflops": flops / sr["median_s"] / 1e9,
            "ceiling_matmul": [n, rows, fan_in, fan_out], "ceiling_gflops": ceiling,
            "share_of_ceiling": achieved / ceiling, "machine_bmm_gflops": peak,
            "share_of_machine_bmm": achieved / peak,
            "target_speedup": TARGETS[name],
        })
    return result


# ------------------------------------------------------------------------------------ scaling
def scaling_point(name: str, n: int, width: int, steps: int, batch: int, repeats: int, device,
                  quick: bool) -> dict:
    """Time and peak memory of one batched FedAvg round (run in a fresh process by ``scaling``)."""
    _, factory, data = workload(name, n, width=width, quick=quick)
    data = data.to(device)
    data_bytes = sum(t.numel() * t.element_size() for t in (data.x_train, data.y_train, data.x_test, data.y_test))
    model = FunctionalModel(factory, device)
    params = sum(p.numel() for p in model.init(0).values())
    algo = FedAvg(model, local_steps=steps, lr=LR, batch_size=batch)
    state = algo.init(data, 0)
    algo.round(state)  # warm-up (allocator, first-touch of the data)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = reset_peak_rss()
    times = time_it(lambda: algo.round(state), repeats, device)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated() - base
    else:
        top = peak_rss()
        peak = (top - base) if base is not None and top is not None else 0
    return {"workload": name, "clients": n, "width": width if name == "mlp" else None, "parameters": params,
            **summary(times), "round_peak_bytes": max(int(peak), 0), "data_bytes": int(data_bytes),
            "round_peak_bytes_per_client": max(int(peak), 0) / n, "data_bytes_per_client": data_bytes / n,
            "param_bytes_per_client": params * 4}


def scaling(points, steps, batch, repeats, device, threads, quick) -> list[dict]:
    out = []
    for name, n, width in points:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--point", f"{name}:{n}:{width}",
               "--local-steps", str(steps), "--batch-size", str(batch), "--repeats", str(repeats),
               "--device", str(device), "--threads", str(threads)] + (["--quick"] if quick else [])
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"scaling point {name} N={n} failed:\n{proc.stderr[-2000:]}")
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


# ------------------------------------------------------------------------------------ report
def machine_info(device) -> dict:
    cpu = cpu_model() or platform.processor() or platform.machine()
    info = {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "device": str(device), "load_average": list(os.getloadavg())}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def _ms(s: float) -> str:
    return f"{s * 1e3:,.1f}"


def markdown(res: dict) -> str:
    m = res["machine"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, device {m['device']}"
             + (f" ({m['gpu']})" if "gpu" in m else "")
             + f"; load average {m['load_average'][0]:.2f} at start, {res['load_average_end'][0]:.2f} at end.", "",
             "| workload | round | threads | batched ms (min-max) | reference ms (min-max) | speedup | target |"
             " GFLOP/s | same-size bmm GFLOP/s | share | large bmm GFLOP/s | share |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["speed"]:
        b, f = r["batched"], r["reference"]
        lines.append(f"| {r['label']} | {r['algorithm']} | {r['threads']} | {_ms(b['median_s'])} "
                     f"({_ms(b['min_s'])}-{_ms(b['max_s'])}) | {_ms(f['median_s'])} "
                     f"({_ms(f['min_s'])}-{_ms(f['max_s'])}) | {r['speedup']:.1f}x | {r['target_speedup']:.0f}x | "
                     f"{r['achieved_gflops']:.1f} | {r['ceiling_gflops']:.1f} | {100 * r['share_of_ceiling']:.0f}% | "
                     f"{r['machine_bmm_gflops']:.1f} | {100 * r['share_of_machine_bmm']:.0f}% |")
    lines += ["", "PERM epoch = N shuffle rounds: epoch time = N x the shuffle round's median "
              "(batched / reference, seconds):", ""]
    for r in res["speed"]:
        if r["epoch_batched_s"] is not None:
            lines.append(f"- {r['label']}, {r['threads']} thread(s): {r['epoch_batched_s']:.2f} s vs "
                         f"{r['epoch_reference_s']:.2f} s")
    lines += ["", "Scaling (batched FedAvg round, K = %d, batch %d):" % (res["local_steps"], res["batch_size"]), "",
              "| workload | N | width | params/model | round ms (min-max) | ms per client | peak round memory MB |"
              " per client KB | data per client KB |", "|---|---|---|---|---|---|---|---|---|"]
    for p in res["scaling"]:
        lines.append(f"| {p['workload']} | {p['clients']} | {p['width'] or '-'} | {p['parameters']:,} | "
                     f"{_ms(p['median_s'])} ({_ms(p['min_s'])}-{_ms(p['max_s'])}) | "
                     f"{p['median_s'] * 1e3 / p['clients']:.3f} | {p['round_peak_bytes'] / 2**20:.1f} | "
                     f"{p['round_peak_bytes_per_client'] / 1024:.1f} | {p['data_bytes_per_client'] / 1024:.1f} |")
    lines += ["", "Targets:", ""]
    for t in res["targets"]:
        lines.append(f"- [{'x' if t['met'] else ' '}] {t['what']}: {t['value']}")
    return "\n".join(lines) + "\n"


def targets(res: dict) -> list[dict]:
    out = []
    for r in res["speed"]:
        out.append({"what": f"{r['workload']} {r['algorithm']} ({r['threads']} thr) >= {r['target_speedup']:.0f}x",
                    "value": f"{r['speedup']:.1f}x", "met": r["speedup"] >= r["target_speedup"]})
    for r in res["speed"]:
        if r["workload"] == "mlp" and r["algorithm"] == "FedAvg round":
            out.append({"what": f"MLP >= {CEILING_SHARE_TARGET:.0%} of the matmul ceiling ({r['threads']} thr)",
                        "value": f"{r['share_of_ceiling']:.0%}", "met": r["share_of_ceiling"] >= CEILING_SHARE_TARGET})
    syn = {p["clients"]: p for p in res["scaling"] if p["workload"] == "synthetic"}
    if syn:
        lo, hi = (50 if 50 in syn else min(syn)), max(syn)
        ratio = syn[hi]["median_s"] / syn[lo]["median_s"] if lo != hi else 1.0
        out.append({"what": f"synthetic N={hi} fits and costs <= {SCALING_TARGET:.0f}x the N={lo} time",
                    "value": f"{ratio:.1f}x", "met": ratio <= SCALING_TARGET})
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--local-steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=20)
    p.add_argument("--repeats", type=int, default=7, help="batched repeats (the reference runs about half)")
    p.add_argument("--cnn-repeats", type=int, default=3, help="repeats of the (slow) CNN rows")
    p.add_argument("--threads", default="1,2", help="comma-separated torch CPU thread counts")
    p.add_argument("--device", default="auto")
    p.add_argument("--workloads", default="synthetic,mlp,cnn")
    p.add_argument("--scaling-clients", default="10,50,200,1000")
    p.add_argument("--scaling-widths", default="50,200,800")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--quick", action="store_true", help="tiny sizes, one repeat: checks the code, not speed")
    p.add_argument("--point", help=argparse.SUPPRESS)  # internal: one scaling point in this process
    a = p.parse_args(argv)
    device = resolve_device(a.device)
    if a.quick:
        a.clients, a.local_steps, a.batch_size, a.repeats, a.cnn_repeats = 3, 2, 4, 1, 1
        a.scaling_clients, a.scaling_widths = "2,4", "8"
    threads = [int(t) for t in str(a.threads).split(",") if t]
    if a.point:
        torch.set_num_threads(threads[0])
        name, n, width = a.point.split(":")
        print(json.dumps(scaling_point(name, int(n), int(width), a.local_steps, a.batch_size, a.repeats, device,
                                       a.quick)))
        return {}
    res = {"machine": machine_info(device), "local_steps": a.local_steps, "batch_size": a.batch_size,
           "clients": a.clients, "speed": [], "scaling": []}
    started = time.perf_counter()
    for t in threads:
        torch.set_num_threads(t)
        peak = machine_peak(device, a.quick)
        for name in a.workloads.split(","):
            reps = a.cnn_repeats if name == "cnn" else a.repeats
            print(f"[bench] {name}, {t} thread(s) ...", file=sys.stderr, flush=True)
            res["speed"] += speed_rows(name, a.clients, a.local_steps, a.batch_size, reps, max(1, (reps + 1) // 2),
                                       device, a.quick, peak)
    points = [("synthetic", int(n), 0) for n in a.scaling_clients.split(",")]
    points += [("mlp", a.clients, int(w)) for w in a.scaling_widths.split(",")]
    print(f"[bench] scaling: {len(points)} points, one process each ...", file=sys.stderr, flush=True)
    res["scaling"] = scaling(points, a.local_steps, a.batch_size, a.repeats, device, threads[0], a.quick)
    res["load_average_end"] = list(os.getloadavg())
    res["wall_s"] = time.perf_counter() - started
    res["targets"] = targets(res)
    table = markdown(res)
    write_report(a.out, "speed", res, table)
    print(table)
    return res


if __name__ == "__main__":
    main()
