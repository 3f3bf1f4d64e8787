"""``python -m pflkit reproduce --profile <p> --canary``: every stage of a profile, cut short, on this machine.

A profile's full run (``paper``: hours to days) is the wrong place to learn that a learning rate diverges at
round 20 or that a grid does not fit in memory. The canary runs every stage of the profile through the same
machinery (``notebooks.run_stage``, one ``python -m pflkit stage`` process per stage) with the profile's
values cut by :func:`cut_values`:

* rounds: the first ``rounds`` of every round-based stage (default ``CURVE_ROUNDS``, and at least past a
  PERM warm-up and its first alpha update: warm-up + update_every + 1), the first ``GRID_ROUNDS`` of every
  Charles et al. grid task (a divergent grid cell is a result there, recorded, not an error);
* one seed (the first), every method, and every grid reduced to its extreme settings (smallest and largest
  learning rate, momentum, ...: ``GRID_KEYS``);
* what does not change a run's step sizes or its model: ``clients_per_round`` of the grid tasks (at most
  ``GRID_CLIENTS``), the evaluation sample (``eval_samples``), the Flower engines (the first one only); the
  number of clients of a PERM image federation only when asked or in the short form (``max_clients``, the
  short form's ``SHORT_MAX_CLIENTS`` = 10; cut to 10, perm_fig2's divergence at 50 clients did not show). Never
  the model, the learning rates, K or the batch size. Each stage's progress lines reach the terminal as they come.

It fails -- with stage, method, round and setting, from the run's own :class:`runner.DivergenceError` --
on divergence, on a stage's peak memory above its budget (:func:`memory_budget`), and on any error; it goes
on to the other stages (a stage whose source failed is skipped), reports every failure at the end and
exits 1. It prints, per stage, the seconds it took, seconds per round, peak memory and the whole-profile
estimate for this machine (:func:`profile_estimate`) at the torch threads its stages run on. Everything goes
under build/canary/<profile>/ (the cut params file, results, logs, canary.csv, and canary.md: the table with the
machine, the command and the threads), never results/.
"""
from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from . import stages as table
from .config import (DEFAULT_PROFILE, PROFILES_KEY, RUNNER_KEYS, ConfigError, load_params, profile_names,
                     resolve_threads, stage_values)
from .notebooks import RUNTIMES_LOG
from .paths import project_root
from .reproduce import chosen_stages, validate_stages

#: rounds of a curve stage (PERM's, perm_hetero, flower_equivalence): perm_fig2 (paper) diverged at round 20
CURVE_ROUNDS = 25
#: rounds of each Charles et al. grid task (their divergent cells are results, recorded in diverged.csv)
GRID_ROUNDS = 3
#: the short form (``--short``, CI): one round of everything, plot stages skipped
SHORT_ROUNDS = 1
#: at most this many clients in a PERM image federation (None: the profile's own). Not cut by default: perm_fig2
#: (paper) cut to 10 clients ran 25 rounds of Localized FedAvg at lr 0.3 without diverging, while with its 50
#: clients it diverges at round 10: the federation's size is not neutral for divergence
MAX_CLIENTS: int | None = None
#: the short form's cut (one round cannot show a divergence anyway): what keeps it to minutes
SHORT_MAX_CLIENTS = 10
#: at most this many clients per round of a grid task (the paper's M = 10 makes a ResNet-18 round slow on a CPU)
GRID_CLIENTS = 2
#: at most this many pooled examples per evaluation of a grid task (the default profile's value)
EVAL_SAMPLES = 300
#: lists that are grids of settings: cut to their smallest and largest value
GRID_KEYS = ("gammas", "etas", "alphas", "eta_grid", "zetas", "n_values", "L_values")
#: a stage's memory budget: the measured baseline of a stage process plus this many times its own
#: ``memory_estimate()`` (its ``footprint()``: the Charles et al. grids and the PERM image curves count data as
#: loaded, models, gradients, a batch's activations and the evaluation: 0.9x-1.4x of their measured peaks,
#: tests/unit/test_canary.py; the other stages' count data and models only, temporaries come on top)
MEMORY_FACTOR = 3.0
#: ... and at least this much room above the baseline: a dataset the estimate leaves out (Fashion-MNIST as float32:
#: ~190 MiB), frames and figures, temporaries (the peaks it was set from: docs/benchmarks.md, "Notes moved out of
#: the source (issue 53)")
MEMORY_FLOOR = 768 * 2**20
#: what a stage's kernel imports: the baseline process of :func:`measure_baseline`
BASELINE_IMPORTS = ("torch", "numpy", "pandas", "matplotlib.pyplot", "seaborn", "ipykernel", "papermill",
                    "pflkit.notebooks", "pflkit.runner", "pflkit.experiments.perm", "pflkit.experiments.charles_nn")
