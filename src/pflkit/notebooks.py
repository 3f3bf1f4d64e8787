"""Notebook plumbing: jupytext twins, smoke execution for nbval references, and stage execution.

Every notebook ``notebooks/<paper>/<name>.ipynb`` has a py:percent twin ``<name>.py`` holding the
same code. DVC stages depend on the twin, so re-running a notebook interactively (new outputs, same
code) never invalidates its stage; ``check_twins`` (run by the tests) keeps the pair in step.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import yaml

from .config import ConfigError, load_params, validate_stage
from .paths import project_root

KERNEL = "pflkit"


def kernel_name() -> str:
    """The project kernel when registered (make setup), else the current env's ``python3``."""
    from jupyter_client.kernelspec import KernelSpecManager
    return KERNEL if KERNEL in KernelSpecManager().find_kernel_specs() else "python3"


def _code_cells(nb) -> list[str]:
    return [c.source.strip() for c in nb.cells if c.cell_type == "code"]


def twin_of(notebook: Path) -> Path:
    return notebook.with_suffix(".py")


def refresh(py_path: str | Path, execute: bool = True, timeout: int = 900) -> Path:
    """Build ``<name>.ipynb`` from its py:percent twin and run it with its smoke defaults in place,
    from the notebook's own folder (as nbval does). Stderr (progress bars) is not kept."""
    import jupytext
    import nbformat
    from nbclient import NotebookClient

    py_path = Path(py_path)
    if py_path.suffix != ".py":
        raise ValueError(f"refresh takes the py:percent twin (.py), got {py_path}")
    nb = jupytext.read(py_path)
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python (pflkit)", "language": "python"}
    nb.metadata["jupytext"] = {"formats": "ipynb,py:percent"}
    if execute:
        client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_name(), record_timing=False,
                                resources={"metadata": {"path": str(py_path.parent.resolve())}})
        client.execute()
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs = [o for o in cell.outputs if o.get("name") != "stderr"]
    out = py_path.with_suffix(".ipynb")
    nbformat.write(nb, out)
    return out


def check_twins(root: str | Path | None = None) -> list[str]:
    """Problems with notebook/twin pairs under notebooks/ (empty list = all in step)."""
    import jupytext
    import nbformat

    root = Path(root or project_root())
    problems = []
    notebooks = sorted((root / "notebooks").rglob("*.ipynb"))
    for nb_path in notebooks:
        if ".ipynb_checkpoints" in nb_path.parts:
            continue
        twin = twin_of(nb_path)
        if not twin.exists():
            problems.append(f"{nb_path}: no py:percent twin {twin.name}")
            continue
        if _code_cells(nbformat.read(nb_path, as_version=4)) != _code_cells(jupytext.read(twin)):
            problems.append(f"{nb_path}: code differs from {twin.name}; run "
                            f"`python -m pflkit notebooks refresh {twin.relative_to(root)}` or sync with jupytext")
    for twin in sorted((root / "notebooks").rglob("*.py")):
        if not twin.with_suffix(".ipynb").exists():
            problems.append(f"{twin}: no notebook {twin.with_suffix('.ipynb').name}")
    return problems


def stage_outputs(stage: str, root: Path) -> list[Path]:
    """Every path the stage declares in dvc.yaml (outs, metrics, plots)."""
    spec = yaml.safe_load((root / "dvc.yaml").read_text())["stages"].get(stage)
    if spec is None:
        raise ConfigError(f"dvc.yaml has no stage {stage!r}")
    paths = []
    for key in ("outs", "metrics", "plots"):
        for entry in spec.get(key, []) or []:
            paths.append(root / (entry if isinstance(entry, str) else next(iter(entry))))
    return paths


def run_stage(stage: str, notebook: str | Path, params_file: str = "params.yaml") -> Path:
    """Validate the stage's parameters, execute its notebook with papermill at paper scale, and leave
    the executed copy in reports/. On failure every declared output is removed (no half-written
    results) and the failed notebook is kept in build/failed/ for inspection."""
    import papermill

    root = project_root()
    cfg = validate_stage(load_params(root / params_file), stage)  # bad input fails before any work
    notebook = Path(notebook)
    report = root / "reports" / notebook.relative_to("notebooks")
    outputs = stage_outputs(stage, root)
    for path in outputs:
        _remove(path)
    tmp = root / "build" / "running" / report.name
    tmp.parent.mkdir(parents=True, exist_ok=True)
    for folder in (cfg.results_dir, cfg.figures_dir):
        (root / folder).mkdir(parents=True, exist_ok=True)
    try:
        papermill.execute_notebook(str(root / notebook), str(tmp), parameters=cfg.model_dump(),
                                   kernel_name=kernel_name(), cwd=str(root), progress_bar=False)
    except BaseException:
        for path in outputs:
            _remove(path)
        failed = root / "build" / "failed" / f"{stage}.ipynb"
        failed.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.move(tmp, failed)
            print(f"stage {stage} failed; the executed notebook is in {failed.relative_to(root)}",
                  file=sys.stderr)
        raise
    report.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(tmp, report)
    return report


def _remove(path: Path):
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
