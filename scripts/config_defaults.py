"""Which stage-config fields carry a code default, and whether params.yaml sets them (issue 27).

    python scripts/config_defaults.py           counts, then every competing or code-only default
    python scripts/config_defaults.py --all     every field with a code default, one line each

For every stage (``pflkit.stages.STAGES``: each compute stage, and one plot stage for the shared ``figures``
section) it walks the stage's config class and its nested sections (a sub-model, a mapping of them such as
Charles's ``tasks``, a list of them such as Chayti's ``panels``) against the stage's values as params.yaml
gives them (``defaults`` merged under the section, the default profile). Each field with a default in code
is one row:

* ``competing``: params.yaml sets it too (the default never applies, and may disagree with the value);
* ``code-only``: params.yaml does not set it, so the code default is the value the stage runs with.

The runner's keys (``config.RUNNER_KEYS``) are set by the stage runner, never by params.yaml: left out. So are a
method's own settings (``experiments.curves.Method.needs``: a section such as ``pfedme``, localized FedAvg's
``finetune_*``) whose default is None: params.yaml gives them only where the stage's ``methods`` lists the method,
and the config refuses a listed method without them (``curves.missing_settings``), so None means "not run".
The target (``tests/unit/test_config_defaults.py`` enforces it): no competing default and no code-only one,
except the documented ``EXCEPTIONS`` below.
"""
from __future__ import annotations

import argparse
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Row:
    stage: str
    owner: str          # the class that declares the field (its default is written there)
    path: str           # dotted key inside the stage's values: perm.lam, tasks.femnist.width, panels.0.b
    default: object     # the code default
    set: bool           # params.yaml sets the key
    value: object       # params.yaml's value when set

    @property
    def kind(self) -> str:
        return "competing" if self.set else "code-only"

    @property
    def disagrees(self) -> bool:
        return self.set and self.value != self.default


def _models(annotation):
    """(container, model): the pydantic model a field's values are validated by, and how they nest in it:
    ``"one"`` (the value is the model's mapping), ``"dict"`` (a mapping of them), ``"list"`` (a list of them);
    None when the field holds no model."""
    from pydantic import BaseModel

    from pflkit.config import _unwrap
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "one", annotation
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    inner = _unwrap(args[-1]) if args else None
    union = typing.get_origin(inner) in (typing.Union, types.UnionType) and all(
        isinstance(m, type) and issubclass(m, BaseModel) for m in typing.get_args(inner))
    if union or (isinstance(inner, type) and issubclass(inner, BaseModel)):
        if origin is dict:
            return "dict", inner
        if origin in (list, tuple):
            return "list", inner
    return None


def member_for(model, item):
    """``model``, or for a discriminated union of models (Charles's tasks) the member ``item`` selects (its value of
    a Literal field, e.g. ``dataset``); None when no member matches."""
    if isinstance(model, type):
        return model
    for member in typing.get_args(model):
        if isinstance(item, dict) and any(typing.get_origin(f.annotation) is typing.Literal and
                                          item.get(name) in typing.get_args(f.annotation)
                                          for name, f in member.model_fields.items()):
            return member
    return None


def owner(cls, name: str) -> str:
    """The class of ``cls``'s MRO that declares field ``name``."""
    return next(c.__name__ for c in cls.__mro__ if name in getattr(c, "__annotations__", {}))


