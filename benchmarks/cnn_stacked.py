"""The stacked CNN client update (issue 31): the convolution layouts by measurement, perm_fig2's paper-profile
round before and after, and the speed/overhead benchmarks before and after.

    python benchmarks/cnn_stacked.py --before ../wt-base      # a checkout of the commit before the change
    python benchmarks/cnn_stacked.py --estimates none         # reuse the perm_fig2 estimates already written
    python benchmarks/cnn_stacked.py --quick --out /tmp/bench # seconds: tiny sizes, checks the code

1. **Layouts.** One FedAvg round (K = 20 local steps, N = 50 clients, random 28 x 28 images) of speed.py's
   CNN workload (conv8-conv16-fc64, batch 20) and of perm_fig2's paper-profile CNN (conv32-conv64-fc512,
   batch 10), per client update: the K-step path with the convolutions as a loop of plain convolutions
   (``conv_layout="loop"``) or as one grouped convolution (``"grouped"``), vmap one step at a time
   (``fast_steps=False``: the path every CNN took before), and the per-client autograd loop
   (``reference.fedavg``). Repeats interleaved (a change in machine load hits all alike), medians; the
   largest parameter difference of each K-step layout to the vmap path after one round from the same
   state and draws (float32).
2. **perm_fig2, paper profile.** ``benchmarks/paper_estimates.py --stages perm_fig2`` run in its own
   process from the checkout ``--before`` (before) and from this tree (after); each run's files are kept
   as ``<out>/cnn_stacked/perm_fig2_{before,after}.{json,md}`` (``--estimates before,after`` picks which
   to run again; ``none`` reuses both).
3. **Other workloads.** speed.py's and overhead.py's results before (``<out>/cnn_stacked/*_before.json``:
   the scripts of the checkout before the change, run on the same machine with ``--out`` there) and now
   (``<out>/speed.json``, ``<out>/overhead_cpu.json``: run speed.py and overhead.py first). The table
   names both runs' machines: compare only rows measured on the same one.

Writes ``<out>/cnn_stacked.json`` and ``<out>/cnn_stacked.md``; GPU rows say "not measured (no device
lent)" unless a CUDA device ran the layouts.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the sibling benchmark modules
sys.path.insert(0, str(HERE.parent / "src"))
from speed import LR, image_data, machine_info, time_it  # noqa: E402

from pflkit.algorithms import FedAvg  # noqa: E402
from pflkit.engine import FunctionalModel, resolve_device  # noqa: E402
from pflkit.io import write_report  # noqa: E402
from pflkit.models import cnn  # noqa: E402
from reference import fedavg as ref_fedavg  # noqa: E402  (tests/reference: speed put tests/ on sys.path)

PATHS = ("loop", "grouped", "vmap", "reference")
NO_DEVICE = "not measured (no device lent)"


def cnn_workloads(quick: bool) -> list[dict]:
    if quick:
        return [{"name": "tiny CNN", "channels": (2, 4), "hidden": 8, "batch": 4, "clients": 3, "steps": 2}]
    return [{"name": "speed.py CNN conv8-conv16-fc64, batch 20", "channels": (8, 16), "hidden": 64, "batch": 20,
             "clients": 50, "steps": 20},
            {"name": "perm_fig2 paper CNN conv32-conv64-fc512, batch 10", "channels": (32, 64), "hidden": 512,
             "batch": 10, "clients": 50, "steps": 20}]


def layouts(w: dict, repeats: int, device) -> dict:
    """One FedAvg round per client-update path (medians of interleaved repeats)."""
    data = image_data(w["clients"], 8 if w["clients"] < 10 else 100).to(device)

    def factory():
        return cnn((1, 28, 28), 10, channels=w["channels"], hidden=w["hidden"])
    models = {"loop": FunctionalModel(factory, device, conv_layout="loop"),
              "grouped": FunctionalModel(factory, device, conv_layout="grouped"),
              "vmap": FunctionalModel(factory, device, fast_steps=False)}
    algos = {k: FedAvg(m, local_steps=w["steps"], lr=LR, batch_size=w["batch"]) for k, m in models.items()}
    states = {k: a.init(data, 0) for k, a in algos.items()}
    after = {k: a.round(a.init(data, 0)).w for k, a in algos.items()}  # warm-up; same start, same draws
    diff = {k: max((after[k][p] - after["vmap"][p]).abs().max().item() for p in after[k]) for k in ("loop", "grouped")}
    w0 = states["vmap"].w
    run = {k: (lambda a=algos[k], s=states[k]: a.round(s)) for k in algos}
    run["reference"] = lambda: ref_fedavg.fedavg(factory, w0, data, 1, w["steps"], LR, w["batch"], seed=0)
    times = {k: [] for k in PATHS}
    for _ in range(repeats):
        for k in PATHS:
            times[k] += time_it(run[k], 1, device)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {**w, "channels": list(w["channels"]), "threads": torch.get_num_threads(), "device": str(device),
            "repeats": repeats, "median_s": med, "range_s": {k: [min(v), max(v)] for k, v in times.items()},
            "max_abs_diff_to_vmap": diff, "fastest": min(("loop", "grouped"), key=med.get)}


def run_estimate(tree: Path, out: Path, threads: int) -> None:
    """perm_fig2's paper-profile estimate by ``tree``'s own paper_estimates.py, in a fresh process."""
    for suffix in (".json", ".md"):
        out.with_suffix(suffix).unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(tree / "src")}
    cmd = [sys.executable, str(tree / "benchmarks" / "paper_estimates.py"), "--stages", "perm_fig2",
           "--threads", str(threads), "--out", str(out)]
    print("[cnn_stacked]", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, env=env, check=True)


def read_estimate(path: Path) -> dict | None:
    if not path.is_file():
        return None
    rows = [e for e in json.loads(path.read_text())["stages"] if e["stage"] == "perm_fig2"]
    return rows[0] if rows else None


def git_commit(tree: Path) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _ms(s: float) -> str:
    return f"{s * 1e3:,.1f}"


def _pairs(before: dict | None, after: dict | None, key) -> list[tuple]:
    """(label, before row, after row) of two benchmark result files' rows, matched by ``key``."""
    if not before or not after:
        return []
    old = {key(r): r for r in before}
    return [(key(r), old[key(r)], r) for r in after if key(r) in old]