OUT = "build/canary"


def canary_profile(profile: str) -> str:
    """The profile name the cut values run under: outputs go to build/canary/<profile>/ (``output_dirs``)."""
    return f"canary/{profile}"


@dataclass
class Cut:
    """What :func:`cut_values` did to one stage: the values it ran and the sizes before and after."""

    values: dict
    rounds_full: int = 0          # sum over the stage's runs (tasks); 0: the stage has no rounds
    rounds_run: int = 0
    seeds_full: int = 1
    seeds_run: int = 1
    settings_full: int = 1        # product of the grids' lengths
    settings_run: int = 1
    clients_full: int = 1
    clients_run: int = 1
    changes: list[str] = field(default_factory=list)

    @property
    def scale(self) -> float:
        """How much more work the full stage is than this run (rounds x seeds x settings x clients)."""
        rounds = self.rounds_full / self.rounds_run if self.rounds_run else 1.0
        return rounds * (self.seeds_full / self.seeds_run) * (self.settings_full / self.settings_run) \
            * (self.clients_full / self.clients_run)


def _perm_sections(values: Mapping[str, Any]) -> list[str]:
    """The keys of a stage's PERM sections: nested sections with ``warmup_rounds`` (``config.perm_sections``'
    rule; a null one is skipped)."""
    return [k for k, s in values.items() if isinstance(s, Mapping) and "warmup_rounds" in s]


def _perm_horizon(values: Mapping[str, Any]) -> int:
    """Rounds past the warm-up and the first alpha update of every PERM section of a stage (0: none)."""
    out = 0
    for key in _perm_sections(values):
        section = values[key]
        warm = section.get("warmup_rounds", 0) or 0
        every = section.get("update_every", 0)
        every = values.get("num_clients", 0) if every == "epoch" else (every if isinstance(every, int) else 0)
        out = max(out, warm + every + 1)
    return out


def _least(stage: str, key: str) -> int:
    """The smallest value the stage's config accepts for the integer ``key`` (its ``ge`` bound; 1 if none)."""
    entry = table.get(stage)
    field = entry.config_class().model_fields.get(key) if entry is not None else None
    bounds = [getattr(m, "ge", None) for m in (field.metadata if field is not None else ())]
    return max([1, *[b for b in bounds if isinstance(b, int)]])


def _fit_to_rounds(v: dict, rounds: int, change) -> None:
    """The settings counted in rounds, cut with the rounds so that the cut passes the cross-key rules
    (``config.CROSS_KEY_RULES``): each PERM section's warm-up leaves a round, its alpha update falls within the
    rounds after the warm-up, the evaluation cadence within the rounds, Flower's deployment ends on an evaluated
    round. Each change is recorded like the others."""
    for key in _perm_sections(v):
        section = v[key]
        if not isinstance(section.get("warmup_rounds"), int):
            continue
        v[key] = section = dict(section)
        low = 1 if key == "perm_torchfed" else 0
        change(section, "warmup_rounds", max(low, min(section["warmup_rounds"], rounds - 1)), f"{key}.warmup_rounds")
        left = rounds - section["warmup_rounds"]
        every = section.get("update_every")
        every = v.get("num_clients") if every == "epoch" else every
        if isinstance(every, int) and every > left:
            change(section, "update_every", left, f"{key}.update_every")
    if isinstance(v.get("eval_every"), int) and v["eval_every"] > rounds:
        change(v, "eval_every", rounds)
    deploy = v.get("deployment_rounds")
    if isinstance(deploy, int) and (deploy > rounds or deploy % v.get("eval_every", 1)):
        change(v, "deployment_rounds", rounds)


