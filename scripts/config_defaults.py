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

The runner's keys (``config.RUNNER_KEYS``) are set by the stage runner, never by params.yaml: left out.
The target (``tests/unit/test_config_defaults.py`` enforces it): no competing default and no code-only one,
except the documented ``EXCEPTIONS`` below.
"""
from __future__ import annotations

import argparse
import sys
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
    if isinstance(inner, type) and issubclass(inner, BaseModel):
        if origin is dict:
            return "dict", inner
        if origin in (list, tuple):
            return "list", inner
    return None


def owner(cls, name: str) -> str:
    """The class of ``cls``'s MRO that declares field ``name``."""
    return next(c.__name__ for c in cls.__mro__ if name in getattr(c, "__annotations__", {}))


def field_rows(cls, values, stage: str, prefix: str = "") -> list[Row]:
    """One row per field of ``cls`` (and of its nested models) with a code default, against ``values``
    (a mapping: what params.yaml gives for ``cls``)."""
    from pydantic_core import PydanticUndefined

    from pflkit.config import RUNNER_KEYS
    values = values if isinstance(values, dict) else {}
    rows = []
    for name, field in cls.model_fields.items():
        if not prefix and name in RUNNER_KEYS:
            continue
        path = f"{prefix}{name}"
        given = name in values
        if not field.is_required():
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
                rows += field_rows(model, item, stage, f"{path}.{key}.")
        elif how == "list" and isinstance(value, list):
            for i, item in enumerate(value):
                rows += field_rows(model, item, stage, f"{path}.{i}.")
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


#: the code defaults the target allows, (declaring class, field) -> why. Every one is of a nested section: a
#: profile's overlay replaces a whole nested mapping (``perm: {..}``, ``tasks: {..}``) and these overlays leave the
#: key out, so the class's default is the value that profile runs; or a task key the other kind of task does not
#: use. Completing those overlays in ``profiles:`` (each key with the value the default gives) lets the entry go.
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("TaskSection", "allow_download"): "profiles.smoke's image tasks leave it out; the text task does not use it",
    ("TaskSection", "root"): "profiles.smoke's and profiles.paper's tasks leave it out",
    ("TaskSection", "test_fraction"): "profiles.smoke's and profiles.paper's tasks leave it out",
    ("TaskSection", "eval_samples"): "profiles.smoke's and paper's image tasks leave it out (None: the stage's)",
    ("TaskSection", "pool_size"): "profiles.smoke's cifar100 tasks leave it out (None: all); the text task: unused",
    ("TaskSection", "num_clients"): "profiles.paper's shakespeare tasks leave it out (None: every role)",
    ("TaskSection", "substitute"): "not used by the text task (shakespeare)",
    ("TaskSection", "partition"): "not used by the text task (shakespeare)",
    ("TaskSection", "width"): "not used by the text task (shakespeare)",
    ("TaskSection", "source"): "not used by an image task",
    ("TaskSection", "hidden"): "not used by an image task",
}


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
