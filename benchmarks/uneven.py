"""Uneven clients: evaluation and full-batch gradients over the real rows only (issue 20, part 1).

    OMP_NUM_THREADS=1 python benchmarks/uneven.py [--threads 1] [--repeats 7] [--out benchmarks/results]
    python benchmarks/uneven.py --quick --out /tmp/bench      # seconds: tiny sizes (what the test runs)

The workload is generated: N = 100 clients whose sizes follow a lognormal (median 1,000, sigma 1.2,
seed 18, clipped to 250..25,810 with the extremes pinned), 10% of each client held out as its test
split (185,181 train rows, the largest client 12.5x the mean), d = 60 Gaussian features labelled by a
random linear teacher, logistic regression (2 classes), FedAvg with 10 of 100 clients per round.

What it measures, in one run on one machine:

1. **Evaluation** (``eval.evaluate`` on the test split, every client its own model): the engine
   (size buckets, ``FederatedDataset.size_buckets``) vs an unpadded per-client Python loop (each
   client's rows through its model, no padding) vs the old path padded to the largest client
   (``FederatedDataset.padded`` + one masked call per 256 models). Target: engine <= 1.5x the loop.
2. **Full-gradient memory** (``engine.full_gradients`` on the train split): peak resident memory
   growth of the process during the pass, measured in a fresh process per point (kernel peak RSS,
   ``/proc/self/clear_refs`` + ``VmHWM``, with glibc's ``MALLOC_MMAP_THRESHOLD_`` fixed at 128 KiB
   so freed tensors go back to the kernel and reused heap cannot hide an allocation). "cold" is the
   first pass (it builds the size-bucket copy of the data, which stays cached); "warm" a later one.
   Compared with the real rows' activations: the bytes of the input and of every layer's output for
   the real train rows through one model (forward hooks; views not counted twice). Target: cold pass
   <= 1.5x that (the cold pass includes the size-bucket copy of the data; the padded path's cold pass
   includes its padded copy, 12.5x the rows).
   The flat pass (``engine.full_gradients_at``: every client's gradient at one model, over the flat
   store; PERM's alpha) is measured the same way.
3. **PERM alpha update** (what PERM runs once per epoch: the exact global step ``global_passes`` and
   the mixing weights ``alpha_passes``, projected GD with 20 steps, both on exact full gradients) vs one
   FedAvg round (K = 20 local steps, batch 20, 10 clients), both timed in one run with interleaved
   repeats. Target: <= 5x. The round is timed with the default client update (K steps at once) and
   with the one-step-at-a-time reference (``FunctionalModel(fast_steps=False)``, the round the target
   was set against). Two earlier engines are rebuilt for comparison: "size buckets" (both passes as
   ``full_gradients`` of w broadcast over the size buckets, the global step's pass not shared with
   the alpha update's, rows sorted by torch) and "padded" (that update with ``full_gradients``
   padded to the largest client).

Writes ``<out>/uneven.json`` and ``<out>/uneven.md`` and prints the markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F

from pflkit.algorithms import FedAvg
from pflkit.algorithms import perm as perm_module
from pflkit.algorithms.perm import PERM
from pflkit.algorithms.round import run_passes
from pflkit.data import FederatedDataset
from pflkit.engine import FunctionalModel, broadcast, full_gradients, full_gradients_at
from pflkit.eval import evaluate
from pflkit.io import write_report
from pflkit.models import logistic

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark modules
from speed import machine_info  # noqa: E402  (one description of the machine for every benchmark)

from reference.perm import project_simplex_sort  # noqa: E402  (tests/reference: speed put tests/ on sys.path)

HERE = Path(__file__).resolve().parent
TARGETS = {"eval": 1.5, "memory": 1.5, "alpha": 5.0}
DIM, CLASSES = 60, 2


# ------------------------------------------------------------------------------------ workload
def client_sizes(n: int, lo: int, hi: int, median: float, sigma: float, seed: int) -> np.ndarray:
    """Lognormal client sizes clipped to [lo, hi], the largest set to hi and the smallest to lo."""
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.round(rng.lognormal(np.log(median), sigma, n)), lo, hi).astype(np.int64)
    sizes[np.argmax(sizes)] = hi
    sizes[np.argmin(sizes)] = lo
    return sizes


def uneven_data(sizes: np.ndarray, test_fraction: float = 0.1, dim: int = DIM, seed: int = 0) -> FederatedDataset:
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(dim, generator=g)
    train, test = [], []
    for n in sizes.tolist():
        x = torch.randn(n, dim, generator=g) + 0.3 * torch.randn(1, dim, generator=g)
        y = (x @ teacher > 0).long()
        k = max(1, int(round(test_fraction * n)))
        train.append((x[k:], y[k:]))
        test.append((x[:k], y[:k]))
    return FederatedDataset.from_client_arrays(train, test, CLASSES, "uneven lognormal")


def stacked_params(model: FunctionalModel, n: int, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(n, *v.shape, generator=g) * 0.1 for k, v in model.init(0).items()}


def factory():
    return logistic((DIM,), CLASSES)


# ------------------------------------------------------------------------------------ the paths compared
def eval_loop(model: FunctionalModel, params: dict, data: FederatedDataset, split: str = "test"):
    """The unpadded per-client loop: each client's rows through its own model."""
    loss, acc = [], []
    with torch.no_grad():
        for j in range(data.num_clients):
            x, y = data.client(j, split)
            logits = model.forward({k: v[j] for k, v in params.items()}, x)
            loss.append(F.cross_entropy(logits, y, reduction="sum"))
            acc.append((logits.argmax(-1) == y).sum())
    n = data.test_sizes.double() if split == "test" else data.train_sizes.double()
    return torch.stack(loss).double() / n, torch.stack(acc).double() / n


