"""Flower equivalence (issue 19): PERM's Fig. 1 setting run in-process (the batched engine) and on a real
federated engine, Flower's simulation (Ray) and deployment (SuperLink + SuperNodes) engines, with the
same seed and client schedule; plus the federated protocol in one process (``pflkit.flower.loopback``,
no Flower), which runs wherever the stage runs.

It reuses PERM's Fig. 1 config and the one method registry (``pflkit.methods.METHODS``: the stage is
that figure's setting, on another engine), so every method is built by the same factory in every engine; the
methods it accepts are those whose class declares ``federated`` (``curves.FEDERATED_METHODS``).
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Literal

import pandas as pd
import torch
from pydantic import Field, field_validator, model_validator

from ..config import load_params, raise_problems, resolve_threads, stage_values, unique
from ..engine import FunctionalModel
from ..eval import HISTORY_COLUMNS
from ..flower import ENGINE_NAMES, INSTALL_HINT, flower_installed
from ..flower.loopback import run_loopback
from ..flower.spec import RunSpec
from ..models import logistic
from ..progress import Timer, note
from ..report import StageResult, environment
from ..runner import run
from .curves import FEDERATED_METHODS, METHODS, save_models as save_runs
from .perm import PermFig1Config

ENGINES = ("simulation", "deployment")
IN_PROCESS, LOOPBACK = "in-process", "loopback"
TOLERANCE = 1e-4  # the bar for the final personalized accuracy


class FlowerEquivalenceConfig(PermFig1Config):
    """PERM Fig. 1's settings (``PermFig1Config``) plus the engines: ``engines`` (Flower's, run when Flower
    is installed), ``ray_cpus`` / ``object_store_mb`` (the simulation's Ray), ``timeout`` (seconds a
    pass waits for its replies before the run stops with an error), ``deployment_rounds`` (the deployment
    engine runs the first that many rounds: stock Flower starts a ClientApp process per message, seconds
    each, and exactness is shown by every evaluated round up to there; the simulation runs ``rounds``)."""
    engines: list[Literal[ENGINES]]
    ray_cpus: int = Field(ge=1)
    object_store_mb: int = Field(ge=80)
    timeout: float = Field(gt=0)
    deployment_rounds: int = Field(ge=1)

    @model_validator(mode="after")
    def _deployment_rounds_evaluated(self):
        r, every = self.deployment_rounds, self.eval_every
        if r > self.rounds or (r % every and r != self.rounds):
            raise_problems([("deployment_rounds", f"{r} must be a round the in-process run evaluates (a multiple of "
                                                  f"eval_every = {every}, or rounds = {self.rounds}) within "
                                                  f"1..{self.rounds}, so that the deployment's last evaluation has "
                                                  f"one to compare with")])
        return self

    @field_validator("methods")
    @classmethod
    def _federated_methods(cls, v):
        bad = [m for m in v if m not in FEDERATED_METHODS]
        if bad:
            why = "; ".join(f"{m}: {METHODS[m].algorithm.federated}" for m in bad if m in METHODS)
            raise ValueError(f"must be methods a federated engine runs, from {sorted(FEDERATED_METHODS)}; got {bad}"
                             + (f" ({why})" if why else ""))
        return v

    @field_validator("engines")
    @classmethod
    def _engines(cls, v):
        return unique(v)


def specs_for(cfg: FlowerEquivalenceConfig, seed: int, model: FunctionalModel) -> dict[str, tuple]:
    """{method name: (algorithm, RunSpec)} for one seed: the algorithm from the method registry, its spec."""
    data = {"name": "perm_synthetic", "kwargs": {"num_clients": cfg.num_clients, "samples_per_client":
                                                 cfg.samples_per_client, "dim": cfg.dim,
                                                 "test_fraction": cfg.test_fraction, "seed": seed}}
    out = {}
    for key in cfg.methods:
        name = METHODS[key].name
        alg = METHODS[key].make(model, cfg)
        out[name] = (alg, RunSpec.for_algorithm(alg, model={"name": "logistic"}, data=data, seed=seed,
                                                rounds=cfg.rounds, eval_every=cfg.eval_every,
                                                batch_order=cfg.batch_order, timeout=cfg.timeout, label=name))
    return out


def _engine_rows(engine: str, runs: list[dict]) -> pd.DataFrame:
    frames = [pd.DataFrame(r["history"])[HISTORY_COLUMNS] for r in runs]
    return pd.concat(frames, ignore_index=True).assign(engine=engine)


def _timing(engine: str, out: dict) -> dict:
    """Seconds per round (train passes), per evaluation, and the start-up of one engine's run."""
    per_method = {}
    for r in out["runs"]:
        rounds, evals = list(r["round_seconds"].values()), list(r["eval_seconds"].values())
        per_method[r["spec"]["label"]] = {"seconds_per_round": sum(rounds) / len(rounds),
                                          "seconds_per_evaluation": sum(evals) / max(1, len(evals))}
    return {"engine": engine, "wall_seconds": out.get("wall_seconds"),
            "registration_seconds": out.get("registration_seconds"), "startup_seconds": out.get("startup_seconds"),
            "methods": per_method}


