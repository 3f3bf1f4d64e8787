"""Ditto's two settings on a PERM curve stage: lambda x lr, each cell Ditto alone on the stage's own setting and
round budget (``pflkit.experiments.perm.lr_sweep`` with the ``ditto`` section's lambda set), seed 0 by default.

    python benchmarks/tune_ditto.py perm_fig1 --lams 0.01,0.1,1 --grid 0.02,0.05,0.1,0.2,0.5,1,2 [--jobs 2]

Writes benchmarks/results/tuning_ditto_<stage>.csv (one row per lambda x lr; ``--add`` keeps the cells already
there, for a grid widened where its edge won; ``best``: the best cell of the whole
table by final personalized accuracy, ties to the lower loss, as ``pflkit tune`` ranks). The stage's params.yaml
values are then the best cell's, said beside them.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from pflkit.config import load_params, validate_stage
from pflkit.experiments.perm import lr_sweep
from pflkit.io import write_csv

ROOT = Path(__file__).resolve().parents[1]


def floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def main(argv: list[str] | None = None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stage")
    ap.add_argument("--lams", type=floats, default=[0.01, 0.1, 1.0])
    ap.add_argument("--grid", type=floats, required=True)
    ap.add_argument("--seeds", type=lambda t: [int(v) for v in t.split(",")], default=[0])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--add", action="store_true", help="keep the stage's earlier cells (a widened grid)")
    args = ap.parse_args(argv)
    cfg = validate_stage(load_params(ROOT / "params.yaml"), args.stage)
    if "ditto" not in cfg.methods:
        raise SystemExit(f"stage: {args.stage} runs no Ditto (its methods: {cfg.methods})")
    tables = []
    for lam in args.lams:
        t = lr_sweep(cfg, args.grid, methods=["ditto"], seeds=args.seeds, jobs=args.jobs,
                     sections={"ditto": {"lam": lam}})
        tables.append(t.drop(columns="best").assign(lam=lam))
    out = ROOT / "benchmarks" / "results" / f"tuning_ditto_{args.stage}.csv"
    if args.add and out.exists():  # a widened grid: the earlier cells stay, the new ones replace any they repeat
        tables.insert(0, pd.read_csv(out).drop(columns="best"))
    table = pd.concat(tables, ignore_index=True).drop_duplicates(["lam", "lr"], keep="last")
    table = table.sort_values(["lam", "lr"], ignore_index=True)
    ranked = table.dropna(subset=["accuracy"]).sort_values(["accuracy", "loss"], ascending=[False, True])
    table["best"] = table.index == ranked.index[0]
    write_csv(out, table)
    print(table.round(4).to_string(index=False))
    return table


if __name__ == "__main__":
    main()
