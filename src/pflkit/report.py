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


#: keys that describe how a run went rather than what it found: written to run.json, never to
#: metrics.json, so re-running a stage on the same machine gives a byte-identical metrics.json and
#: ``dvc metrics diff`` shows only real changes
RUN_KEYS = ("runtime_s", "seconds", "environment", "config", "device")


def split_run_keys(metrics: Mapping) -> tuple[dict, dict]:
    """(results, run description): every RUN_KEYS entry, at any depth of nested dicts, moves to the
    second dict under its dotted path (``tasks.femnist.seconds``)."""
    moved: dict = {}

    def strip(obj, prefix: str):
        if not isinstance(obj, Mapping):
            return obj
        kept = {}
        for k, v in obj.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            if k in RUN_KEYS:
                moved[path] = v
            else:
                kept[k] = strip(v, path)
        return kept

    return strip(metrics, ""), moved


def write_stage(results_dir: str, metrics: Mapping, history: pd.DataFrame | None = None,
                run_info: Mapping | None = None, **tables: pd.DataFrame) -> None:
    """Write metrics.json (the results; the claims ledger reads them), run.json (config, data, environment,
    runtimes: everything :func:`split_run_keys` moves out of ``metrics``), history.csv and any named
    tables (``curves_accuracy=df`` -> curves_accuracy.csv)."""
    out = resolve(results_dir)
    results, described = split_run_keys(metrics)
    write_json(out / "run.json", {**dict(run_info or {}), **described})
    if history is not None:
        write_csv(out / "history.csv", history)
    for name, frame in tables.items():
        write_csv(out / f"{name}.csv", frame)
    write_json(out / "metrics.json", results)


def write_result(results_dir: str, result, history: bool = True, **tables: pd.DataFrame) -> None:
    """:func:`write_stage` for a StageResult: its metrics, its run info with the dataset label and scale
    (what a plot stage puts in titles), its history (when it has one and ``history``) and ``tables``."""
    run_info = {**(result.run_info or {}), "data_label": result.data_label, "scale": result.scale}
    frames = result.frames or {}
    write_stage(results_dir, result.metrics, history=frames.get("history") if history else None,
                run_info=run_info, **tables)


def read_result(results_dir: str):
    """What a compute stage wrote in ``results_dir``, as a StageResult for its plot stage: metrics.json,
    run.json (``run_info``; ``data_label`` and ``scale`` from it), every CSV as a frame named by its stem
    (``result.history``, ``result.curves``, ...). A missing folder is an error saying which notebook or
    stage writes it."""
    import json

    from .experiments.result import StageResult
    folder = resolve(results_dir)
    if not (folder / "metrics.json").is_file():
        stage = folder.name
        raise FileNotFoundError(f"{folder} holds no results: run the compute stage first (`dvc repro {stage}`, or its "
                                f"notebook with the same profile)")
    metrics = json.loads((folder / "metrics.json").read_text())
    run = folder / "run.json"
    run_info = json.loads(run.read_text()) if run.is_file() else {}
    frames = {p.stem: pd.read_csv(p) for p in sorted(folder.glob("*.csv"))}
    return StageResult(pd.DataFrame(), metrics, run_info.get("data_label", ""), run_info.get("scale", ""),
                       run_info, frames)


def read_results(stage: str) -> tuple[dict, dict] | None:
    """(metrics.json, run.json) of the stage's ``dvc repro`` run (results/<stage>/), or None when the
    stage has not run here (a fresh clone: ``dvc repro <stage>`` or ``dvc pull`` brings them)."""
    import json
    folder = resolve(f"results/{stage}")
    if not (folder / "metrics.json").is_file():
        return None
    run = folder / "run.json"
    return (json.loads((folder / "metrics.json").read_text()),
            json.loads(run.read_text()) if run.is_file() else {})


def print_measured(cfg, describe, metrics: Mapping | None = None, scale: str = "") -> None:
    """What the notebook's text reports at params.yaml scale (never typed into the notebook, so it
    cannot go stale): ``describe(metrics)`` of this run (at ``scale``) when it is the default profile's
    (what ``dvc repro`` runs, writing results/<stage>/), else of the results ``dvc repro`` wrote there."""
    stage = cfg.stage
    if metrics is not None and cfg.results_dir == f"results/{stage}":
        print(f"this run is at params.yaml scale (profile default): {scale}".rstrip(": "))
        print(describe(metrics))
        return
    found = read_results(stage)
    if found is None:
        print(f"{stage} has not run at params.yaml scale here: `dvc repro {stage}` (or `dvc pull`) writes "
              f"results/{stage}/, which this cell reads")
        return
    saved, run = found
    print(f"measured at params.yaml scale (results/{stage}/, written by `dvc repro {stage}`): "
          f"{run.get('scale', '')}".rstrip(": "))
    print(describe(saved))
