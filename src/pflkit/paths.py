"""Project-relative paths: notebooks run with their own folder as cwd (JupyterLab, nbval) or with the
project root (papermill --cwd); outputs always land relative to the project root."""
from __future__ import annotations

import os
from pathlib import Path


def project_root(start: str | os.PathLike | None = None) -> Path:
    """The nearest folder at or above ``start`` (default cwd) holding both dvc.yaml and params.yaml."""
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "dvc.yaml").exists() and (folder / "params.yaml").exists():
            return folder
    return here


def resolve(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path if path.is_absolute() else project_root() / path
