"""Stage outputs: the one result type every figure function returns (:class:`StageResult`), metrics.json,
history/curve CSVs, and the rounded table nbval compares; the provenance every results file carries (which
stage wrote it, with which settings) and the readers that check it."""
from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import pandas as pd

from . import __version__, config, stages
from .io import jsonable, write_csv, write_json
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
    tables (``curves_accuracy=df`` -> curves_accuracy.csv).

    Both JSON files record their provenance under ``"provenance"`` (:func:`provenance`: the stage whose
    results folder ``results_dir`` is and the digest of the settings params.yaml gives it); run.json's also
    lists the SHA-256 of every CSV written with it, so each file of the folder is tied to the run. metrics.json
    is written last: a folder with one holds the whole run."""
    out = resolve(results_dir)
    results, described = split_run_keys(metrics)
    for where, keys in (("metrics", results), ("run_info", run_info or {})):
        if PROVENANCE in keys:
            raise ValueError(f"{where}: the key {PROVENANCE!r} is the writer's (the stage and its settings); "
                             "rename that entry")
    stamp = provenance(out)
    frames = {**({"history": history} if history is not None else {}), **tables}
    files = {}
    for name, frame in frames.items():
        path = write_csv(out / f"{name}.csv", frame)
        files[path.name] = _file_sha256(path)
    write_json(out / "run.json", {**dict(run_info or {}), **described, PROVENANCE: {**stamp, "files": files}})
    write_json(out / "metrics.json", {**results, PROVENANCE: stamp})


def write_result(results_dir: str, result, history: bool = True, **tables: pd.DataFrame) -> None:
    """:func:`write_stage` for a StageResult: its metrics, its run info with the dataset label and scale
    (what a plot stage puts in titles), its history (when it has one and ``history``) and ``tables``."""
    run_info = {**(result.run_info or {}), "data_label": result.data_label, "scale": result.scale}
    frames = result.frames or {}
    write_stage(results_dir, result.metrics, history=frames.get("history") if history else None,
                run_info=run_info, **tables)


#: the key of metrics.json and run.json that records which stage wrote them, with which settings
PROVENANCE = "provenance"


def settings_digest(params: Mapping, stage: str, profile: str) -> str | None:
    """The SHA-256 (hex) of the settings ``params`` (params.yaml's contents) gives ``stage`` under ``profile``:
    :func:`pflkit.config.stage_values` without the runner's keys (the stage's name and output folders), as
    sorted JSON. The writer records it and every reader computes the expected one with this function. None when
    ``params`` gives the stage no settings under that profile (no section for it, or no such profile)."""
    try:
        values = config.stage_values(params, stage, profile)
    except config.ConfigError:
        return None
    kept = jsonable({k: v for k, v in values.items() if k not in config.RUNNER_KEYS})
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def results_origin(folder) -> tuple[str, str | None]:
    """(stage, profile) of results folder ``folder`` (``config.output_dirs``' layout): results/<stage> is the
    default profile's, build/<profile>/<stage> that profile's (a profile's name may hold a '/': the canary's
    ``canary/<profile>``); any other folder is named <stage> by its last part, with no profile (None)."""
    folder = Path(folder)
    root = project_root()
    parts = folder.relative_to(root).parts if folder.is_absolute() and folder.is_relative_to(root) else ()
    if len(parts) >= 3 and parts[0] == "build":
        return folder.name, "/".join(parts[1:-1])
    if len(parts) == 2 and parts[0] == "results":
        return folder.name, config.DEFAULT_PROFILE
    return folder.name, None


def _params() -> dict:
    """The params.yaml a notebook reads (``$PFLKIT_PARAMS`` when set: the stage runner's, else the project's)."""
    return config.load_params(os.environ.get(config.PARAMS_ENV) or resolve("params.yaml"))


def provenance(folder, params: Mapping | None = None) -> dict:
    """What results folder ``folder`` records of its origin: ``{"stage": <stage>, "settings": <digest>}``, the
    stage and profile of :func:`results_origin` and their :func:`settings_digest` in ``params`` (default: the
    params.yaml a notebook reads); settings None for a folder of no profile."""
    stage, profile = results_origin(resolve(folder))
    if profile is None:
        return {"stage": stage, "settings": None}
    return {"stage": stage, "settings": settings_digest(_params() if params is None else params, stage, profile)}


def _short(digest) -> str:
    return "none" if digest is None else str(digest)[:12]


def provenance_problem(recorded, expected: Mapping) -> str | None:
    """Why a results file whose ``"provenance"`` entry is ``recorded`` is not the one ``expected``
    (:func:`provenance`) describes, or None: it records none (written before results carried it), or another
    stage or other settings; the message names both."""
    if not isinstance(recorded, Mapping) or not {"stage", "settings"} <= set(recorded):
        return ("records no stage or settings (written before results recorded their provenance): re-run the "
                "stage to rewrite it")
    if recorded["stage"] == expected["stage"] and recorded["settings"] == expected["settings"]:
        return None
    what = "another stage's results" if recorded["stage"] != expected["stage"] else "results of other settings"
    return (f"{what}: written by stage {recorded['stage']} with settings {_short(recorded['settings'])}, but this "
            f"folder is stage {expected['stage']}'s, whose settings in params.yaml are now "
            f"{_short(expected['settings'])}")


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class ResultsFileError(ValueError):
    """A results file a plot stage, a notebook's text or the claims ledger reads is missing, empty or not
    what it should be. The message names the file (relative to the project), the compute stage that writes
    it and the command that does (``dvc repro <stage>``; for a profile's results under build/<profile>/,
    ``python -m pflkit reproduce --profile <profile> --stages <stage>``)."""

    #: how the message names the stage before its command
    whose = "written by stage {stage}"

    def __init__(self, path, problem: str):
        self.path, self.problem = Path(path), problem
        self.stage, command = results_writer(self.path.parent)
        super().__init__(f"{shown(self.path)}: {problem}; {self.whose.format(stage=self.stage)}: run `{command}`")


def results_writer(folder) -> tuple[str, str]:
    """(stage, command) that writes results folder ``folder``: results/<stage> is ``dvc repro <stage>``'s,
    build/<profile>/<stage> is ``python -m pflkit reproduce``'s for that profile."""
    stage, profile = results_origin(folder)
    if profile not in (None, config.DEFAULT_PROFILE) and "/" not in profile:  # not the canary's: its own command
        return stage, f"python -m pflkit reproduce --profile {profile} --stages {stage}"
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


class ProvenanceError(ResultsFileError):
    """A results file that is not what the folder's stage wrote with the settings params.yaml gives it now: it
    records no provenance (written before results carried it), another stage's or other settings' (the message
    names both), or a CSV that is not the one its run.json lists."""

    whose = "stage {stage} rewrites it"


def check_provenance(path, data: dict, expected: Mapping) -> dict:
    """Remove ``data``'s (a results JSON file's contents) ``"provenance"`` entry and return it, if it is
    ``expected`` (:func:`provenance`); else a :class:`ProvenanceError` naming the file, both stages and both
    settings digests (:func:`provenance_problem`)."""
    recorded = data.pop(PROVENANCE, None)
    problem = provenance_problem(recorded, expected)
    if problem:
        raise ProvenanceError(path, problem)
    return recorded


def _check_tables(folder: Path, recorded: Mapping) -> None:
    """Every CSV of ``folder`` is one run.json lists (``recorded["files"]``), with its SHA-256, and every one it
    lists is there: else a :class:`ProvenanceError` naming the file."""
    files = recorded.get("files") if isinstance(recorded.get("files"), Mapping) else {}
    for path in sorted(folder.glob("*.csv")):
        if path.name not in files:
            raise ProvenanceError(path, f"not written by stage {recorded['stage']}'s run (run.json does not list it)")
        if files[path.name] != _file_sha256(path):
            raise ProvenanceError(path, f"not the file stage {recorded['stage']}'s run wrote (its SHA-256 differs "
                                        "from the one run.json records)")
    for name in sorted(files):
        if not (folder / name).is_file():
            raise ResultsFileError(folder / name, "missing (run.json lists it)")


def read_result(results_dir: str):
    """What a compute stage wrote in ``results_dir``, as a StageResult for its plot stage: metrics.json,
    run.json (``run_info``; ``data_label`` and ``scale`` from it), every CSV as a frame named by its stem
    (``result.history``, ``result.curves``, ...). Every file is checked (:func:`read_json`,
    :func:`read_csv`), and for a stage of ``pflkit.stages`` every file it declares must be there: a missing
    folder or file, or an empty or garbled one, is a :class:`ResultsFileError` naming the file, the stage
    that writes it and the command to run. Then their provenance: metrics.json and run.json must record the
    folder's stage and the settings params.yaml gives it now (:func:`check_provenance`), and each CSV must be
    one run.json lists, else a :class:`ProvenanceError`. The provenance entries are not in the result."""
    folder = resolve(results_dir)
    if not (folder / "metrics.json").is_file():
        raise ResultsFileError(folder / "metrics.json", "missing (no results here: the compute stage has not "
                               "run with this profile; or run its notebook with the same profile)")
    metrics = read_json(folder / "metrics.json")
    spec = stages.get(folder.name)
    for name in (spec.results if spec is not None and not spec.is_plot else ()):
        if not (folder / name).is_file():
            raise ResultsFileError(folder / name, f"missing (stage {spec.name} writes it beside metrics.json)")
    run_info = read_json(folder / "run.json")
    frames = {p.stem: read_csv(p) for p in sorted(folder.glob("*.csv"))}
    expected = provenance(folder)
    check_provenance(folder / "metrics.json", metrics, expected)
    _check_tables(folder, check_provenance(folder / "run.json", run_info, expected))
    return StageResult(pd.DataFrame(), metrics, run_info.get("data_label", ""), run_info.get("scale", ""),
                       run_info, frames)


def read_results(stage: str) -> tuple[dict, dict] | None:
    """(metrics.json, run.json) of the stage's ``dvc repro`` run (results/<stage>/), or None when the
    stage has not run here (a fresh clone: ``dvc repro <stage>`` or ``dvc pull`` brings them). A file
    that is there but empty or garbled is a :class:`ResultsFileError`; one that is not the stage's with the
    settings params.yaml gives it now a :class:`ProvenanceError` (:func:`check_provenance`)."""
    folder = resolve(f"results/{stage}")
    if not (folder / "metrics.json").is_file():
        return None
    metrics, run = read_json(folder / "metrics.json"), read_json(folder / "run.json")
    expected = provenance(folder)
    check_provenance(folder / "metrics.json", metrics, expected)
    check_provenance(folder / "run.json", run, expected)
    return metrics, run


def print_measured(cfg, describe, metrics: Mapping | None = None, scale: str = "") -> None:
    """What the notebook's text reports at params.yaml scale (never typed into the notebook, so it
    cannot go stale): ``describe(metrics)`` of this run (at ``scale``) when it is the default profile's
    (what ``dvc repro`` runs, writing results/<stage>/), else of the results ``dvc repro`` wrote there; results
    there that are not the stage's with the settings params.yaml gives it now are not shown: a line says why."""
    stage = cfg.stage
    if metrics is not None and cfg.results_dir == f"results/{stage}":
        print(f"this run is at params.yaml scale (profile default): {scale}".rstrip(": "))
        print(describe(metrics))
        return
    try:
        found = read_results(stage)
    except ProvenanceError as exc:  # the text is not worth a failed run: it says why it shows no numbers
        print(f"not shown: {exc}")
        return
    if found is None:
        print(f"{stage} has not run at params.yaml scale here: `dvc repro {stage}` (or `dvc pull`) writes "
              f"results/{stage}/, which this cell reads")
        return
    saved, run = found
    print(f"measured at params.yaml scale (results/{stage}/, written by `dvc repro {stage}`): "
          f"{run.get('scale', '')}".rstrip(": "))
    print(describe(saved))
