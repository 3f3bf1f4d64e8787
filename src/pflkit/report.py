"""Stage outputs: metrics.json, history/curve CSVs, and the rounded table nbval compares."""
from __future__ import annotations

import platform
from typing import Mapping

import pandas as pd
import torch

from . import __version__
from .io import write_csv, write_json
from .paths import resolve

TABLE_DECIMALS = 3


def print_table(table: pd.DataFrame, decimals: int = TABLE_DECIMALS) -> None:
    """The regression reference: values rounded so float tails never matter."""
    with pd.option_context("display.width", 200, "display.max_columns", 50):
        print(table.round(decimals).to_string())


def table_records(table: pd.DataFrame) -> dict:
    """{row: {column: value}} with NaN dropped, for metrics.json."""
    return {str(r): {str(c): float(v) for c, v in row.items() if pd.notna(v)}
            for r, row in table.iterrows()}


def environment() -> dict:
    return {"pflkit": __version__, "torch": torch.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "threads": torch.get_num_threads()}


def write_stage(results_dir: str, metrics: Mapping, history: pd.DataFrame | None = None,
                run_info: Mapping | None = None, **tables: pd.DataFrame) -> None:
    """Write metrics.json (numbers for `dvc metrics`), run.json (config, data, environment),
    history.csv and any named tables (``curves_accuracy=df`` -> curves_accuracy.csv)."""
    out = resolve(results_dir)
    if run_info is not None:
        write_json(out / "run.json", dict(run_info))
    if history is not None:
        write_csv(out / "history.csv", history)
    for name, frame in tables.items():
        write_csv(out / f"{name}.csv", frame)
    write_json(out / "metrics.json", dict(metrics))
