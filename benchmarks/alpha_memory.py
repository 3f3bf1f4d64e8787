"""Peak memory and time of one PERM alpha computation at a profile's scale (issue 20 part 1, issue 18):
the exact gradient of every client at the global model (``engine.full_gradients_at``, bounded by the
full-batch budget), the discrepancies and the mixing weights, exactly what ``PERM.init`` runs with
``alpha_init='estimate'`` and no warm-up.

    python benchmarks/alpha_memory.py [--stage perm_fig2] [--profile paper] [--budgets 256,64] [--threads 1]
    python benchmarks/alpha_memory.py --profile smoke --out /tmp/bench       # seconds: checks the code

Each budget (MiB of activations per full-batch call, ``engine.full_batch.FULL_BATCH_BYTES``) runs in a
fresh process: peak resident memory (VmHWM) of the whole process and its growth during the alpha
computation (VmHWM after ``/proc/self/clear_refs`` minus the resident memory before), with the data
loaded and the model built before the measurement. Writes ``<out>/alpha_memory.{json,md}``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))  # the sibling benchmark modules
from uneven import rss_growth, _status_kb  # noqa: E402


def point(stage: str, profile: str, budget_mib: int) -> dict:
    """In this (fresh) process: one alpha computation of ``stage`` under ``profile``."""
    from pflkit.config import load_params, validate_stage
    from pflkit.engine import FunctionalModel, full_batch, resolve_device
    from pflkit.experiments import perm as E
    from pflkit.experiments.images import image_federation, load_images
    cfg = validate_stage(load_params(ROOT / "params.yaml"), stage, profile)
    device = resolve_device(cfg.device)
    img = load_images(cfg.dataset)
    seed = cfg.seeds[0]
    data = image_federation(cfg, img, seed).with_label_groups(cfg.label_groups).to(device)
    model = FunctionalModel(cfg.model.factory(img.shape, img.num_classes), device)
    perm_cfg = cfg.model_copy(update={"perm": cfg.perm.model_copy(update={"warmup_rounds": 0,
                                                                          "alpha_init": "estimate"})})
    algo = E.METHODS["perm"].make(model, perm_cfg)
    full_batch.FULL_BATCH_BYTES = budget_mib * 2**20
    data.size_buckets("train")  # the data's own copies, built before the measurement
    out = {}

    def run():
        start = time.perf_counter()
        out["state"] = algo.init(data, seed)  # computes alpha at the initial model
        out["seconds"] = time.perf_counter() - start

    growth = rss_growth(run)
    params = sum(p.numel() for p in model.init(0).values())
    return {"stage": stage, "profile": profile, "budget_mib": budget_mib, "seconds": out["seconds"],
            "peak_rss_bytes": _status_kb("VmHWM"), "growth_bytes": growth, "clients": data.num_clients,
            "train_rows": int(data.train_sizes.sum()), "rows_per_client": int(data.train_sizes.max()),
            "parameters": params, "model": cfg.model.name,
            "rows_per_call": full_batch.rows_per_call(model, data),
            "activation_bytes_per_row": model.activation_bytes(data.feature_shape),
            "alpha_finite": bool(torch.isfinite(out["state"].alpha).all()), "threads": torch.get_num_threads()}


def markdown(res: dict) -> str:
    m = res["machine"]
    first = res["points"][0]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, {first['threads']} thread(s); memory "
             f"{m['memory_gib']:.0f} GiB.", "",
             f"{first['stage']} under profile `{first['profile']}`: {first['clients']} clients, "
             f"{first['train_rows']:,} train rows (up to {first['rows_per_client']:,} per client), "
             f"model {first['model']} with {first['parameters']:,} parameters "
             f"({first['activation_bytes_per_row'] / 1024:,.0f} KiB of activations per row). One alpha "
             "computation (exact client gradients at the global model, discrepancies, mixing weights), one "
             "fresh process per budget:", "",
             "| full-batch budget | rows per call | time | peak RSS of the process | growth during the alpha "
             "computation |", "|---|---|---|---|---|"]
    for p in res["points"]:
        lines.append(f"| {p['budget_mib']} MiB | {p['rows_per_call']:,} | {p['seconds']:,.1f} s | "
                     f"{p['peak_rss_bytes'] / 2**30:.2f} GiB | {p['growth_bytes'] / 2**30:.2f} GiB |")
    lines += ["", "Before this budget a full-batch call took a whole size bucket (here every client's rows at "
              "once): the same computation was killed for memory on this 23 GB machine "
              "(benchmarks/results/paper_estimates.md)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", default="perm_fig2")
    p.add_argument("--profile", default="paper")
    p.add_argument("--budgets", default="256,64", help="MiB per full-batch call, comma-separated")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--point", type=int, help=argparse.SUPPRESS)  # internal: one budget in this process
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.point is not None:
        print(json.dumps(point(a.stage, a.profile, a.point)))
        return {}
    from pflkit.io import write_report
    from speed import machine_info
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024), "OMP_NUM_THREADS": str(a.threads)}
    points = []
    for budget in (int(b) for b in a.budgets.split(",")):
        print(f"[alpha_memory] {a.stage} ({a.profile}), budget {budget} MiB ...", file=sys.stderr, flush=True)
        cmd = [sys.executable, __file__, "--stage", a.stage, "--profile", a.profile, "--threads", str(a.threads),
               "--point", str(budget)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"budget {budget} MiB failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
        points.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    machine = machine_info(torch.device("cpu"))
    machine["memory_gib"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    res = {"machine": machine, "points": points}
    table = markdown(res)
    write_report(a.out, "alpha_memory", res, table)
    print(table)
    return res


if __name__ == "__main__":
    main()