def equivalence(cfg: FlowerEquivalenceConfig, engines: list[str] | None = None, show_progress: bool = True,
                workdir=None, keep_workdir: bool = False, insecure: bool = False) -> StageResult:
    """Every method x seed in-process, as the federated protocol in one process, and on each of ``engines``
    (default: cfg.engines; Flower's run only when Flower is installed). The history holds every engine's
    evaluations (column ``engine``); the table the final personalized accuracy and loss per method and
    engine, with the largest difference from in-process over every evaluated round."""
    engines = list(cfg.engines if engines is None else engines)
    installed = flower_installed()
    ran = [IN_PROCESS, LOOPBACK] + (engines if installed else [])
    model = FunctionalModel(lambda: logistic((cfg.dim,), 2), "cpu")  # Flower's clients run on the CPU
    frames, timings, states = [], [], {}
    timer = Timer()
    for seed in cfg.seeds:
        methods = specs_for(cfg, seed, model)
        data = cfg.synthetic(seed).with_batch_order(cfg.batch_order)
        for name, (alg, spec) in methods.items():
            t0 = time.perf_counter()
            frames.append(run(alg, data, cfg.rounds, seed, cfg.eval_every, method=name, keep=states)
                          .assign(engine=IN_PROCESS))
            timings.append({"engine": IN_PROCESS, "seed": seed, "method": name,
                            "seconds_per_round_with_evaluation": (time.perf_counter() - t0) / cfg.rounds})
            frames.append(run_loopback(spec)[0].assign(engine=LOOPBACK))
            note(f"{cfg.stage}: {name}, seed {seed}: in-process and one-process protocol done ({timer})")
        specs = [spec for _, spec in methods.values()]
        for engine in engines if installed else []:
            note(f"{cfg.stage}: seed {seed}: {ENGINE_NAMES[engine]} starting ({timer})")
            if engine == "simulation":
                from ..flower.simulation import simulate
                out = simulate(specs, num_cpus=cfg.ray_cpus, object_store_mb=cfg.object_store_mb, quiet=True)
            else:
                from ..flower.deployment import deploy
                def on_round(done, total, seed=seed):
                    note(f"{cfg.stage}: seed {seed}: deployment round {done}/{total} (all methods) ({timer})")
                short = [dataclasses.replace(s, rounds=cfg.deployment_rounds) for s in specs]
                out = deploy(short, workdir=workdir, keep=keep_workdir, insecure=insecure, on_round=on_round)
            note(f"{cfg.stage}: seed {seed}: {ENGINE_NAMES[engine]} done ({timer})")
            frames.append(_engine_rows(engine, out["runs"]))
            timings.append({"seed": seed, **_timing(engine, out)})
    order = {e: i for i, e in enumerate((IN_PROCESS, LOOPBACK, *ENGINES))}
    history = pd.concat(frames, ignore_index=True)
    history = history.sort_values("engine", key=lambda s: s.map(order), kind="stable").reset_index(drop=True)
    history = history[["engine", *HISTORY_COLUMNS]]
    table = final_table(history, cfg.rounds)
    metrics = summary(table, history, ran)
    scale = (f"N={cfg.num_clients}, {cfg.samples_per_client} samples/client, d={cfg.dim}, {cfg.rounds} rounds, "
             f"{len(cfg.seeds)} seed{'s' * (len(cfg.seeds) > 1)}")
    skipped = [] if installed else engines
    run_info = {"stage": cfg.stage, "scale": scale, "engines_run": ran, "engines_skipped": skipped,
                "flower_installed": installed, "timings": timings, "environment": environment(),
                "config": cfg.model_dump()}
    label = data.label
    return StageResult(table, metrics, label, scale, run_info,
                       frames={"history": history, "differences": differences(history)},
                       extra={"engines_run": ran, "engines_skipped": skipped, "timings": timings, "states": states})