def field_rows(cls, values, stage: str, prefix: str = "") -> list[Row]:
    """One row per field of ``cls`` (and of its nested models) with a code default, against ``values``
    (a mapping: what params.yaml gives for ``cls``)."""
    from pydantic_core import PydanticUndefined

    from pflkit.config import RUNNER_KEYS
    from pflkit.experiments.curves import METHODS
    method_settings = {key for m in METHODS.values() for key in m.needs}
    values = values if isinstance(values, dict) else {}
    rows = []
    for name, field in cls.model_fields.items():
        if not prefix and name in RUNNER_KEYS:
            continue
        path = f"{prefix}{name}"
        given = name in values
        if not prefix and name in method_settings and field.default is None:
            pass  # a method's own settings: None is "the stage does not run it" (module docstring)
        elif not field.is_required():
            default = field.get_default(call_default_factory=True)
            if default is not PydanticUndefined:
                if hasattr(default, "model_dump"):
                    default = default.model_dump()
                rows.append(Row(stage, owner(cls, name), path, default, given, values.get(name)))
        nested = _models(field.annotation)
        if nested is None:
            continue
        how, model = nested
        value = values.get(name)
        if how == "one" and (value is None or isinstance(value, dict)):
            rows += field_rows(model, value or {}, stage, f"{path}.")
        elif how == "dict" and isinstance(value, dict):
            for key, item in value.items():
                if member_for(model, item) is not None:
                    rows += field_rows(member_for(model, item), item, stage, f"{path}.{key}.")
        elif how == "list" and isinstance(value, list):
            for i, item in enumerate(value):
                if member_for(model, item) is not None:
                    rows += field_rows(member_for(model, item), item, stage, f"{path}.{i}.")
    return rows


def audited_stages(params) -> list[str]:
    """The stages whose values params.yaml gives (``config._validated_stages``: compute stages, one plot stage)."""
    from pflkit.config import _validated_stages
    return _validated_stages(params)


def audit(params, profile: str = "default") -> list[Row]:
    """Every field with a code default, of every stage params.yaml has a section for, against the stage's values
    under ``profile``."""
    from pflkit.config import RUNNER_KEYS, stage_config, stage_values
    rows = []
    for stage in audited_stages(params):
        values = {k: v for k, v in stage_values(params, stage, profile).items() if k not in RUNNER_KEYS}
        rows += field_rows(stage_config(stage), values, stage)
    return rows


def count(rows: list[Row]) -> str:
    competing = [r for r in rows if r.set]
    return (f"{len(rows)} with a code default: {len(competing)} also set in params.yaml "
            f"({sum(r.disagrees for r in competing)} disagree), {len(rows) - len(competing)} code-only")


def summary(rows: list[Row]) -> str:
    """The counts, for a stage's own keys and for the keys of its nested sections (counted per stage)."""
    top = [r for r in rows if "." not in r.path]
    nested = [r for r in rows if "." in r.path]
    return f"stage keys: {count(top)}\nnested keys: {count(nested)}"


#: the code defaults the target allows, (declaring class, field) -> why: none left (params.yaml gives every key of
#: every section, its profiles' overlays included; Charles's image and text tasks are two classes, so neither has a
#: key the other needs)
EXCEPTIONS: dict[tuple[str, str], str] = {}


def violations(rows: list[Row], exceptions=EXCEPTIONS) -> list[str]:
    """Every field with a code default that ``exceptions`` does not allow, one line each."""
    return [f"{r.stage}.{r.path}: {r.kind} default {r.default!r} in {r.owner}"
            + (f" (params.yaml: {r.value!r})" if r.set else " (params.yaml does not set it)")
            for r in rows if (r.owner, r.path.rsplit(".", 1)[-1]) not in exceptions]


def unset_required(cls, values) -> list[str]:
    """The required fields of ``cls`` (the stage's own keys) that ``values`` does not set."""
    return [name for name, field in cls.model_fields.items() if field.is_required() and name not in values]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--all", action="store_true", help="list every field with a code default")
    args = parser.parse_args(argv)
    from pflkit.config import load_params
    rows = audit(load_params(args.params))
    print(summary(rows))
    for r in rows:
        if args.all or r.disagrees or not r.set:
            what = f"params {r.value!r} vs code {r.default!r}" if r.set else f"code {r.default!r}"
            print(f"  {r.kind:9} {'DISAGREE ' if r.disagrees else ''}{r.stage}.{r.path}: {what}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
