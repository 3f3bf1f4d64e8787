"""Typed, validated configuration for every notebook stage.

Each stage's section of params.yaml (merged over the ``defaults`` section) becomes one
``StageConfig`` subclass, registered under the stage name. Building a config validates every value
and rejects unknown keys, so bad input fails before any work starts, with a message naming the key,
the value and what is allowed.
"""
from __future__ import annotations

import math
from pathlib import Path
import os
from typing import Annotated, Any, Mapping

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, field_validator

from .engine.device import DEVICES

_REGISTRY: dict[str, type["StageConfig"]] = {}
# keys the stage runner adds to every stage's parameters (not part of params.yaml sections)
RUNNER_KEYS = ("stage", "results_dir", "figures_dir")


class ConfigError(ValueError):
    """One or more configuration values are invalid; the message lists each problem."""


class KeyedProblems(ValueError):
    """Raised by a rule across keys (a model validator): each problem names its own key, so the
    message reads ``stage.key: problem`` rather than ``stage.<section>: ...``."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = list(problems)
        super().__init__("; ".join(f"{k}: {m}" for k, m in self.problems))


def raise_problems(problems: list[tuple[str, str]]) -> None:
    if problems:
        raise KeyedProblems(problems)


class StageConfig(BaseModel):
    """Base of every stage config: strict keys, plus the fields every stage has."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    stage: str
    results_dir: str
    figures_dir: str
    device: str = "auto"
    #: torch intra-op CPU threads for the stage: an integer >= 1, or "auto" (see ``resolve_threads``)
    threads: int | str = "auto"

    @field_validator("threads", mode="before")
    @classmethod
    def _threads(cls, v):
        if v != "auto" and not (_is_int(v) and v >= 1):
            raise ValueError(f"must be an integer >= 1 or 'auto', got {v!r}")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        from .engine.device import resolve_device
        if v not in DEVICES and not v.startswith("cuda:"):
            raise ValueError(f"must be one of {DEVICES} (or cuda:N), got {v!r}")
        resolve_device(v)  # cuda without a GPU is an error now, not mid-run
        return v

    @classmethod
    def build(cls, values: Mapping[str, Any]) -> "StageConfig":
        try:
            return cls(**dict(values))
        except ValidationError as exc:
            raise ConfigError(format_errors(cls, exc)) from None

    @classmethod
    def from_namespace(cls, namespace: Mapping[str, Any]) -> "StageConfig":
        """Pick this config's fields out of a notebook's globals() (its parameters cell), and apply
        the stage's thread setting (``torch.set_num_threads``): every notebook builds its config this
        way, so interactive runs and ``dvc repro`` use the same threads."""
        cfg = cls.build({k: namespace[k] for k in cls.model_fields if k in namespace})
        import torch
        torch.set_num_threads(resolve_threads(cfg.threads))
        return cfg


#: threads used by ``threads: auto`` when OMP_NUM_THREADS is not set. One thread, by measurement
#: (benchmarks/threads.py, results in benchmarks/results/threads.json): the stages run thousands of
#: small batched ops, where a second OpenMP thread gains little on a quiet machine and, when another
#: process keeps the other core busy, spin-waits turn a 35 s stage into minutes.
DEFAULT_THREADS = 1


def resolve_threads(threads: int | str = "auto") -> int:
    """``threads`` as an int: itself, or for "auto" the environment's OMP_NUM_THREADS when it is set
    to an integer >= 1 (how CI and users pick a count for a whole run), else ``DEFAULT_THREADS``."""
    if threads != "auto":
        return int(threads)
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(env) if env.isdigit() and int(env) >= 1 else DEFAULT_THREADS