def save_models(cfg: FlowerEquivalenceConfig, result: StageResult, folder=None) -> list:
    """The in-process runs' final states (method x seed), as PERM's curve stages save theirs; each Flower engine
    reproduces them (the table's differences), so they stand for every engine."""
    history = result.history
    inproc = history[history["engine"] == IN_PROCESS].drop(columns="engine")
    return save_runs(cfg, StageResult(result.table, {}, result.data_label, result.scale,
                                      frames={"history": inproc}, extra={"states": result.states}), folder)


def differences(history: pd.DataFrame) -> pd.DataFrame:
    """Every engine's evaluations minus in-process ones at the same (method, seed, round, metric)."""
    key = ["method", "seed", "round", "metric"]
    base = history[history["engine"] == IN_PROCESS].set_index(key)["value"]
    other = history[history["engine"] != IN_PROCESS].set_index(key)
    return other.assign(difference=other["value"] - base.reindex(other.index).values).reset_index()


def final_table(history: pd.DataFrame, rounds: int) -> pd.DataFrame:
    """Rows (method, engine): final accuracy and loss (mean over seeds) and the largest |difference| from
    in-process over every evaluated round and seed."""
    diff = differences(history)
    rows = []
    for (method, engine), part in history.groupby(["method", "engine"], sort=False):
        # an engine's last evaluated round: ``rounds``, or the deployment's ``deployment_rounds``
        last = part[part["round"] == min(rounds, part["round"].max())].groupby("metric")["value"].mean()
        d = diff[(diff["method"] == method) & (diff["engine"] == engine)]
        row = {"method": method, "engine": engine, "accuracy": last["accuracy"], "loss": last["loss"]}
        if engine != IN_PROCESS:
            for metric in ("accuracy", "loss"):
                # skipna=False: a NaN on either side is a difference no tolerance accepts (pandas skips it)
                row[f"max_abs_diff_{metric}"] = float(d[d["metric"] == metric]["difference"].abs().max(skipna=False))
        rows.append(row)
    return pd.DataFrame(rows).set_index(["method", "engine"])


def summary(table: pd.DataFrame, history: pd.DataFrame, ran: list[str]) -> dict:
    """metrics.json: per method the in-process and loopback results; Flower's engines under ``flower``
    (only when they ran: a run without Flower writes a subset of the keys of a run with it)."""
    out: dict = {"in_process": {}, "loopback": {}, "tolerance": TOLERANCE}
    for (method, engine), row in table.iterrows():
        values = {k: float(v) for k, v in row.items() if pd.notna(v)}
        if engine != IN_PROCESS:  # a NaN difference is kept (as null), and fails
            values.update({k: None for k, v in row.items() if k.startswith("max_abs_diff") and pd.isna(v)})
        if engine in ENGINES:
            diff = values["max_abs_diff_accuracy"]
            values["within_tolerance"] = diff is not None and values["max_abs_diff_loss"] is not None \
                and bool(diff <= TOLERANCE)
            out.setdefault("flower", {}).setdefault(engine, {})[method] = values
        else:
            out["in_process" if engine == IN_PROCESS else "loopback"][method] = values
    return out


