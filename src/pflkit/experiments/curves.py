"""The curve machinery every curve stage shares (PERM's Figs. 1, 2 and 4, Fig. 3's timing, the hetero and the
Flower stages): the families of the one method registry (:mod:`pflkit.methods`), PERM's config section and
the fields of the records' sections (``MethodSettings``), ``RunConfig``, ``run_curves`` (every method x seed, with
checkpoints), the saved runs (``save_models`` and their re-evaluation), the lr sweep and the "PERM is best"
claim with its seed-to-seed spread. Paper modules (``experiments.perm`` and the others) hold their configs and
figure functions only.
"""
from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Annotated, Callable, Literal

import pandas as pd
import torch
from pydantic import AfterValidator, Field, create_model, field_validator, model_validator

from .. import model_store, progress
from ..algorithms.perm import ALPHA_INITS, ALPHA_SOLVERS
from ..algorithms.round import WEIGHTINGS
from ..checks import is_int
from ..config import Section, Seeds, StageConfig, names_from, one_of, raise_problems
from ..data.federated import BATCH_ORDERS, FederatedDataset, data_digest
from ..device import device_name
from ..engine import FunctionalModel, resolve_device
from ..eval import HISTORY_COLUMNS, evaluate
from ..methods import (METHODS, PERM_HETERO_DISCREPANCY, PERM_VARIANTS, Method,  # noqa: F401  (re-exported)
                       perm_hetero_section)
from ..paths import resolve
from ..report import StageResult, environment, table_records
from ..runner import DivergenceError, final_table, run_methods

AlphaSolver = one_of(ALPHA_SOLVERS)
AlphaInit = one_of(tuple(a for a in ALPHA_INITS if a != "correlation"))  # correlation: perm_torchfed's own


class PermSection(Section):
    """PERM's own settings (see pflkit.algorithms.perm.PERM), every one set by params.yaml (a profile's overlay
    replaces the whole mapping, so it gives every key too)."""
    lam: float = Field(ge=0)
    alpha_solver: AlphaSolver
    alpha_steps: int = Field(ge=1)
    alpha_samples: int | None = Field(ge=1)
    global_lr: float = Field(gt=0)
    global_steps: int = Field(ge=0)
    warmup_rounds: int = Field(ge=0)
    alpha_init: AlphaInit
    update_every: int | str | None

    @field_validator("update_every", mode="before")
    @classmethod
    def _every(cls, v):
        if v is None or v == "epoch" or (is_int(v) and v >= 1):
            return v
        raise ValueError(f"must be an integer >= 1, 'epoch' or null, got {v!r}")


#: the baselines beyond the PERM paper (``Method.paper`` False)
BEYOND_PAPER = tuple(k for k, m in METHODS.items() if not m.paper)


def family(name: str) -> tuple[str, ...]:
    """The method keys of one family (``Method.family``): what a stage of that family may name."""
    return tuple(k for k, m in METHODS.items() if m.family == name)


CURVE_METHODS, HETERO_METHODS = family("curves"), family("hetero")
#: the method keys a federated engine runs: those whose class declares ``federated = True`` (the others say why not)
FEDERATED_METHODS = tuple(k for k in CURVE_METHODS + HETERO_METHODS if METHODS[k].algorithm.federated is True)
MethodNames = names_from(CURVE_METHODS)


def step_sizes(keys: tuple[str, ...]):
    """A stage's ``lr`` field: a mapping from method keys of ``keys`` (a family's) to step sizes > 0; the error
    names the keys and the bad entries."""
    def check(lr: dict) -> dict:
        bad = {k: x for k, x in lr.items() if k not in keys or not x > 0}
        if bad:
            raise ValueError(f"lr maps method names {sorted(keys)} to values > 0; bad entries: {bad}")
        return lr
    return Annotated[dict[str, float], AfterValidator(check)]


CurveStepSizes, HeteroStepSizes = step_sizes(CURVE_METHODS), step_sizes(HETERO_METHODS)


def missing_settings(cfg) -> list[tuple[str, str]]:
    """The problems when a method of ``cfg.methods`` lacks its own settings (``Method.needs``: null or not given;
    none: every listed method has them)."""
    return [(key, f"not given, but methods lists {k}: give its settings")
            for k in cfg.methods for key in METHODS[k].needs if getattr(cfg, key, None) is None]


def missing_lrs(lr: dict, methods: list[str]) -> list[tuple[str, str]]:
    """The problem when a method of ``methods`` has no step size in ``lr`` (none: every method has one)."""
    missing = [m for m in methods if m not in lr]
    return [("lr", f"no value for methods {missing} (every method in methods needs its lr; "
                   f"given: {sorted(lr)})")] if missing else []


