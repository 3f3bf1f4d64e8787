"""A stage's work as cells: run the missing ones (in this process or as Ray tasks), keep each result, assemble.

A **cell** is the smallest unit of a stage whose result depends only on its own config, the data and the code (a
grid setting of a task: the Charles & Konecny grids, ``experiments.charles_nn``). Its key is the SHA-256 of those
three: the cell's config (JSON), the digest of the data it trains on, and the digest of the pflkit source files
the stage's code can import (``code_digest``: a static import walk, the files DVC tracks for the stage). A
finished cell is kept in the **cell store** (``CellStore``: ``<store>/<stage>/<key>.json``, its record, metrics
and curves, in git, and ``<store>/tensors/<stage>/<key>.pt``, its final model, through DVC; each written beside
its place and renamed in, the record last), so a crash, a lost worker, a killed driver or a grid grown by one
value recomputes only the cells the store lacks; the stage then assembles its outputs from the store's files
alone, whichever executor computed them. The paper profile, whose cells cost GPU-hours, keeps them in the
project's ``cells/`` (``git add cells``, ``dvc add cells/tensors``, ``dvc push``: a colleague's ``git pull`` +
``dvc pull`` brings them and nothing re-runs); the other profiles keep theirs under build/<profile>/cells (the
default profile's grids take a minute, and its stage outputs travel through DVC as every stage's do).

**Executors** (``Executor.from_env``: params.yaml's ``defaults.executor``, which ``$PFLKIT_EXECUTOR`` overrides
for one run): ``local`` runs the missing cells' packs one after the other in this process; ``ray`` (a new local
Ray instance, or the cluster ``$RAY_ADDRESS`` names) and ``ray:<address>`` (``auto``, ``host:port``,
``ray://host:port``) make every pack a Ray task (Ray's public API: ``ray.remote`` with ``num_cpus``,
``num_gpus``, ``memory``, ``max_retries``, ``retry_exceptions``; ``ray.wait``): Ray places, retries (a lost
worker or node, and an error up to ``retries`` times) and dispatches; the results come back through Ray's object
store and the driver writes the store, so the workers need no shared file system (each node reads the data from
its own checkout: ``dvc pull`` of the data stages). The executor changes where cells run, never their results
(tests/integration/test_cells_ray.py): the environment variable chooses it for one run without DVC seeing a
changed setting.

A **pack** is the cells one call computes together (cells of one ``group``, at most ``pack_size``): a packing
choice, not a change of results, for a stage whose cells draw their own streams (``data.draws.LaneDraws``).
"""
from __future__ import annotations

import ast
import hashlib
import json
import math
import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .io import load_checkpoint, save_checkpoint, write_json
from .paths import project_root, resolve
from .progress import note

EXECUTOR_ENV, STORE_ENV, PROJECT_ENV, PACK_ENV = "PFLKIT_EXECUTOR", "PFLKIT_CELLS", "PFLKIT_PROJECT", "PFLKIT_PACK"
DEFAULT_STORE = "cells"
#: the profiles whose cells go to the project's shared store: the paper profile's (pflkit.stages.PIPELINE_PROFILES)
SHARED_PROFILES = ("paper",)
PLAN = "plan.json"
LOOPBACK = "127.0.0.1"
#: environment variables a Ray worker gets from the driver (the stage's data rule, its threads)
FORWARDED_ENV = ("PFLKIT_REQUIRE_PREPARED", "PFLKIT_PARAMS", "OMP_NUM_THREADS")
FORMAT = "pflkit-cell-1"
_SRC = Path(__file__).resolve().parent


class CellError(RuntimeError):
    """A cell failed on every try (names the stage and the cells of its pack)."""


@dataclass(frozen=True)
class Cell:
    """One unit of a stage: ``name`` (what progress and errors show), ``group`` (cells of one group may run in
    one call: the task), ``config`` (JSON values: what its result depends on besides the code and the data)
    and ``key`` (``cell_key``)."""
    name: str
    group: str
    config: Mapping[str, Any]
    key: str


def _canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def cell_key(config: Mapping[str, Any], data: str, code: str) -> str:
    """The SHA-256 (hex, 32 characters) of a cell's config, its data digest and the code digest."""
    return hashlib.sha256(_canonical({"config": config, "data": data, "code": code}).encode()).hexdigest()[:32]


def _module_file(name: str) -> Path | None:
    """The source file of pflkit module ``name`` (a package: its __init__.py), or None."""
    base = _SRC.joinpath(*name.split(".")[1:])
    if base != _SRC and base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return base / "__init__.py" if (base / "__init__.py").is_file() else None


