"""The repository's scripts and benchmarks (plain files, not a package) loaded as modules, for their tests."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load(relative: str, name: str | None = None, register: bool = False) -> ModuleType:
    """The module of the file at ``relative`` (to the repository root), executed afresh under ``name`` (default:
    the file's stem); ``register`` also puts it in ``sys.modules`` (a module whose dataclasses look themselves up
    there needs that)."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