def format_errors(cls, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "<section>"
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(sorted(cls.model_fields))
            lines.append(f"{key}: unknown key (value {err['input']!r}); allowed keys: {allowed}")
        elif isinstance((err.get("ctx") or {}).get("error"), KeyedProblems):
            prefix = ".".join(str(p) for p in err["loc"])
            for k, msg in err["ctx"]["error"].problems:
                lines.append(f"{prefix + '.' if prefix else ''}{k}: {msg}")
        elif not err["loc"]:  # a rule across keys: the input is the whole section, not worth echoing
            lines.append(f"{key}: {err['msg'].removeprefix('Value error, ')}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{key}: {msg} (got {err.get('input')!r})")
    return "\n".join(lines)


def register(stage: str):
    """Class decorator: ``@register("perm_fig1")`` makes the config the validator of that stage."""
    def deco(cls):
        if stage in _REGISTRY and _REGISTRY[stage] is not cls:
            raise ValueError(f"stage {stage!r} is registered twice")
        _REGISTRY[stage] = cls
        return cls
    return deco


def registry() -> dict[str, type[StageConfig]]:
    from . import experiments  # noqa: F401  (importing registers every stage config)
    return dict(_REGISTRY)


def load_params(path: str | Path = "params.yaml") -> dict:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such parameters file")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a mapping of sections, got {type(data).__name__}")
    return data


def stage_values(params: Mapping[str, Any], stage: str) -> dict:
    """``defaults`` overlaid by the stage's own section, plus the runner-provided output paths."""
    if stage not in params:
        raise ConfigError(f"params.yaml has no section {stage!r}; sections: {sorted(params)}")
    section = params[stage]
    if not isinstance(section, dict):
        raise ConfigError(f"{stage}: section must be a mapping, got {section!r}")
    paper = stage.split("_", 1)[0]
    values = {**(params.get("defaults") or {}), **section}
    values.update(stage=stage, results_dir=f"results/{stage}", figures_dir=f"figures/{paper}")
    return values


def validate_stage(params: Mapping[str, Any], stage: str) -> StageConfig:
    configs = registry()
    if stage not in configs:
        raise ConfigError(f"no config registered for stage {stage!r}; known: {sorted(configs)}")
    try:
        return configs[stage].build(stage_values(params, stage))
    except ConfigError as exc:
        raise ConfigError("\n".join(f"{stage}.{line}" for line in str(exc).splitlines())) from None


def validate_all(params: Mapping[str, Any]) -> list[str]:
    """Every problem in every section (empty list = all good)."""
    problems = []
    known = registry()
    for section in params:
        if section == "defaults":
            continue
        if section not in known:
            problems.append(f"{section}: unknown section; known stages: {', '.join(sorted(known))}")
            continue
        try:
            validate_stage(params, section)
        except ConfigError as exc:
            problems.extend(str(exc).splitlines())
    return problems


# --------------------------------------------------------------------------- shared checks
# Reusable by every stage config: dataset names, partition specs that must fit the data, and
# weights on the probability simplex. Each raises (or lists) problems naming key, value and rule.

def check_dataset_name(name: str) -> str:
    """A dataset name pflkit.data.vision knows (aliases and case allowed); returned unchanged."""
    from .data.vision import canonical_name
    canonical_name(name)  # ValueError: unknown dataset 'x'; allowed: [...]
    return name


def dataset_num_classes(name: str) -> int:
    from .data.vision import SOURCES, canonical_name
    return SOURCES[canonical_name(name)].num_classes


DatasetName = Annotated[str, AfterValidator(check_dataset_name)]