def _method_sections() -> dict:
    """One optional field per method section of the records (``Method.section``, at ``needs[0]``): None where
    the stage does not run the method."""
    fields = {}
    for m in METHODS.values():
        if m.section is not None:
            fields[m.needs[0]] = (m.section | None, None)
    return fields


#: the methods' own settings sections (``Method.section``), each given where the stage's ``methods`` lists a method
#: that needs it: a base of every config that runs curve methods by key
MethodSettings = create_model("MethodSettings", __base__=StageConfig, __module__=__name__, **_method_sections())


class RunConfig(MethodSettings):
    """Fields shared by the PERM curve figures."""
    rounds: int = Field(ge=1)
    local_steps: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    lr: CurveStepSizes
    #: localized FedAvg's fine-tuning (given where methods lists localized_fedavg)
    finetune_steps: int | None = Field(None, ge=1)
    finetune_lr: float | None = Field(None, gt=0)
    methods: MethodNames
    seeds: Seeds
    eval_every: int = Field(ge=1)
    #: FedAvg, localized FedAvg, Per-FedAvg, pFedMe and Ditto: clients sampled per round (null: all) and how the
    #: server weights them; PERM (every client hosts one model per shuffle step) and Local train all
    clients_per_round: int | None = Field(ge=1)
    weighting: Literal[WEIGHTINGS]
    #: minibatch draws of every method: with replacement, or shuffled passes over each client's rows
    batch_order: Literal[BATCH_ORDERS]
    perm: PermSection
    #: PERM(visit='alpha') with its own lambda etc., given where methods lists perm_alpha (the other methods'
    #: sections: ``MethodSettings``)
    perm_alpha: PermSection | None = None

    @model_validator(mode="after")
    def _lr_for_each_method(self):
        raise_problems(missing_lrs(self.lr, self.methods) + missing_settings(self))
        clients = getattr(self, "num_clients", None)
        if self.clients_per_round is not None and clients is not None and self.clients_per_round > clients:
            raise_problems([("clients_per_round", f"{self.clients_per_round} > num_clients = {clients} "
                                                  "(null samples every client)")])
        return self

    def alpha_sampling(self) -> tuple[int, str]:
        """(M, key): the most rows per client a PERM method of ``methods`` samples for its alpha / global-step
        gradients (``perm.alpha_samples``), and that key; (0, "") when every one takes the exact pass (counted
        in the estimates as the full-batch pass). The sampled pass gathers M rows of every client at once."""
        used = [(getattr(self, k).alpha_samples or 0, f"{k}.alpha_samples") for k in ("perm", "perm_alpha")
                if k in self.methods]
        return max(used, default=(0, ""))


def perm_claim(table: pd.DataFrame, metric: str = "accuracy_mean", perm: str = "PERM",
               history: pd.DataFrame | None = None, against: list[str] | None = None) -> dict | None:
    """The paper's claim for its curve figures: ``perm``'s final personalized accuracy (mean over seeds)
    is at least every other method's the paper runs (the majority-class baseline, the other PERM variants and
    the baselines beyond the paper aside; ``against``: these display names instead). None when ``perm`` or
    every other method is missing from ``table``. With the run's ``history``, also how far the margin moves
    between seeds (``seed_margins``): ``seeds``, and with two or more, ``margin_sd``, the claims ledger's
    "inconclusive" test."""
    beyond = {METHODS[k].name for k in BEYOND_PAPER}
    keep = [m in against if against is not None
            else not (str(m).startswith("PERM") or m == "Majority class" or m in beyond) for m in table.index]
    others = table[keep][metric]
    if perm not in table.index or others.empty:
        return None
    best = others.idxmax()
    value = float(table.loc[perm, metric])
    claim = {"perm": round(value, 4), "best_other": best, "best_other_value": round(float(others[best]), 4),
             "margin": round(value - float(others[best]), 4), "holds": bool(value >= float(others[best]))}
    if history is not None:
        margins = seed_margins(history, perm, best, metric.removesuffix("_mean"))
        claim["seeds"] = len(margins)
        if len(margins) > 1:
            claim["margin_sd"] = round(float(margins.std(ddof=1)), 4)
    return claim


def seed_margins(history: pd.DataFrame, perm: str, other: str, metric: str = "accuracy") -> pd.Series:
    """Per seed, ``perm``'s final ``metric`` minus ``other``'s (paired: the same seed's data and split), at each
    method's last evaluated round, for the seeds both ran."""
    last = history[(history["metric"] == metric)
                   & (history["round"] == history.groupby("method")["round"].transform("max"))]
    by_seed = last.pivot_table(index="seed", columns="method", values="value", aggfunc="mean")
    return (by_seed[perm] - by_seed[other]).dropna()