def _difference(value: float | None) -> str:
    return "NaN (a run's value is not a number)" if value is None or value != value else f"{value:.2e}"


def describe(metrics: dict, skipped: list[str] | None = None) -> str:
    """The verdicts in words: every engine against in-process, final personalized accuracy."""
    lines = []
    for method, row in metrics.get("loopback", {}).items():
        lines.append(f"{ENGINE_NAMES[LOOPBACK]}, {method}: final accuracy {row.get('accuracy', math.nan):.4f}, "
                     f"largest |difference| from in-process over all rounds "
                     f"{_difference(row['max_abs_diff_accuracy'])}")
    for engine, methods in metrics.get("flower", {}).items():
        for method, row in methods.items():
            verdict = "reproduces" if row["within_tolerance"] else "does NOT reproduce"
            lines.append(f"{ENGINE_NAMES[engine]} {verdict} in-process {method} within "
                         f"{metrics['tolerance']:g}: final accuracy {row.get('accuracy', math.nan):.4f}, "
                         f"largest |difference| {_difference(row['max_abs_diff_accuracy'])} "
                         f"(loss {_difference(row['max_abs_diff_loss'])})")
    if skipped:
        lines.append(f"Flower is not installed ({INSTALL_HINT}): skipped the {' and '.join(skipped)} engine(s); "
                     "the loopback rows run the same server and client code in one process")
    return "\n".join(lines)


def timing_table(timings: list[dict]) -> pd.DataFrame:
    """Seconds per round (training passes) and per evaluation by engine and method (mean over seeds)."""
    rows = []
    for t in timings:
        if t["engine"] == IN_PROCESS:
            rows.append({"engine": IN_PROCESS, "method": t["method"],
                         "seconds_per_round": t["seconds_per_round_with_evaluation"], "note": "with evaluation"})
            continue
        for method, m in t["methods"].items():
            rows.append({"engine": t["engine"], "method": method, "seconds_per_round": m["seconds_per_round"],
                         "note": f"+ {m['seconds_per_evaluation']:.2f} s per evaluation"})
    if not rows:
        return pd.DataFrame()
    frame = pd.DataFrame(rows)
    return frame.groupby(["engine", "method"], sort=False).agg({"seconds_per_round": "mean", "note": "first"})


def command(engine: str, profile: str = "default", params: str = "params.yaml", *, clients: int | None = None,
            rounds: int | None = None, methods: list[str] | None = None, keep: bool = False,
            insecure: bool = False) -> int:
    """``python -m pflkit.flower {simulate,deploy}``: the flower_equivalence section (``profile``, with the
    overrides) in-process, as the one-process protocol and on one Flower engine (deploy: ``keep`` keeps its
    working folder, which it names; ``insecure`` turns TLS and node authentication off); prints the final table,
    the verdicts and the seconds per round. Exit status 0 when the engine reproduces in-process within
    the tolerance, 1 when it does not, 2 when Flower is missing."""
    values = stage_values(load_params(params), "flower_equivalence", profile)
    overrides = {"num_clients": clients, "rounds": rounds, "methods": methods}
    values.update({k: v for k, v in overrides.items() if v is not None})
    if rounds is not None:  # fewer rounds than the deployment's: the deployment runs them all
        values["deployment_rounds"] = min(values["deployment_rounds"], rounds)
    values["engines"] = [{"simulate": "simulation", "deploy": "deployment"}[engine]]
    cfg = FlowerEquivalenceConfig.build(values)
    if not flower_installed():
        print(f"Flower is not installed: {INSTALL_HINT}")
        return 2
    torch.set_num_threads(resolve_threads(cfg.threads))
    result = equivalence(cfg, keep_workdir=keep, insecure=insecure)
    print(result.data_label, "|", result.scale)
    print(result.table.round(6).to_string())
    print(describe(result.metrics))
    print(timing_table(result.timings).round(3).to_string())
    flower = [row for methods in result.metrics.get("flower", {}).values() for row in methods.values()]
    return 0 if flower and all(row["within_tolerance"] for row in flower) else 1