def _extremes(values: list) -> list:
    return sorted({min(values), max(values)})


def cut_values(stage: str, values: Mapping[str, Any], rounds: int | None = None, grid_rounds: int | None = None,
               max_clients: int | None = MAX_CLIENTS) -> Cut:
    """The canary's cut of one stage's values (a profile's, from ``config.stage_values``; see the module
    docstring). ``rounds`` / ``grid_rounds``: the rounds of curve stages / of grid tasks (None: the
    defaults, a curve stage running at least past its PERM warm-up and first alpha update)."""
    v = {k: x for k, x in values.items() if k not in RUNNER_KEYS}
    cut = Cut(v)

    def change(section, key, new, label=None):
        """Set ``section[key]`` to ``new``, recording the change (as ``label``, default ``key``)."""
        if section[key] != new:
            cut.changes.append(f"{label or key} {section[key]} -> {new}")
        section[key] = new

    if isinstance(v.get("seeds"), list) and len(v["seeds"]) > 1:
        cut.seeds_full, cut.seeds_run = len(v["seeds"]), 1
        change(v, "seeds", v["seeds"][:1])
    for key in GRID_KEYS:
        grid = v.get(key)
        if isinstance(grid, list) and len(grid) > 2 and all(isinstance(x, (int, float)) for x in grid):
            change(v, key, _extremes(grid))
            cut.settings_full *= len(grid)
            cut.settings_run *= len(v[key])
    target = rounds if rounds is not None else max(CURVE_ROUNDS, _perm_horizon(v))
    if "alpha_file" in v:  # the stage saves PERM's alpha (perm_fig4, for perm_fig5): it needs a round past the warm-up
        target = max(target, max((v[k]["warmup_rounds"] or 0 for k in _perm_sections(v)), default=0) + 1)
    if "perm_torchfed" in (v.get("methods") or []):  # its warm-up is at least one round: one more to leave it
        target = max(target, 2)
    for key in ("rounds", "fedavg_rounds"):
        if isinstance(v.get(key), int):
            new = min(v[key], max(target, _least(stage, key)))
            cut.rounds_full += v[key]
            cut.rounds_run += new
            change(v, key, new)
    if isinstance(v.get("rounds"), int):
        _fit_to_rounds(v, v["rounds"], change)
    if max_clients is not None and isinstance(v.get("num_clients"), int) and "pool_size" in v \
            and "tasks" not in v and v["num_clients"] > max_clients:
        cut.clients_full, cut.clients_run = v["num_clients"], max_clients
        change(v, "num_clients", max_clients)
        if isinstance(v.get("clients_per_round"), int):
            v["clients_per_round"] = min(v["clients_per_round"], max_clients)
    if isinstance(v.get("engines"), list) and len(v["engines"]) > 1:
        change(v, "engines", v["engines"][:1])
    if isinstance(v.get("eval_samples"), int) and v["eval_samples"] > EVAL_SAMPLES:
        change(v, "eval_samples", EVAL_SAMPLES)
    tasks = v.get("tasks")
    if isinstance(tasks, Mapping):
        grid_target = grid_rounds if grid_rounds is not None else GRID_ROUNDS
        v["tasks"] = tasks = {name: dict(t) for name, t in tasks.items()}
        full_clients = run_clients = 0
        for name, t in tasks.items():
            if isinstance(t.get("rounds"), int):
                new = min(t["rounds"], grid_target)
                cut.rounds_full += t["rounds"]
                cut.rounds_run += new
                change(t, "rounds", new, f"tasks.{name}.rounds")
            if isinstance(t.get("clients_per_round"), int):
                new = min(t["clients_per_round"], GRID_CLIENTS)
                full_clients += t["clients_per_round"]
                run_clients += new
                change(t, "clients_per_round", new, f"tasks.{name}.clients_per_round")
            if isinstance(t.get("eval_samples"), int) and t["eval_samples"] > EVAL_SAMPLES:
                change(t, "eval_samples", EVAL_SAMPLES, f"tasks.{name}.eval_samples")
        if run_clients:
            cut.clients_full, cut.clients_run = full_clients, run_clients
        shortest = min((t["rounds"] for t in tasks.values() if isinstance(t.get("rounds"), int)), default=None)
        if shortest is not None and isinstance(v.get("tune_window"), int) and v["tune_window"] > shortest:
            change(v, "tune_window", shortest)
    return cut


