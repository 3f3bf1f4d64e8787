"""Stage outputs: the one result type every figure function returns (:class:`StageResult`), metrics.json,
history/curve CSVs, and the rounded table nbval compares."""
from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import pandas as pd

from . import __version__, stages
from .io import write_csv, write_json
from .paths import project_root, resolve, shown

TABLE_DECIMALS = 3


@dataclass
class StageResult:
    """A figure function's result.

    * ``table``: the final table the notebook prints (what the regression checks compare);
    * ``metrics``: what goes to metrics.json (numbers, which dataset ran, claim verdicts);
    * ``data_label`` / ``scale``: the dataset that ran (a substitute named as such) and the scale, for
      titles and text;
    * ``run_info``: what goes to run.json (config, data summary, environment);
    * ``frames``: the stage's other tables by name (``history``, ``curves``, ``frame``, ...);
    * ``extra``: anything else a figure needs (final states, grids, labels).

    A name in ``frames`` or ``extra`` reads as an attribute: ``result.history`` is
    ``result.frames["history"]``."""

    table: pd.DataFrame
    metrics: dict
    data_label: str
    scale: str
    run_info: dict = field(default_factory=dict)
    frames: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def __getattr__(self, name: str):
        if not name.startswith("__"):
            for bag in ("frames", "extra"):
                values = self.__dict__.get(bag) or {}
                if name in values:
                    return values[name]
        frames, extra = sorted(self.__dict__.get("frames") or {}), sorted(self.__dict__.get("extra") or {})
        raise AttributeError(f"{type(self).__name__} has no {name!r} (frames: {frames}, extra: {extra})")


def print_table(table: pd.DataFrame, decimals: int = TABLE_DECIMALS) -> None:
    """The regression reference: values rounded so float tails never matter."""
    with pd.option_context("display.width", 200, "display.max_columns", 50):
        print(table.round(decimals).to_string())


def table_records(table: pd.DataFrame) -> dict:
    """{row: {column: value}} with NaN dropped, for metrics.json."""
    return {str(r): {str(c): float(v) for c, v in row.items() if pd.notna(v)}
            for r, row in table.iterrows()}


def environment() -> dict:
    """What ran a compute stage, for run.json (torch imported here: a plot notebook reads results, no torch)."""
    import torch

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


class ResultsFileError(ValueError):
    """A results file a plot stage, a notebook's text or the claims ledger reads is missing, empty or not
    what it should be. The message names the file (relative to the project), the compute stage that writes
    it and the command that does (``dvc repro <stage>``; for a profile's results under build/<profile>/,
    ``python -m pflkit reproduce --profile <profile> --stages <stage>``)."""

    def __init__(self, path, problem: str):
        self.path, self.problem = Path(path), problem
        self.stage, command = results_writer(self.path.parent)
        super().__init__(f"{shown(self.path)}: {problem}; written by stage {self.stage}: run `{command}`")


def results_writer(folder) -> tuple[str, str]:
    """(stage, command) that writes results folder ``folder``: results/<stage> is ``dvc repro <stage>``'s,
    build/<profile>/<stage> is ``python -m pflkit reproduce``'s for that profile."""
    folder = Path(folder)
    stage = folder.name
    root = project_root()
    parts = folder.relative_to(root).parts if folder.is_absolute() and folder.is_relative_to(root) else ()
    if len(parts) == 3 and parts[0] == "build":
        return stage, f"python -m pflkit reproduce --profile {parts[1]} --stages {stage}"
    return stage, f"dvc repro {stage}"


def read_json(path, kind: type = dict):
    """A results JSON file (metrics.json, run.json), checked: present, parses, and a ``kind`` (an object)."""
    path = resolve(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ResultsFileError(path, "missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsFileError(path, f"unreadable ({exc})") from None
    if not text.strip():
        raise ResultsFileError(path, "empty")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ResultsFileError(path, f"not valid JSON ({exc})") from None
    if not isinstance(value, kind):
        raise ResultsFileError(path, f"holds a JSON {type(value).__name__}, not an object")
    return value


def read_csv(path) -> pd.DataFrame:
    """A results CSV (history.csv, a named table), checked: present, not empty, parses into columns."""
    path = resolve(path)
    try:
        frame = pd.read_csv(path)
    except FileNotFoundError:
        raise ResultsFileError(path, "missing") from None
    except pd.errors.EmptyDataError:
        raise ResultsFileError(path, "empty") from None
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, ValueError) as exc:
        raise ResultsFileError(path, f"not a readable CSV ({' '.join(str(exc).split())})") from None
    unnamed = [c for c in frame.columns if str(c).startswith("Unnamed: ")]
    if unnamed and len(unnamed) == len(frame.columns):
        raise ResultsFileError(path, "not a CSV table (no column names)")
    return frame


def read_result(results_dir: str):
    """What a compute stage wrote in ``results_dir``, as a StageResult for its plot stage: metrics.json,
    run.json (``run_info``; ``data_label`` and ``scale`` from it), every CSV as a frame named by its stem
    (``result.history``, ``result.curves``, ...). Every file is checked (:func:`read_json`,
    :func:`read_csv`), and for a stage of ``pflkit.stages`` every file it declares must be there: a missing
    folder or file, or an empty or garbled one, is a :class:`ResultsFileError` naming the file, the stage
    that writes it and the command to run."""
    folder = resolve(results_dir)
    if not (folder / "metrics.json").is_file():
        raise ResultsFileError(folder / "metrics.json", "missing (no results here: the compute stage has not "
                               "run with this profile; or run its notebook with the same profile)")
    metrics = read_json(folder / "metrics.json")
    spec = stages.get(folder.name)
    for name in (spec.results if spec is not None and not spec.is_plot else ()):
        if not (folder / name).is_file():
            raise ResultsFileError(folder / name, f"missing (stage {spec.name} writes it beside metrics.json)")
    run = folder / "run.json"
    run_info = read_json(run) if run.exists() else {}
    frames = {p.stem: read_csv(p) for p in sorted(folder.glob("*.csv"))}
    return StageResult(pd.DataFrame(), metrics, run_info.get("data_label", ""), run_info.get("scale", ""),
                       run_info, frames)


def read_results(stage: str) -> tuple[dict, dict] | None:
    """(metrics.json, run.json) of the stage's ``dvc repro`` run (results/<stage>/), or None when the
    stage has not run here (a fresh clone: ``dvc repro <stage>`` or ``dvc pull`` brings them). A file
    that is there but empty or garbled is a :class:`ResultsFileError`."""
    folder = resolve(f"results/{stage}")
    if not (folder / "metrics.json").is_file():
        return None
    run = folder / "run.json"
    return read_json(folder / "metrics.json"), (read_json(run) if run.exists() else {})


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