#: partition scheme -> (required options, optional options); see pflkit.data.partition / vision.federate
PARTITION_OPTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "iid": ((), ("samples_per_client",)),
    "classes": (("classes_per_client",), ("samples_per_client",)),
    "dirichlet": (("beta",), ("min_size",)),
    "natural": ((), ()),
}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def partition_problems(spec, key: str = "partition", allow_natural: bool = True) -> list[tuple[str, str]]:
    """Scheme name, option names (typos) and option values of one partition spec
    (``{scheme: classes, classes_per_client: 2}``)."""
    if not isinstance(spec, Mapping):
        return [(key, f"must be a mapping like {{scheme: iid}}, got {spec!r}")]
    schemes = tuple(s for s in PARTITION_OPTIONS if allow_natural or s != "natural")
    scheme = spec.get("scheme")
    if scheme not in schemes:
        return [(f"{key}.scheme", f"must be one of {schemes}, got {scheme!r}")]
    required, optional = PARTITION_OPTIONS[scheme]
    problems = []
    for k in spec:
        if k != "scheme" and k not in required + optional:
            problems.append((f"{key}.{k}", f"unknown option for scheme {scheme!r} (value {spec[k]!r}); "
                                           f"allowed: {sorted(required + optional) or 'none'}"))
    for k in required:
        if k not in spec:
            problems.append((f"{key}.{k}", f"required by scheme {scheme!r}"))
    for k in ("classes_per_client", "samples_per_client", "min_size"):
        if k in spec and not (_is_int(spec[k]) and spec[k] >= 1):
            problems.append((f"{key}.{k}", f"must be an integer >= 1, got {spec[k]!r}"))
    if "beta" in spec and not (isinstance(spec["beta"], (int, float)) and not isinstance(spec["beta"], bool)
                               and math.isfinite(spec["beta"]) and spec["beta"] > 0):
        problems.append((f"{key}.beta", f"must be a number > 0 (Dirichlet concentration), got {spec['beta']!r}"))
    return problems


def image_partition_problems(dataset, spec, num_clients: int, pool_size: int | None = None,
                             key: str = "partition") -> list[tuple[str, str]]:
    """``partition_problems`` plus what needs the dataset's size, known without loading pixels:
    classes_per_client <= classes of the dataset (and of its substitute, either may run), and every
    client gets >= 2 samples (one train, one test) of a ``pool_size`` pool. ``dataset`` is a name or
    a section with ``name`` / ``substitute``. (The exact sample count of the source that loads is
    checked again when the federation is built, before training.)"""
    problems = partition_problems(spec, key)
    if problems:
        return problems
    names = [dataset] if isinstance(dataset, str) else [getattr(dataset, "name", None),
                                                        getattr(dataset, "substitute", None)]
    names = [n for n in names if n is not None]
    k = spec.get("classes_per_client")
    for name in names:
        try:
            classes = dataset_num_classes(name)
        except ValueError:
            continue  # the name itself is reported by its own field
        if k is not None and k > classes:
            problems.append((f"{key}.classes_per_client",
                             f"{k} exceeds the {classes} classes of {name}; allowed: 1..{classes}"))
    if pool_size is not None and 2 * num_clients > pool_size:
        problems.append(("num_clients", f"{num_clients} clients need >= 2 samples each (one train, one test) "
                                        f"but pool_size is {pool_size}; allowed: num_clients <= {pool_size // 2}"))
    per_client = spec.get("samples_per_client")
    if per_client is not None and pool_size is not None and per_client * num_clients > pool_size:
        problems.append((f"{key}.samples_per_client",
                         f"{per_client} x {num_clients} clients exceeds pool_size {pool_size}"))
    return problems


def check_simplex(weights, tol: float = 1e-6):
    """Mixing weights on the probability simplex: a vector, or a matrix whose every row is one
    (entries >= 0, summing to 1 within ``tol``). Returned unchanged."""
    if not isinstance(weights, (list, tuple)) or not weights:
        raise ValueError(f"must be a non-empty list of weights (or of rows of weights), got {weights!r}")
    matrix = all(isinstance(r, (list, tuple)) for r in weights)
    for i, row in enumerate(weights if matrix else [weights]):
        where = f"row {i} " if matrix else ""
        try:
            values = [float(x) for x in row]
        except (TypeError, ValueError):
            raise ValueError(f"{where}must hold numbers, got {row!r}") from None
        if not values or any(not math.isfinite(x) or x < 0 for x in values) or abs(sum(values) - 1) > tol:
            raise ValueError(f"{where}must lie on the simplex (entries >= 0 summing to 1), got {list(row)!r} "
                             f"(sum {sum(values) if values else 0:g})")
    return weights


SimplexWeights = Annotated[list, AfterValidator(check_simplex)]