def _imports(path: Path, name: str) -> set[str]:
    """The pflkit modules module ``name`` (at ``path``) imports, absolute and relative (``from . import x``:
    x may be a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "pflkit"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                up = package.split(".")
                base = ".".join(up[: len(up) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] == "pflkit":
                found |= {base} | {f"{base}.{a.name}" for a in node.names}
    return found


def code_files(module: str) -> list[Path]:
    """The pflkit source files ``module`` can import: a static walk of its imports and of every package above
    each (what DVC tracks for a stage that runs it)."""
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        parts = todo.pop().split(".")
        for i in range(1, len(parts) + 1):  # a module's packages run their __init__ first
            sub = ".".join(parts[:i])
            path = None if sub in seen else _module_file(sub)
            if path is not None:
                seen[sub] = path
                todo += sorted(_imports(path, sub))
    return sorted(set(seen.values()))


def code_digest(module: str) -> str:
    """SHA-256 of ``code_files(module)``, each by its path (relative to the package) and bytes."""
    h = hashlib.sha256()
    for path in code_files(module):
        h.update(str(path.relative_to(_SRC)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------ the store
class CellStore:
    """Finished cells: ``root/<stage>/<key>.json`` (format, stage, name, config, record: metrics and curves,
    small enough for git) and, when the cell has tensors (a final model), ``root/tensors/<stage>/<key>.pt``
    (weights-only torch file; the folder DVC tracks, ``cells/tensors.dvc``). A cell is stored once its record
    exists (its tensors are written first). ``plan.json`` per stage: the cells its last run asked for."""

    TENSORS = "tensors"

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def folder(self, stage: str) -> Path:
        return self.root / stage

    def _tensors(self, stage: str, key: str) -> Path:
        return self.root / self.TENSORS / stage / f"{key}.pt"

    def has(self, stage: str, key: str) -> bool:
        return (self.folder(stage) / f"{key}.json").is_file()

    def keys(self, stage: str) -> set[str]:
        folder = self.folder(stage)
        return {p.stem for p in folder.glob("*.json") if p.name != PLAN} if folder.is_dir() else set()

    def put(self, stage: str, cell: Cell, record: Mapping[str, Any], tensors: Mapping[str, Any] | None) -> None:
        if tensors is not None:
            path = self._tensors(stage, cell.key)
            path.parent.mkdir(parents=True, exist_ok=True)
            save_checkpoint(path, {"format": FORMAT, "tensors": dict(tensors)})
        self.folder(stage).mkdir(parents=True, exist_ok=True)
        write_json(self.folder(stage) / f"{cell.key}.json", {"format": FORMAT, "stage": stage, "name": cell.name,
                                                             "config": cell.config, "record": record,
                                                             "tensors": tensors is not None})

    def get(self, stage: str, key: str) -> tuple[dict, dict | None]:
        """(record, tensors or None) of a stored cell; a missing tensor file says to pull it."""
        path = self.folder(stage) / f"{key}.json"
        saved = json.loads(path.read_text(encoding="utf-8"))
        if saved.get("format") != FORMAT:
            raise ValueError(f"{path}: not a pflkit cell (format {FORMAT})")
        if not saved["tensors"]:
            return saved["record"], None
        tensors = self._tensors(stage, key)
        if not tensors.is_file():
            raise FileNotFoundError(f"{tensors}: the tensors of stored cell {saved['name']!r} are missing "
                                    f"(`dvc pull {self.root / self.TENSORS}.dvc` brings them)")
        return saved["record"], load_checkpoint(tensors)["tensors"]

    def write_plan(self, stage: str, cells: Sequence[Cell], settings_digest: str | None = None) -> Path:
        """``<stage>/plan.json``: the keys and names of the cells a run asks for (and the digest of the stage's
        settings), so that the ledger can count how many of them exist before the stage finishes."""
        self.folder(stage).mkdir(parents=True, exist_ok=True)
        return write_json(self.folder(stage) / PLAN, {"format": FORMAT, "stage": stage,
                                                      "settings_digest": settings_digest,
                                                      "cells": {c.key: c.name for c in cells}})

    def progress(self, stage: str) -> tuple[int, int, str | None] | None:
        """(cells stored, cells planned, the plan's settings digest) of a stage's last plan, or None."""
        path = self.folder(stage) / PLAN
        if not path.is_file():
            return None
        plan = json.loads(path.read_text(encoding="utf-8"))
        have = self.keys(stage)
        return sum(k in have for k in plan["cells"]), len(plan["cells"]), plan.get("settings_digest")


def store_path(profile: str | None = None) -> str:
    """Where ``profile``'s cells live, relative to the project root (``default_store`` without
    ``$PFLKIT_CELLS``): the project's ``cells/`` for a shared profile, else ``build/<profile>/cells``."""
    if profile in SHARED_PROFILES:
        return DEFAULT_STORE
    return f"build/{profile}/cells" if profile else "build/cells"