def markdown(res: dict) -> str:
    m = res["machine"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}; written by benchmarks/cnn_stacked.py.", "",
             "**Layouts** (one FedAvg round, K = 20, N = 50; median of interleaved repeats, min-max; the K-step "
             "paths' largest parameter difference to the vmap path after one round, float32):", "",
             "| workload | device | threads | K steps, loop of convolutions | K steps, grouped convolution | "
             "vmap, one step at a time (before) | per-client autograd loop | loop vs vmap | loop vs per-client "
             "loop | max abs difference (loop, grouped) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["layouts"]:
        med, rng = r["median_s"], r["range_s"]
        cell = {k: f"{_ms(med[k])} ({_ms(rng[k][0])}-{_ms(rng[k][1])}) ms" for k in PATHS}
        lines.append(f"| {r['name']} | {r['device']} | {r['threads']} | {cell['loop']} | {cell['grouped']} | "
                     f"{cell['vmap']} | {cell['reference']} | {med['vmap'] / med['loop']:.2f}x | "
                     f"{med['reference'] / med['loop']:.2f}x | {r['max_abs_diff_to_vmap']['loop']:.1e}, "
                     f"{r['max_abs_diff_to_vmap']['grouped']:.1e} |")
    if not any(r["device"].startswith("cuda") for r in res["layouts"]):
        lines.append(f"| (either) | cuda | - | {NO_DEVICE} | {NO_DEVICE} | {NO_DEVICE} | {NO_DEVICE} | - | - | - |")
    lines += ["", "Fastest K-step layout per workload and device: "
              + "; ".join(f"{r['name']} ({r['device']}): {r['fastest']}" for r in res["layouts"])
              + f". `stacked_conv.CONV_LAYOUT`: {json.dumps(res['conv_layout'])} (other device types: grouped; "
              f"cuda: {NO_DEVICE})."]
    est = res["perm_fig2"]
    lines += ["", "**perm_fig2, paper profile** (benchmarks/paper_estimates.py, 1 thread: one round and one "
              "evaluation per method on seed 0's federation; CNN conv32-conv64-fc512, N = 50, K = 20, batch 10):", ""]
    if est["before"] and est["after"]:
        b, a = est["before"], est["after"]
        lines += [f"Before: {est['before_commit'] or 'the commit before'}; after: {est['after_commit'] or 'this tree'}"
                  " (with uncommitted changes if any).", "",
                  "| method | round s before | round s after | round speedup | evaluation s before | "
                  "evaluation s after | s per seed before | s per seed after |", "|---|---|---|---|---|---|---|---|"]
        for name, rb in b["detail"].items():
            ra = a["detail"].get(name, {})
            if "round_s" not in rb or "round_s" not in ra:
                continue
            lines.append(f"| {name} | {rb['round_s']:.2f} | {ra['round_s']:.2f} | "
                         f"{rb['round_s'] / ra['round_s']:.2f}x | {rb['eval_s']:.2f} | {ra['eval_s']:.2f} | "
                         f"{rb['seconds_per_seed']:,.0f} | {ra['seconds_per_seed']:,.0f} |")
        lines += ["", f"Whole-stage estimate (3 seeds, 300 rounds): {b['seconds'] / 3600:.1f} h before, "
                  f"{a['seconds'] / 3600:.1f} h after ({b['seconds'] / a['seconds']:.2f}x). Per-FedAvg (FO) and "
                  "pFedMe take their own client steps (not plain SGD), which stay on vmap; evaluation is unchanged.",
                  "", f"GPU: {NO_DEVICE}."]
    else:
        lines.append("(no estimate files: run with --before and --estimates before,after)")
    sp = _pairs(res.get("speed_before"), res.get("speed_after"), lambda r: (r["label"], r["algorithm"], r["threads"]))
    if sp:
        lines += ["", "**speed.py** (batched vs the per-client reference loop; before = the commit before the change, "
                  f"after = this tree; machines: before {res.get('speed_before_machine')}, after "
                  f"{res.get('speed_after_machine')}):", "",
                  "| workload | round | threads | batched ms before | batched ms after | reference ms before | "
                  "reference ms after | speedup before | speedup after |", "|---|---|---|---|---|---|---|---|---|"]
        for (label, alg, thr), rb, ra in sp:
            lines.append(f"| {label} | {alg} | {thr} | {_ms(rb['batched']['median_s'])} | "
                         f"{_ms(ra['batched']['median_s'])} | {_ms(rb['reference']['median_s'])} | "
                         f"{_ms(ra['reference']['median_s'])} | {rb['speedup']:.1f}x | {ra['speedup']:.1f}x |")
    ov = _pairs(res.get("overhead_before"), res.get("overhead_after"), lambda r: r["label"])
    if ov:
        lines += ["", "**overhead.py**, K steps at once vs one step at a time (1 thread, FedAvg round; machines: "
                  f"before {res.get('overhead_before_machine')}, after {res.get('overhead_after_machine')}):", "",
                  "| workload | K-step round ms before | K-step round ms after | speedup over one step at a time "
                  "before | after |", "|---|---|---|---|---|"]
        for label, rb, ra in ov:
            lines.append(f"| {label} | {rb['new_s'] * 1e3:,.2f} | {ra['new_s'] * 1e3:,.2f} | {rb['speedup']:.2f}x | "
                         f"{ra['speedup']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds per path and workload")
    p.add_argument("--device", default="cpu")
    p.add_argument("--before", help="a checkout of the commit before the change (for the 'before' estimate)")
    p.add_argument("--estimates", default="before,after", help="which perm_fig2 estimates to run: before, after, "
                   "none (reuse the files)")
    p.add_argument("--skip-layouts", action="store_true", help="reuse the layout rows of <out>/cnn_stacked.json")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--quick", action="store_true", help="tiny layouts only, no estimates: checks the code")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    device = resolve_device(a.device)
    out = Path(a.out)
    folder = out / "cnn_stacked"
    folder.mkdir(parents=True, exist_ok=True)
    previous = json.loads((out / "cnn_stacked.json").read_text()) if (out / "cnn_stacked.json").is_file() else {}
    res = {"machine": machine_info(device), "threads": a.threads}
    from pflkit.engine.stacked_conv import CONV_LAYOUT
    res["conv_layout"] = CONV_LAYOUT
    started = time.perf_counter()
    if a.skip_layouts and previous.get("layouts"):
        res["layouts"] = previous["layouts"]
    else:
        res["layouts"] = []
        for w in cnn_workloads(a.quick):
            print(f"[cnn_stacked] layouts: {w['name']} ...", file=sys.stderr, flush=True)
            res["layouts"].append(layouts(w, 1 if a.quick else a.repeats, device))
    wanted = set() if a.quick or a.estimates == "none" else set(a.estimates.split(","))
    if "before" in wanted:
        if not a.before:
            raise SystemExit("--estimates before needs --before (a checkout of the commit before the change)")
        run_estimate(Path(a.before).resolve(), folder / "perm_fig2_before", a.threads)
    if "after" in wanted:
        run_estimate(HERE.parent, folder / "perm_fig2_after", a.threads)
    res["perm_fig2"] = {"before": read_estimate(folder / "perm_fig2_before.json"),
                        "after": read_estimate(folder / "perm_fig2_after.json"),
                        "before_commit": git_commit(Path(a.before)) if a.before else
                        (previous.get("perm_fig2") or {}).get("before_commit"),
                        "after_commit": git_commit(HERE.parent) if "after" in wanted else
                        (previous.get("perm_fig2") or {}).get("after_commit")}
    for name, after in (("speed", out / "speed.json"), ("overhead", out / f"overhead_{device.type}.json")):
        before = folder / f"{after.stem}_before.json"
        key = "speed" if name == "speed" else "steps"
        for when, path in (("before", before), ("after", after)):
            got = json.loads(path.read_text()) if path.is_file() else {}
            res[f"{name}_{when}"] = got.get(key)
            res[f"{name}_{when}_machine"] = got["machine"]["cpu"] if got else None
    res["wall_s"] = time.perf_counter() - started
    text = markdown(res)
    write_report(out, "cnn_stacked", res, text)
    print(text)
    return res


if __name__ == "__main__":
    main()