def _remap(value, profile: str):
    """A path a profile's stage writes or reads (perm_fig4/5's alpha_file) moved under build/canary/<profile>/."""
    if isinstance(value, str):
        target = canary_profile(profile)
        if value.startswith(f"build/{profile}/"):
            return f"build/{target}/" + value.removeprefix(f"build/{profile}/")
        if profile == DEFAULT_PROFILE and value.startswith(("models/", "results/")):
            return table.profile_path(value, target)
    return value


def canary_params(params: Mapping[str, Any], profile: str, stages: list[str], **kw) -> tuple[dict, dict[str, Cut]]:
    """params.yaml plus a profile ``canary/<profile>`` whose entry for each compute stage is its cut values
    (every value given, so nothing of the other sections leaks in), and the cuts."""
    if profile not in profile_names(params):
        raise ConfigError(f"profile: unknown profile {profile!r}; params.yaml defines {profile_names(params)}")
    entry: dict[str, Any] = {}
    cuts: dict[str, Cut] = {}
    for name in stages:
        stage = table.get(name)
        if stage.is_plot:
            continue
        cut = cut_values(name, stage_values(params, name, profile), **kw)
        cut.values = {k: _remap(x, profile) for k, x in cut.values.items()}
        entry[name] = cut.values
        cuts[name] = cut
    overlay = (params.get(PROFILES_KEY) or {}).get(profile) or {} if profile != DEFAULT_PROFILE else {}
    if table.FIGURES_SECTION in overlay:
        entry[table.FIGURES_SECTION] = overlay[table.FIGURES_SECTION]
    out = dict(params)
    out[PROFILES_KEY] = {**(params.get(PROFILES_KEY) or {}), canary_profile(profile): entry}
    return out, cuts


# ------------------------------------------------------------------------------------------- verdicts
_DIVERGED = re.compile(r"DivergenceError: (.*)")
_FAILED = re.compile(r"^stage \S+ failed in cell \d+: (.*)$", re.M)


def failure_reason(log: str, returncode: int) -> str:
    """What a stage process that exited ``returncode`` (not 0) says went wrong: the divergence (method,
    round, seed and learning rates, as the runner words it), else the cell's error, else the last line."""
    found = _DIVERGED.findall(log)
    if found:
        return "diverged: " + found[-1].strip()
    failed = _FAILED.findall(log)
    if failed:
        return "error: " + failed[-1].strip()
    lines = [line for line in log.splitlines() if line.strip()]
    if returncode < 0:
        return f"killed by signal {-returncode}" + (f" ({lines[-1].strip()})" if lines else "")
    return "error: " + (lines[-1].strip() if lines else f"exit status {returncode}")


def memory_budget(estimate: int, baseline: int, factor: float = MEMORY_FACTOR) -> int:
    """Bytes a stage process may peak at: ``baseline`` (a process with a stage kernel's imports) plus
    ``factor`` x the stage's own ``memory_estimate()``, and never less than ``baseline + MEMORY_FLOOR``."""
    return int(baseline + max(factor * estimate, MEMORY_FLOOR))