def eval_padded(model: FunctionalModel, params: dict, data: FederatedDataset, split: str = "test", chunk: int = 256):
    """The old evaluate: every client padded to the largest one."""
    x, y, mask = data.padded(split)
    ls, cs = [], []
    for a in range(0, data.num_clients, chunk):
        sl = torch.arange(a, min(a + chunk, data.num_clients))
        s, c = model.batched_stats({k: v[sl] for k, v in params.items()}, x[sl], y[sl], mask[sl])
        ls.append(s)
        cs.append(c)
    n = mask.sum(1).double()
    return torch.cat(ls).double() / n, torch.cat(cs).double() / n


def full_gradients_padded(model, params, data, split: str = "train"):
    """The old full_gradients: one masked call padded to the largest client."""
    x, y, mask = data.padded(split)
    return model.batched_full_grad(params, x, y, mask)


def flat_pass(model, params, data):
    """``full_gradients_at`` (PERM's exact client gradients at one model: the flat store, no buckets) at the
    first of ``params``' models."""
    return full_gradients_at(model, {k: v[0] for k, v in params.items()}, data)


@contextmanager
def earlier_engine(full):
    """PERM's alpha update as an earlier engine ran it: both passes as ``full`` of w broadcast (size buckets,
    or padded), the global step recomputing its pass, the projection sorting rows with torch."""
    def at(model, w, data, split="train", budget=None):
        return full(model, broadcast(w, data.num_clients), data, split)[0]

    with mock.patch.object(perm_module, "full_gradients_at", at), \
            mock.patch.object(perm_module, "project_simplex", project_simplex_sort):
        yield


def activation_bytes(model: FunctionalModel, data: FederatedDataset, rows: int) -> int:
    """Bytes of the input and every layer's output (views of a tensor already counted are not counted
    again) for ``rows`` samples through one model."""
    x = data.x_train[:4]
    seen = {x.untyped_storage().data_ptr()}
    total = [x.numel() * x.element_size()]

    def hook(_module, _inputs, out):
        ptr = out.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            total.append(out.numel() * out.element_size())

    hooks = [m.register_forward_hook(hook) for m in model.module.modules() if not list(m.children())]
    with torch.no_grad():
        model.module(x)
    for h in hooks:
        h.remove()
    return int(sum(total) / x.shape[0] * rows)