def run_curves(cfg: RunConfig, model_factory: Callable, data_for_seed: Callable[[int], FederatedDataset],
               scale: str, show_progress: bool = True, record: dict | None = None,
               checkpoint: bool = True) -> StageResult:
    """Every configured method x seed for cfg.rounds rounds; final table, metrics and run info.
    With ``checkpoint``, runs checkpoint every 5 rounds to build/checkpoints/<stage>/ (another profile's run:
    build/<profile>/checkpoints/<stage>/, so profiles never overwrite each other's) and resume from there
    (the stage's own runs only: lr sweeps pass False so they never touch the stage's files)."""
    device = resolve_device(cfg.device)
    model = FunctionalModel(model_factory, device)
    methods = {METHODS[k].name: (lambda k=k: METHODS[k].make(model, cfg)) for k in cfg.methods}
    start = time.perf_counter()
    states: dict = {}
    history = run_methods(methods, lambda s: data_for_seed(s).to(device).with_batch_order(cfg.batch_order),
                          cfg.seeds, cfg.rounds, cfg.eval_every,
                          show_progress, keep=states,
                          checkpoint_dir=checkpoint_dir(cfg) if checkpoint else None,
                          checkpoint_every=5, checkpoint_tag=cfg.model_dump_json())
    elapsed = time.perf_counter() - start
    table = final_table(history, ("accuracy", "accuracy_weighted", "loss"))
    data = data_for_seed(cfg.seeds[0])
    record = record or {"dataset": data.name, "paper_dataset": data.paper_dataset or data.name,
                        "is_substitute": data.is_substitute}
    metrics = {**record, "setting": scale, "final": table_records(table), "runtime_s": round(elapsed, 2)}
    claim = perm_claim(table, history=history)
    if claim is not None:
        metrics["claim_perm_best"] = claim
    for key in BEYOND_PAPER:  # PERM against each baseline beyond the paper, apart from the paper's claim
        claim = perm_claim(table, history=history, against=[METHODS[key].name])
        if claim is not None:
            metrics[f"claim_perm_vs_{key}"] = claim
    for key in PERM_VARIANTS[1:]:  # the variants, each reported apart (never as "PERM")
        claim = perm_claim(table, perm=METHODS[key].name, history=history)
        if claim is not None:
            metrics[f"claim_{key}_best"] = claim
    run_info = {"stage": cfg.stage, "scale": scale, "data": data.summary(), "device": str(device),
                "environment": environment(), "config": cfg.model_dump()}
    return StageResult(table, metrics, data.label, scale, run_info, frames={"history": history},
                       extra={"states": states})