def default_store(profile: str | None = None) -> CellStore:
    """``$PFLKIT_CELLS``; else the project's ``cells/`` for the paper profile (what a team shares),
    ``build/<profile>/cells`` for any other (default; smoke: the notebooks' and tests' own; the canary's),
    ``build/cells`` for results of no profile. The canary's (``canary/<profile>``) starts empty at every stage:
    it measures what a stage's cells cost, so it never reuses them."""
    if os.environ.get(STORE_ENV):
        return CellStore(resolve(os.environ[STORE_ENV]))
    store = CellStore(resolve(store_path(profile)))
    if profile and profile.startswith("canary/"):
        shutil.rmtree(store.root, ignore_errors=True)
    return store


# --------------------------------------------------------------------------------------------- executors
@dataclass(frozen=True)
class Executor:
    """Where packs run: ``kind`` local | ray; ``address`` (ray: None = ``$RAY_ADDRESS`` or a new local
    instance); ``pack_size``: at most this many cells per call (None: the stage's choice; ``run_cells``
    without one puts a group's cells in one call); per pack (a Ray task) ``cpus``,
    ``gpus`` (a fraction packs several tasks onto one device) and ``retries`` (Ray's ``max_retries``; errors
    are retried as often)."""
    kind: str = "local"
    address: str | None = None
    pack_size: int | None = None
    cpus: float = 1.0
    gpus: float | None = None  # None: 1 where the cluster has a GPU, else 0
    retries: int = 3

    def __post_init__(self):
        if self.pack_size is not None and (not isinstance(self.pack_size, int) or self.pack_size < 1):
            raise ValueError(f"{PACK_ENV}: a positive integer (cells per call), got {self.pack_size!r}")

    KINDS = ("local", "ray")

    @classmethod
    def parse(cls, text: str | None, name: str = EXECUTOR_ENV, **kw) -> Executor:
        """``local`` | ``ray`` | ``ray:<address>`` (None or empty: local); an error names the setting ``name``."""
        text = (text or "local").strip()
        kind, _, address = text.partition(":")
        if kind not in cls.KINDS or (kind == "local" and address):
            raise ValueError(f"{name}={text!r}: allowed: local, ray, ray:<address> (auto, host:port, "
                             "ray://host:port)")
        return cls(kind, address or None, **kw)

    @classmethod
    def from_env(cls, setting: str | None = None, **kw) -> Executor:
        """The executor a run uses: ``$PFLKIT_EXECUTOR`` when set (a per-run override), else ``setting``
        (params.yaml ``defaults.executor``), else local; ``$PFLKIT_PACK`` (cells per call), ``$PFLKIT_GPUS`` and
        ``$PFLKIT_CPUS`` (per Ray task: default 1 CPU, and 1 GPU where the cluster has one, else none)."""
        pack = os.environ.get(PACK_ENV)
        if pack:
            if not pack.isdigit() or int(pack) < 1:
                raise ValueError(f"{PACK_ENV}={pack!r}: allowed: a positive integer (cells per call)")
            kw.setdefault("pack_size", int(pack))
        for name, env in (("cpus", "PFLKIT_CPUS"), ("gpus", "PFLKIT_GPUS")):
            if os.environ.get(env):
                try:
                    value = float(os.environ[env])
                except ValueError:
                    value = -1.0
                if not value >= 0:
                    raise ValueError(f"{env}={os.environ[env]!r}: allowed: a number >= 0 (per Ray task)")
                kw.setdefault(name, value)
        if os.environ.get(EXECUTOR_ENV):
            return cls.parse(os.environ[EXECUTOR_ENV], **kw)
        return cls.parse(setting, "executor", **kw)

    def describe(self) -> str:
        return "local" if self.kind == "local" else f"ray:{self.address or os.environ.get('RAY_ADDRESS') or 'new'}"


def packs_of(cells: Sequence[Cell], pack_size: int | None) -> list[list[Cell]]:
    """The cells by group (in first-seen order), each group in pieces of at most ``pack_size`` (None: whole)."""
    groups: dict[str, list[Cell]] = {}
    for c in cells:
        groups.setdefault(c.group, []).append(c)
    size = pack_size or max(len(g) for g in groups.values()) if groups else 1
    return [g[i:i + size] for g in groups.values() for i in range(0, len(g), size)]


def _run_pack(compute: Callable, context, pack: list[Cell]):
    """A pack where it runs: (outputs, where, seconds); GPU memory handed back after it. A Ray worker first
    enters the project folder the driver names (``$PFLKIT_PROJECT``: the checkout's path, the same on every
    node), so that the stage's relative paths (data/prepared, params.yaml) resolve as in the driver."""
    project = os.environ.get(PROJECT_ENV)
    if project:
        if not Path(project, "params.yaml").is_file():
            raise CellError(f"{socket.gethostname()}: no pflkit checkout at {project} (${PROJECT_ENV}, the "
                            "driver's project folder: every node needs the checkout at the same path)")
        os.chdir(project)
    start = time.perf_counter()
    out = compute(context, pack)
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return out, socket.gethostname() + ":" + str(os.getpid()), time.perf_counter() - start