# ------------------------------------------------------------------------------------ timing / memory
def time_it(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def summary(times: list[float]) -> dict:
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "repeats": len(times)}


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def rss_growth(fn) -> int | None:
    """Peak resident memory during fn() above the resident memory before it (Linux; None elsewhere)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak mark to the current RSS
    except OSError:
        return None
    before = _status_kb("VmRSS")
    fn()
    peak = _status_kb("VmHWM")
    return None if before is None or peak is None else max(0, peak - before)


def memory_point(which: str, args) -> dict:
    """In this (fresh) process: peak RSS growth of a cold and a warm full-gradient pass."""
    data = uneven_data(client_sizes(args.clients, args.min_size, args.max_size, args.median, args.sigma, args.seed),
                       args.test_fraction)
    model = FunctionalModel(factory)
    params = stacked_params(model, data.num_clients)
    fn = {"buckets": full_gradients, "padded": full_gradients_padded, "flat": flat_pass}[which]
    tiny = uneven_data(client_sizes(4, 3, 40, 10.0, 1.0, 0), args.test_fraction)
    fn(model, stacked_params(model, 4), tiny)  # load and initialize the code paths, outside the measurement
    cold = rss_growth(lambda: fn(model, params, data))
    warm = rss_growth(lambda: fn(model, params, data))
    return {"path": which, "cold_bytes": cold, "warm_bytes": warm}


def memory_points(args) -> list[dict]:
    out = []
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024), "OMP_NUM_THREADS": str(args.threads)}
    for which in ("buckets", "flat", "padded"):
        cmd = [sys.executable, __file__, "--memory-point", which, *args.passthrough]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


# ------------------------------------------------------------------------------------ the run
def run(args) -> dict:
    torch.set_num_threads(args.threads)
    sizes = client_sizes(args.clients, args.min_size, args.max_size, args.median, args.sigma, args.seed)
    data = uneven_data(sizes, args.test_fraction)
    model = FunctionalModel(factory)
    n = data.num_clients
    params = stacked_params(model, n)
    res = {"machine": machine_info(torch.device("cpu")), "threads": args.threads,
           "workload": {"clients": n, "train_rows": int(data.train_sizes.sum()),
                        "test_rows": int(data.test_sizes.sum()),
                        "train_min": int(data.train_sizes.min()), "train_max": int(data.train_sizes.max()),
                        "padded_train_rows": n * int(data.train_sizes.max()),
                        "padded_test_rows": n * int(data.test_sizes.max()),
                        "bucket_train_rows": sum(b.mask.numel() for b in data.size_buckets("train")[0]),
                        "bucket_test_rows": sum(b.mask.numel() for b in data.size_buckets("test")[0]),
                        "buckets_train": len(data.size_buckets("train")[0]),
                        "model": f"logistic d={DIM}, {CLASSES} classes", "local_steps": args.local_steps,
                        "batch_size": args.batch_size, "clients_per_round": args.clients_per_round}}
    print("[uneven] evaluation ...", file=sys.stderr, flush=True)
    # the three give the same numbers (checked here, on every run)
    got = evaluate(model, params, data)
    for other in (eval_loop(model, params, data), eval_padded(model, params, data)):
        torch.testing.assert_close(got.loss, other[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got.accuracy, other[1], rtol=1e-5, atol=1e-6)
    t_b, t_l, t_p = [], [], []
    for _ in range(args.repeats):  # interleaved, so a change in machine load hits all three alike
        t_b += time_it(lambda: evaluate(model, params, data), 1)
        t_l += time_it(lambda: eval_loop(model, params, data), 1)
        t_p += time_it(lambda: eval_padded(model, params, data), 1)
    res["eval"] = {"buckets": summary(t_b), "loop": summary(t_l), "padded": summary(t_p)}
    res["eval"]["ratio_to_loop"] = res["eval"]["buckets"]["median_s"] / res["eval"]["loop"]["median_s"]
    res["eval"]["padded_ratio_to_loop"] = res["eval"]["padded"]["median_s"] / res["eval"]["loop"]["median_s"]
    data._padded.clear()

    print("[uneven] full-gradient memory (fresh process per path) ...", file=sys.stderr, flush=True)
    act = activation_bytes(model, data, int(data.train_sizes.sum()))
    res["memory"] = {"real_rows_activation_bytes": act, "points": memory_points(args),
                     "measured_by": "peak RSS growth (VmHWM after clear_refs), MALLOC_MMAP_THRESHOLD_=128KiB"}
    g_b, _ = full_gradients(model, params, data)
    g_p, _ = full_gradients_padded(model, params, data)
    g_f = flat_pass(model, params, data)
    g_1, _ = full_gradients(model, broadcast({k: v[0] for k, v in params.items()}, n), data)
    for k in g_b:
        torch.testing.assert_close(g_b[k], g_p[k], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(g_f[k], g_1[k], rtol=1e-4, atol=1e-6)
    data._padded.clear()
    t_fg, t_flat = [], []
    for _ in range(args.repeats):
        t_fg += time_it(lambda: full_gradients(model, params, data), 1)
        t_flat += time_it(lambda: flat_pass(model, params, data), 1)
    res["memory"]["full_gradients_s"] = summary(t_fg)
    res["memory"]["flat_pass_s"] = summary(t_flat)

    print("[uneven] PERM alpha update vs FedAvg round ...", file=sys.stderr, flush=True)
    feds = {fast: FedAvg(FunctionalModel(factory, fast_steps=fast), local_steps=args.local_steps, lr=0.05,
                         batch_size=args.batch_size, clients_per_round=args.clients_per_round)
            for fast in (True, False)}
    fstates = {fast: fed.init(data, 0) for fast, fed in feds.items()}
    for fast, fed in feds.items():
        fed.round(fstates[fast])  # warm-up
    perm = PERM(model, local_steps=args.local_steps, lr=0.05, batch_size=args.batch_size, lam=0.1,
                alpha_solver="gd", alpha_steps=20)
    ps = perm.init(data, 0)

    def alpha_update(keep_mean: bool = True):
        if not keep_mean:  # the earlier engines recomputed the global step's pass
            ps.grad_mean = None
        run_passes(perm, perm.global_passes(ps, None), data)
        ps.alpha = run_passes(perm, perm.alpha_passes(ps, ps.alpha), data)

    alpha_update()  # warm-up (builds the caches)
    t_new, t_ref, t_a = [], [], []
    for _ in range(args.repeats):  # interleaved, so a change in machine load hits all alike
        t_new += time_it(lambda: feds[True].round(fstates[True]), 1)
        t_ref += time_it(lambda: feds[False].round(fstates[False]), 1)
        t_a += time_it(alpha_update, 1)
    with earlier_engine(full_gradients):
        alpha_update(False)
        t_ab = time_it(lambda: alpha_update(False), args.repeats)
    with earlier_engine(full_gradients_padded):
        alpha_update(False)
        t_ap = time_it(lambda: alpha_update(False), max(1, args.repeats // 3))
    data._padded.clear()
    res["alpha"] = {"fedavg_round": summary(t_new), "fedavg_round_reference": summary(t_ref),
                    "alpha_update": summary(t_a), "alpha_update_buckets": summary(t_ab),
                    "alpha_update_padded": summary(t_ap)}
    ref_round, new_round = t_med(t_ref), t_med(t_new)
    res["alpha"]["ratio_reference"] = t_med(t_a) / ref_round
    res["alpha"]["ratio"] = t_med(t_a) / new_round
    res["alpha"]["buckets_ratio_reference"] = t_med(t_ab) / ref_round
    res["alpha"]["padded_ratio_reference"] = t_med(t_ap) / ref_round
    res["targets"] = targets(res)
    res["load_average_end"] = list(os.getloadavg())
    return res


def t_med(times):
    return statistics.median(times)


def targets(res: dict) -> list[dict]:
    mem = {p["path"]: p for p in res["memory"]["points"]}
    act = res["memory"]["real_rows_activation_bytes"]
    out = [{"what": f"evaluation <= {TARGETS['eval']}x the unpadded per-client loop",
            "value": f"{res['eval']['ratio_to_loop']:.2f}x", "met": res["eval"]["ratio_to_loop"] <= TARGETS["eval"]}]
    for path, name in (("buckets", "size buckets"), ("flat", "flat pass")):
        cold = mem[path]["cold_bytes"]
        out.append({"what": f"full-gradient pass peak memory (cold, {name}) <= {TARGETS['memory']}x the real rows' "
                            "activations", "value": "n/a (no /proc)" if cold is None else f"{cold / act:.2f}x",
                    "met": cold is not None and cold <= TARGETS["memory"] * act})
    out += [{"what": f"PERM alpha update <= {TARGETS['alpha']}x a FedAvg round (one step at a time, the round "
                    "the target was set against)",
             "value": f"{res['alpha']['ratio_reference']:.2f}x",
             "met": res["alpha"]["ratio_reference"] <= TARGETS["alpha"]},
            {"what": f"PERM alpha update <= {TARGETS['alpha']}x a FedAvg round (K steps at once, the default)",
             "value": f"{res['alpha']['ratio']:.2f}x", "met": res["alpha"]["ratio"] <= TARGETS["alpha"]}]
    return out


def _ms(s: float) -> str:
    return f"{s * 1e3:,.2f}"


def _mb(b) -> str:
    return "n/a" if b is None else f"{b / 2**20:,.1f}"


def markdown(res: dict) -> str:
    m, w = res["machine"], res["workload"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, {res['threads']} thread(s); load "
             f"average {m['load_average'][0]:.2f} at start, {res['load_average_end'][0]:.2f} at end.", "",
             f"Workload: {w['clients']} clients, lognormal sizes, train {w['train_min']:,}..{w['train_max']:,} rows "
             f"per client, {w['train_rows']:,} train / {w['test_rows']:,} test rows; {w['model']}. Padded to the "
             f"largest client: {w['padded_train_rows']:,} train rows "
             f"({w['padded_train_rows'] / w['train_rows']:.1f}x); "
             f"size buckets: {w['bucket_train_rows']:,} ({w['bucket_train_rows'] / w['train_rows']:.2f}x, "
             f"{w['buckets_train']} buckets).", "",
             "| measurement | now (size buckets) | per-client loop | before (padded) | now / loop | before / loop |",
             "|---|---|---|---|---|---|"]
    e = res["eval"]
    lines.append(f"| evaluation (test split), ms | {_ms(e['buckets']['median_s'])} | {_ms(e['loop']['median_s'])} | "
                 f"{_ms(e['padded']['median_s'])} | {e['ratio_to_loop']:.2f}x | {e['padded_ratio_to_loop']:.2f}x |")
    lines += ["", "| full gradients (train split) | size buckets | flat pass (one model) | before (padded) | "
              "real rows' activations | buckets / activations | flat / activations |", "|---|---|---|---|---|---|---|"]
    mem = {p["path"]: p for p in res["memory"]["points"]}
    act = res["memory"]["real_rows_activation_bytes"]

    def share(b):
        return "n/a" if b is None else f"{b / act:.2f}x"

    for key, label in (("cold_bytes", "peak memory, first pass, MB"), ("warm_bytes", "peak memory, later pass, MB")):
        b, f = mem["buckets"][key], mem["flat"][key]
        lines.append(f"| {label} | {_mb(b)} | {_mb(f)} | {_mb(mem['padded'][key])} | {_mb(act)} | {share(b)} | "
                     f"{share(f)} |")
    lines += [f"| time of a pass, ms | {_ms(res['memory']['full_gradients_s']['median_s'])} | "
              f"{_ms(res['memory']['flat_pass_s']['median_s'])} | | | | |", "",
              f"Memory: {res['memory']['measured_by']}, one fresh process per path. The flat pass's first pass "
              "includes building the inputs' 64-byte-row copy with a column of ones (kept with the data).", "",
              "| PERM alpha update (global step + alpha, exact gradients) | ms | / FedAvg round, one step at a time "
              "| / FedAvg round, K steps at once |", "|---|---|---|---|"]
    a = res["alpha"]
    ref, new_round = a["fedavg_round_reference"]["median_s"], a["fedavg_round"]["median_s"]
    rows = [(f"FedAvg round (K = {w['local_steps']}, batch {w['batch_size']}, {w['clients_per_round']} clients), "
             "one step at a time (the reference)", ref),
            ("FedAvg round, K steps at once (the default)", new_round),
            ("alpha update, now (one flat pass; the global step reuses its mean)", a["alpha_update"]["median_s"]),
            ("alpha update, size buckets (two bucketed passes, torch sort)", a["alpha_update_buckets"]["median_s"]),
            ("alpha update, padded (two padded passes)", a["alpha_update_padded"]["median_s"])]
    for label, t in rows:
        lines.append(f"| {label} | {_ms(t)} | {t / ref:.2f}x | {t / new_round:.2f}x |")
    lines += ["", "Targets:", ""]
    for t in res["targets"]:
        lines.append(f"- [{'x' if t['met'] else ' '}] {t['what']}: {t['value']}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--min-size", type=int, default=250)
    p.add_argument("--max-size", type=int, default=25_810)
    p.add_argument("--median", type=float, default=1000.0)
    p.add_argument("--sigma", type=float, default=1.2)
    p.add_argument("--seed", type=int, default=18)
    p.add_argument("--test-fraction", type=float, default=0.1)
    p.add_argument("--local-steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=20)
    p.add_argument("--clients-per-round", type=int, default=10)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--quick", action="store_true", help="tiny sizes, one repeat: checks the code, not speed")
    p.add_argument("--memory-point", help=argparse.SUPPRESS)  # internal: one memory measurement in this process
    a = p.parse_args(argv)
    if a.quick:
        a.clients, a.min_size, a.max_size, a.median, a.repeats = 6, 4, 60, 12.0, 1
        a.local_steps, a.batch_size, a.clients_per_round = 2, 4, 3
    a.passthrough = ["--clients", str(a.clients), "--min-size", str(a.min_size), "--max-size", str(a.max_size),
                     "--median", str(a.median), "--sigma", str(a.sigma), "--seed", str(a.seed),
                     "--test-fraction", str(a.test_fraction), "--threads", str(a.threads)]
    if a.memory_point:
        torch.set_num_threads(a.threads)
        print(json.dumps(memory_point(a.memory_point, a)))
        return {}
    res = run(a)
    table = markdown(res)
    write_report(a.out, "uneven", res, table)  # the table has no heading: README shows it under its own
    print(table)
    return res


if __name__ == "__main__":
    main()