def profile_estimate(seconds: float, cut: Cut | None) -> float:
    """Whole-profile seconds of a stage on this machine: seconds x (full rounds x seeds x settings x clients) /
    (what ran). An upper bound: the stage's setup (kernel start, data) is scaled as if it were round time."""
    return seconds * (cut.scale if cut is not None else 1.0)


def measure_baseline() -> int:
    """Peak RSS (bytes) of a process that imports what a stage's kernel imports, measured here and now."""
    code = "import " + ", ".join(BASELINE_IMPORTS)
    return _run_to_end([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)[1]


def _run_to_end(cmd: list[str], **popen) -> tuple[int, int]:
    """Run ``cmd`` to its end: (exit code, peak RSS in bytes of the largest process of its tree)."""
    return _reap(subprocess.Popen(cmd, **popen))


def _reap(proc: subprocess.Popen) -> tuple[int, int]:
    """Wait for ``proc``: (exit code, peak RSS in bytes of the largest process of its tree)."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    return proc.returncode, usage.ru_maxrss * 1024


@dataclass
class StageRun:
    stage: str
    status: str                   # ok | FAILED | skipped
    seconds: float = 0.0
    peak: int = 0
    budget: int = 0
    reason: str = ""
    cut: Cut | None = None
    diverged_cells: int = 0

    def row(self) -> dict:
        c = self.cut
        rounds = f"{c.rounds_run}/{c.rounds_full}" if c is not None and c.rounds_full else "-"
        per_round = f"{self.seconds / c.rounds_run:.2f}" if c is not None and c.rounds_run and self.status == "ok" \
            else "-"
        estimate = f"{profile_estimate(self.seconds, c):.0f}" if self.status == "ok" else "-"
        return {"stage": self.stage, "status": self.status, "rounds": rounds,
                "settings": f"{c.settings_run}/{c.settings_full}" if c is not None else "-",
                "seconds": f"{self.seconds:.1f}", "s_per_round": per_round,
                "peak_mib": f"{self.peak / 2**20:.0f}" if self.peak else "-",
                "budget_mib": f"{self.budget / 2**20:.0f}" if self.budget else "-",
                "profile_estimate_s": estimate, "diverged_cells": self.diverged_cells, "reason": self.reason}


def _run_one(stage, params_rel: str, target: str, log: Path) -> tuple[int, float, int, str]:
    """One stage as ``python -m pflkit stage`` (its own process tree, so a crash or an OOM kill is one
    stage's failure): exit code, seconds, peak RSS of its largest process (bytes), its output."""
    cmd = [sys.executable, "-m", "pflkit", "stage", stage.name, stage.ipynb, "--params", params_rel,
           "--profile", target]
    start = time.monotonic()
    code, peak = run_logged(cmd, log, echo=f"[{stage.name} ")
    return code, time.monotonic() - start, peak, log.read_text(errors="replace")


def run_logged(cmd: list[str], log: Path, echo: str) -> tuple[int, int]:
    """Run ``cmd`` to its end with its stdout and stderr written to ``log``, echoing to stderr (indented, as they
    come) the lines that start with ``echo`` (a stage's progress lines, ``[<stage> <elapsed>s] ...``): (exit
    code, peak RSS in bytes of the largest process of its tree)."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=project_root(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace")
        for line in proc.stdout:
            out.write(line)
            if line.startswith(echo):
                print("    " + line, end="", file=sys.stderr, flush=True)
        proc.stdout.close()
        return _reap(proc)


def _diverged_cells(root: Path, target: str, stage: str) -> int:
    path = root / "build" / target / stage / "diverged.csv"
    try:
        with path.open() as f:
            return sum(1 for _ in csv.DictReader(f))
    except OSError:
        return 0


def _drop_canary_runtimes(root: Path) -> None:
    """A canary's stage runs are not the profile's runtimes: keep them out of build/runtimes.csv (README's table)."""
    path = root / RUNTIMES_LOG
    try:
        with path.open(newline="") as f:
            rows = list(csv.reader(f))
    except OSError:
        return
    if not rows or "profile" not in rows[0]:
        return
    i = rows[0].index("profile")
    kept = [rows[0]] + [r for r in rows[1:] if not (len(r) > i and r[i].startswith("canary/"))]
    if len(kept) != len(rows):
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("w", newline="") as f:
            csv.writer(f).writerows(kept)
        tmp.replace(path)


COLUMNS = ("stage", "status", "rounds", "settings", "seconds", "s_per_round", "peak_mib", "budget_mib",
           "profile_estimate_s", "diverged_cells", "reason")


def run_canary(profile: str, stages: list[str] | None = None, params_file: str = "params.yaml",
               rounds: int | None = None, short: bool = False, max_clients: int | None = MAX_CLIENTS,
               memory_factor: float = MEMORY_FACTOR) -> int:
    """Run the canary (module docstring); 0 when every stage passed, else 1 (each failure listed)."""
    root = project_root()
    names = [s.name for s in table.STAGES]
    chosen = chosen_stages(stages)
    if rounds is not None and rounds < 1:
        raise ConfigError(f"canary-rounds: must be an integer >= 1, got {rounds}")
    if short:
        rounds = SHORT_ROUNDS if rounds is None else rounds
        max_clients = SHORT_MAX_CLIENTS if max_clients is None else max_clients
        chosen = [n for n in chosen if not table.get(n).is_plot]
    target = canary_profile(profile)
    out = root / OUT / profile
    out.mkdir(parents=True, exist_ok=True)
    params, cuts = canary_params(load_params(root / params_file), profile, chosen, rounds=rounds,
                                 grid_rounds=rounds, max_clients=max_clients)
    params_path = out / "params.yaml"
    params_path.write_text(yaml.safe_dump(params, sort_keys=False, width=120))
    params_rel = str(params_path.relative_to(root))
    configs = validate_stages(params, chosen, target)  # bad input fails before any work
    baseline = measure_baseline()
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    threads = resolve_threads()
    print(f"canary of profile {profile}: {len(chosen)} stages, outputs under {out.relative_to(root)}/ "
          f"(baseline process {baseline / 2**20:.0f} MiB; memory budget = baseline + max({memory_factor:g} x the "
          f"stage's estimate, {MEMORY_FLOOR / 2**20:.0f} MiB); {_threads(threads)} per stage "
          "(`threads: auto`: OMP_NUM_THREADS, else 1)", file=sys.stderr, flush=True)
    runs: list[StageRun] = []
    failed: set[str] = set()
    table_path = out / "canary.csv"
    start = time.monotonic()
    with table_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for i, name in enumerate(n for n in names if n in chosen):
            stage = table.get(name)
            cut = cuts.get(name)
            need = [d for d in (stage.source, *_upstream(name)) if d]
            blocked = [d for d in need if d in failed]
            if blocked:
                run = StageRun(name, "skipped", reason=f"needs {', '.join(blocked)}, which failed", cut=cut)
                failed.add(name)
            else:
                print(f"[{i + 1}/{len(chosen)}] {name}" + (f" ({'; '.join(cut.changes)})" if cut and cut.changes
                                                          else ""), file=sys.stderr, flush=True)
                code, seconds, peak, log = _run_one(stage, params_rel, target, logs / f"{name}.log")
                estimate, _ = configs[name].memory_estimate()
                budget = memory_budget(estimate, baseline, memory_factor)
                run = StageRun(name, "ok", seconds, peak, budget, cut=cut,
                               diverged_cells=_diverged_cells(root, target, name))
                if code != 0:
                    run.status, run.reason = "FAILED", failure_reason(log, code)
                elif peak > budget:
                    run.status = "FAILED"
                    run.reason = (f"memory: peak {peak / 2**20:.0f} MiB > budget {budget / 2**20:.0f} MiB "
                                  f"(baseline {baseline / 2**20:.0f} MiB + max({memory_factor:g} x estimate "
                                  f"{estimate / 2**20:.0f} MiB, {MEMORY_FLOOR / 2**20:.0f} MiB))")
                elif run.diverged_cells:
                    run.reason = f"{run.diverged_cells} grid cells diverged (a result: see diverged.csv)"
                if run.status != "ok":
                    failed.add(name)
                print(f"    {run.status} in {seconds:.1f} s, peak {peak / 2**20:.0f} MiB"
                      + (f": {run.reason}" if run.reason else ""), file=sys.stderr, flush=True)
            runs.append(run)
            writer.writerow(run.row())
            f.flush()
    _drop_canary_runtimes(root)
    rows = [r.row() for r in runs]
    wall = time.monotonic() - start
    print(format_table(rows, wall, profile, threads))
    md = out / "canary.md"
    md.write_text(report(rows, wall, profile, threads, command_line(profile, stages, rounds, short, max_clients,
                                                                           params_file)))
    print(f"table: {table_path.relative_to(root)}, {md.relative_to(root)}; logs: {logs.relative_to(root)}/")
    bad = [r for r in runs if r.status != "ok"]
    if bad:
        print(f"canary of profile {profile}: {len(bad)} of {len(runs)} stages failed:", file=sys.stderr)
        for r in bad:
            print(f"  {r.stage}: {r.status}: {r.reason}", file=sys.stderr)
        return 1
    print(f"canary of profile {profile}: every stage passed", file=sys.stderr)
    return 0


def _upstream(name: str) -> list[str]:
    """Compute stages whose outputs ``name`` reads (perm_fig5: perm_fig4's alpha file)."""
    stage = table.get(name)
    return [s.name for s in table.compute_stages()
            if s.name != name and any(dep.startswith(s.models_dir) for dep in stage.extra_deps)]


def _threads(n: int) -> str:
    return f"{n} torch thread{'s' if n != 1 else ''}"


def format_table(rows: list[dict], wall: float, profile: str, threads: int) -> str:
    """The canary's table (markdown) from its rows (``StageRun.row()``, or canary.csv read back): one row per
    stage, then the wall time and the whole-profile estimate (at ``threads`` torch threads)."""
    cols = [c for c in COLUMNS if c != "diverged_cells"]
    head = ("stage", "status", "rounds run/full", "settings run/full", "s", "s/round", "peak MiB", "budget MiB",
            f"{profile} estimate s", "note")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        lines.append("| " + " | ".join(str(row[c]) for c in cols) + " |")
    total = sum(float(r["profile_estimate_s"]) for r in rows if r["status"] == "ok")
    missing = [r["stage"] for r in rows if r["status"] != "ok"]
    lines.append(f"\ncanary wall time {wall:.0f} s ({wall / 60:.1f} min); whole profile {profile} on this machine "
                 f"at {_threads(threads)}: "
                 f"about {total:,.0f} s ({total / 3600:.1f} h, an upper bound: setup scaled as round time)"
                 + (f", without the stages that did not pass ({', '.join(missing)})" if missing else ""))
    return "\n".join(lines)


def report(rows: list[dict], wall: float, profile: str, threads: int, command: str) -> str:
    """canary.md: the machine, the command and ``format_table``."""
    import platform

    import torch

    from .device import cpu_model
    return (f"Machine: {cpu_model() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; "
            f"`{command}`, {_threads(threads)} per stage; finished "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n\n{format_table(rows, wall, profile, threads)}\n")


def command_line(profile: str, stages: list[str] | None, rounds: int | None, short: bool,
                 max_clients: int | None, params_file: str = "params.yaml") -> str:
    """The ``python -m pflkit reproduce`` command of a canary run with these arguments."""
    parts = ["python -m pflkit reproduce --profile", profile, "--canary"]
    if stages:
        parts += ["--stages", ",".join(stages)]
    if short:
        parts.append("--short")
    if rounds is not None and not (short and rounds == SHORT_ROUNDS):
        parts += ["--canary-rounds", str(rounds)]
    if max_clients != (SHORT_MAX_CLIENTS if short else MAX_CLIENTS):
        parts += ["--max-clients", str(max_clients)]
    if params_file != "params.yaml":
        parts += ["--params", str(params_file)]
    return " ".join(parts)