@dataclass
class CellRun:
    """What ``run_cells`` did: every cell's (record, tensors) read back from the store, in the cells' order;
    how many were computed and how many the store held; where each computed pack ran."""
    results: list[tuple[dict, dict | None]]
    computed_keys: set[str]
    where: list[str] = field(default_factory=list)

    @property
    def computed(self) -> int:
        return len(self.computed_keys)

    @property
    def cached(self) -> int:
        return len(self.results) - len(self.computed_keys)


def run_cells(stage: str, cells: Sequence[Cell], compute: Callable, context, *, store: CellStore,
              executor: Executor | None = None, pack_size: int | None = None,
              memory: Callable[[list[Cell]], int] | None = None, log: Callable[[str], None] = note) -> CellRun:
    """Compute the cells ``store`` lacks, ``compute(context, pack) -> [(record, tensors or None)]`` per pack,
    on ``executor``; store each pack's cells as it finishes; return every cell from the store. ``memory(pack)``:
    the bytes a pack needs (a Ray task's ``memory`` resource). A pack that fails on every try raises
    ``CellError`` naming its cells; the cells finished before stay stored."""
    executor = executor or Executor()
    keys = [c.key for c in cells]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{stage}: two cells have one key (the same config twice)")
    todo = [c for c in cells if not store.has(stage, c.key)]
    packs = packs_of(todo, pack_size)
    total, cached = len(cells), len(cells) - len(todo)
    log(f"{stage}: {total} cells, {cached} in the store ({store.folder(stage)}), {len(todo)} to compute in "
        f"{len(packs)} pack(s) on {executor.describe()}")
    done, where, start = cached, [], time.perf_counter()

    def finished(pack, out, at, seconds):
        nonlocal done
        if len(out) != len(pack):
            raise CellError(f"{stage}: a pack of {len(pack)} cells returned {len(out)} results")
        for cell, (record, tensors) in zip(pack, out):
            store.put(stage, cell, record, tensors)
        done += len(pack)
        where.append(at)
        left = (time.perf_counter() - start) / (done - cached) * (total - done)
        log(f"{stage}: cells {done}/{total} ({pack[0].name}{' ...' if len(pack) > 1 else ''} on {at}, "
            f"{seconds:.1f} s; about {_duration(left)} left)")

    if packs and executor.kind == "local":
        for pack in packs:
            try:
                out, at, seconds = _run_pack(compute, context, pack)
            except Exception as e:
                raise CellError(f"{stage}: cells {[c.name for c in pack]} failed: {e}") from e
            finished(pack, out, at, seconds)
    elif packs:
        _run_on_ray(stage, packs, compute, context, executor, memory, finished)
    return CellRun([store.get(stage, c.key) for c in cells], {c.key for c in todo}, where)


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    return f"{seconds:.0f} s" if seconds < 120 else (f"{seconds / 60:.1f} min" if seconds < 7200
                                                      else f"{seconds / 3600:.1f} h")


def _run_on_ray(stage, packs, compute, context, executor: Executor, memory, finished) -> None:
    import ray

    started = not ray.is_initialized()
    if started:  # a new local instance listens on the loopback only; a cluster is joined as it is
        new = executor.address is None and not os.environ.get("RAY_ADDRESS")
        ray.init(address=executor.address, log_to_driver=False, include_dashboard=False,
                 **({"_node_ip_address": LOOPBACK} if new else {}))
    env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
    env[PROJECT_ENV] = str(project_root())
    # the workers import this tree (a worktree's too), as the driver does
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_SRC.parent), os.environ.get("PYTHONPATH")]))
    gpus = executor.gpus if executor.gpus is not None else float(ray.cluster_resources().get("GPU", 0) > 0)
    task = ray.remote(_run_pack)
    pending = {}
    try:
        for pack in packs:
            options = dict(num_cpus=executor.cpus, num_gpus=gpus, max_retries=executor.retries,
                           retry_exceptions=True, runtime_env={"env_vars": env})
            if memory is not None:
                options["memory"] = int(memory(pack))
            pending[task.options(**options).remote(compute, context, pack)] = pack
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            pack = pending.pop(ready[0])
            try:
                out, at, seconds = ray.get(ready[0])
            except ray.exceptions.RayError as e:
                raise CellError(f"{stage}: cells {[c.name for c in pack]} failed on every try "
                                f"({executor.retries} retries): {e}") from e
            finished(pack, out, at, seconds)
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()