def save_models(cfg: StageConfig, result: StageResult, folder=None) -> list:
    """Every run's final state (method x seed) under ``folder`` (default: the stage's models folder), each
    with its config, the digest of its federation and its final metrics (``pflkit.model_store``)."""
    folder = model_store.models_dir(cfg, folder)
    history = result.history
    written = []
    for (method, seed), state in sorted(result.states.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        last = history[(history["method"] == method) & (history["seed"] == seed)]
        last = last[last["round"] == last["round"].max()]
        written.append(model_store.save_state(folder, cfg.stage, method, seed, state, config=cfg.model_dump(),
                                              data_digest=data_digest(state.data),
                                              metrics=dict(zip(last["metric"], last["value"]))))
    model_store.write_index(folder, cfg.stage, cfg.model_dump())
    return written


def saved_final(cfg: RunConfig, factory: Callable, data_for_seed: Callable[[int], FederatedDataset],
                folder=None) -> pd.DataFrame:
    """The final table (``final_table``: mean and sd over seeds per method) of the runs saved by
    :func:`save_models`, re-evaluated from the saved states alone (``factory`` and ``data_for_seed``: what the
    stage trained on): the stage's recorded numbers, exactly."""
    folder = model_store.models_dir(cfg, folder)
    device = resolve_device(cfg.device)
    model = FunctionalModel(factory, device)
    keys = {METHODS[k].name: k for k in cfg.methods}
    saved = model_store.saved_runs(folder)
    rows = []
    for seed in cfg.seeds:
        data = data_for_seed(seed).to(device).with_batch_order(cfg.batch_order)
        for method in keys:
            algorithm = METHODS[keys[method]].make(model, cfg)
            state = model_store.restore(algorithm, data, saved[(method, seed)])
            summary = evaluate(model, algorithm.personalized(state), data).summary()
            rows += [(state.round, method, seed, k, float(v)) for k, v in summary.items()]
    return final_table(pd.DataFrame(rows, columns=HISTORY_COLUMNS), ("accuracy", "accuracy_weighted", "loss"))


def checkpoint_dir(cfg: StageConfig):
    """build/checkpoints/<stage> for the default profile (results/<stage>); beside a profile's results
    (build/<profile>/<stage>) build/<profile>/checkpoints/<stage>."""
    parts = cfg.results_dir.split("/")
    base = "/".join(parts[:2]) + "/checkpoints" if parts[0] == "build" and len(parts) > 2 else "build/checkpoints"
    return resolve(base) / cfg.stage


def lr_sweep(figure: Callable[..., StageResult], cfg: RunConfig, grid: list[float], methods: list[str] | None = None,
             seeds: list[int] | None = None, show_progress: bool = False, sections: dict | None = None,
             rounds: int | None = None, jobs: int = 1) -> pd.DataFrame:
    """Every method x learning rate on the stage's own setting; one row each with the final personalized
    accuracy/loss (mean over ``seeds``), the cell's run time and the device it ran on. Localized FedAvg's
    fine-tuning lr follows its lr. ``figure(cfg, show_progress=, checkpoint=)``: the stage's figure function (run
    without checkpoints, so a sweep never touches the stage's files). The best lr per method has the highest final
    accuracy; ties go to the lower loss.
    ``sections`` optionally overrides method sections for the whole sweep (e.g. {"perfedavg": {"alpha": 0.5}});
    ``rounds`` sweeps over the stage's first ``rounds`` rounds instead of its whole budget (a tuning window;
    validated like the stage's own value); ``jobs`` > 1 runs the cells in that many worker processes (one
    accelerator shared, or the CPU's cores split between them); the table is the same as with one job.
    ``show_progress``: one bar over the cells."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    dump = cfg.model_dump()
    if sections:
        dump = {**dump, **{k: {**dump[k], **v} for k, v in sections.items()}}
    if rounds is not None:
        dump["rounds"] = rounds
    if sections or rounds is not None:
        cfg = type(cfg).build(dump)  # validated: a window the stage's own rules refuse is refused here
    cells = [(key, lr) for key in methods or cfg.methods for lr in grid]
    args = [(figure, cfg, key, lr, seeds or cfg.seeds) for key, lr in cells]
    bar = progress.bar(len(cells), f"tune {cfg.stage}", disable=not show_progress, unit="cell")

    def done(row: dict) -> dict:  # a line per finished cell: a long sweep cut short still says what it found
        if show_progress:
            bar.write(f"{row['method']} lr={row['lr']:g}: accuracy {row['accuracy']:.4f} loss {row['loss']:.4f}"
                      f"{' (diverged)' if row['diverged'] else ''} in {row['runtime_s']:.1f} s")
        bar.update()
        return row
    if jobs == 1:
        rows = [done(sweep_cell(*a)) for a in args]
    else:
        threads = max(1, (os.cpu_count() or 1) // jobs)
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=torch.set_num_threads, initargs=(threads,)) as pool:
            futures = [pool.submit(sweep_cell, *a) for a in args]
            for future in as_completed(futures):
                done(future.result())
            rows = [f.result() for f in futures]
    bar.close()
    table = pd.DataFrame(rows)
    ranked = table.dropna(subset=["accuracy"]).sort_values(["method", "accuracy", "loss"],
                                                            ascending=[True, False, True])
    table["best"] = table.index.isin(ranked.groupby("method").head(1).index)
    return table


def sweep_cell(figure: Callable[..., StageResult], cfg: RunConfig, key: str, lr: float, seeds: list[int]) -> dict:
    """One cell of :func:`lr_sweep`: method ``key`` alone at ``lr`` (a divergence is recorded, not raised)."""
    update = {"methods": [key], "lr": {**cfg.lr, key: lr}, "seeds": seeds}
    if key == "localized_fedavg":
        update["finetune_lr"] = lr
    start = time.perf_counter()
    row = {"method": key, "lr": lr, "rounds": cfg.rounds, "seeds": ",".join(map(str, seeds))}
    try:
        final = figure(cfg.model_copy(update=update), show_progress=False, checkpoint=False).table.loc[
            METHODS[key].name]
        row.update(accuracy=final["accuracy_mean"], loss=final["loss_mean"], diverged="")
    except DivergenceError as exc:  # record the diverged setting and go on
        row.update(accuracy=float("nan"), loss=float("nan"), diverged=str(exc))
    resolved = resolve_device(cfg.device)
    where = f"cuda ({device_name(resolved)})" if resolved.type == "cuda" else str(resolved)
    return {**row, "runtime_s": round(time.perf_counter() - start, 2), "device": where}
