"""Typed, validated configuration for every notebook stage.

Each stage's section of params.yaml (merged over the ``defaults`` section) becomes one
``StageConfig`` subclass, registered under the stage name. Building a config validates every value
and rejects unknown keys, so bad input fails before any work starts, with a message naming the key,
the value and what is allowed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from .engine.device import DEVICES

_REGISTRY: dict[str, type["StageConfig"]] = {}
# keys the stage runner adds to every stage's parameters (not part of params.yaml sections)
RUNNER_KEYS = ("stage", "results_dir", "figures_dir")


class ConfigError(ValueError):
    """One or more configuration values are invalid; the message lists each problem."""


class StageConfig(BaseModel):
    """Base of every stage config: strict keys, plus the fields every stage has."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    stage: str
    results_dir: str
    figures_dir: str
    device: str = "auto"

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
        """Pick this config's fields out of a notebook's globals() (its parameters cell)."""
        return cls.build({k: namespace[k] for k in cls.model_fields if k in namespace})


def format_errors(cls, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "<section>"
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(sorted(cls.model_fields))
            lines.append(f"{key}: unknown key (value {err['input']!r}); allowed keys: {allowed}")
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
