"""Smoke results of every notebook, compared with stored expected values within measured tolerances.

Each notebook's parameters cell is a small smoke configuration; run as-is (by nbval, or here) it writes
``build/smoke/<stage>/``: metrics.json and the CSV tables of the stage. ``tests/regression/expected/
<stage>/`` holds the same files from a reference run. :func:`compare` checks every value:

* numbers within ``|got - expected| <= atol + rtol * |expected|`` (the stage's tolerance, see
  ``TOLERANCES`` in test_smoke_results.py and how it was measured there);
* integers that count things, strings (labels, dataset names) and booleans exactly;
* except keys the stage lists as ``derived``: picks among trained floats (an arg-min, a verdict)
  that may change within the tolerance; their inputs are compared instead.

Keys that describe the run rather than its result (config, environment, timings, threads, paths, and the
provenance: the stage and its settings digest, which any edit of params.yaml changes) are skipped.

Update the expected values after a deliberate change of results (and say why in the commit):

    .venv/bin/python tests/regression/smoke.py update [stage ...]      # runs the notebooks first
"""
from __future__ import annotations

import csv
import io
import json
import math
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = Path(__file__).resolve().parent / "expected"
#: files of a smoke run that are compared: metrics.json and every CSV table except timings
SKIP_FILES = {"run.json", "times.csv"}
#: keys (flattened, dotted) that describe the run, not its result
SKIP_KEYS = re.compile(r"(^|\.)(config|environment|device|figures_dir|results_dir|provenance)(\.|\[|$)"
                       r"|runtime|seconds|elapsed|wall|threads")


@dataclass(frozen=True)
class Notebook:
    stage: str
    notebook: Path       # notebooks/<paper>/<name>.ipynb
    results_dir: Path    # build/smoke/<stage>


def smoke_notebooks() -> list[Notebook]:
    """Every compute stage's notebook and smoke results folder: the stage table (pflkit.stages) and the
    smoke profile's output folder (``config.output_dirs``), for every twin whose parameters cell runs the
    ``smoke`` profile. (Plot stages write figures only: nbval runs them.)"""
    from pflkit import stages
    from pflkit.config import output_dirs
    found = []
    for stage in stages.compute_stages():
        twin = ROOT / stage.notebook
        if re.search(r'^profile = "smoke"', twin.read_text(), re.M):
            results_dir, _ = output_dirs(stage.name, "smoke")
            found.append(Notebook(stage.name, twin.with_suffix(".ipynb"), ROOT / results_dir))
    return sorted(found, key=lambda nb: str(nb.notebook))


# ----------------------------------------------------------------------------- running
def _newest_source_mtime(nb: Notebook) -> float:
    sources = [nb.notebook, nb.notebook.with_suffix(".py"), ROOT / "params.yaml",
               *(ROOT / "src" / "pflkit").rglob("*.py")]
    return max(p.stat().st_mtime for p in sources if p.exists())


def is_fresh(nb: Notebook) -> bool:
    """The smoke outputs exist and are newer than the notebook and the package (as nbval leaves them
    when it ran in the same ``make test``)."""
    metrics = nb.results_dir / "metrics.json"
    return metrics.exists() and metrics.stat().st_mtime >= _newest_source_mtime(nb)


def run_notebook(nb: Notebook, timeout: int = 1200) -> None:
    """Execute the notebook with its smoke defaults, from its own folder (as nbval does)."""
    import nbformat
    from nbclient import NotebookClient

    from pflkit.notebooks import ipc_kernel, kernel_name

    if nb.results_dir.exists():
        shutil.rmtree(nb.results_dir)
    notebook = nbformat.read(nb.notebook, as_version=4)
    with ipc_kernel() as manager:
        NotebookClient(notebook, timeout=timeout, kernel_name=kernel_name(), kernel_manager_class=manager,
                       resources={"metadata": {"path": str(nb.notebook.parent)}}).execute()


def ensure_smoke_results(nb: Notebook) -> Path:
    if not is_fresh(nb):
        run_notebook(nb)
    return nb.results_dir


# ----------------------------------------------------------------------------- reading
def flatten(obj, prefix: str = ""):
    """Nested dicts/lists -> (dotted key, leaf) pairs."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from flatten(v, f"{prefix}[{i}]")
    else:
        yield prefix, obj


def _cell(text: str):
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def read_values(folder: Path) -> dict[str, object]:
    """Every compared value of a results folder: ``<file>:<key>`` -> leaf. CSV keys are
    ``<file>:<row>.<column>``."""
    values: dict[str, object] = {}
    for path in sorted(folder.iterdir()):
        if path.name in SKIP_FILES or path.suffix not in (".json", ".csv"):
            continue
        if path.suffix == ".json":
            for key, leaf in flatten(json.loads(path.read_text())):
                values[f"{path.name}:{key}"] = leaf
        else:
            for i, row in enumerate(csv.DictReader(io.StringIO(path.read_text()))):
                for column, text in row.items():
                    values[f"{path.name}:{i}.{column}"] = _cell(text)
    return {k: v for k, v in values.items() if not SKIP_KEYS.search(k.split(":", 1)[1])}


# ----------------------------------------------------------------------------- comparing
@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    #: keys (regex, searched in "<file>:<key>") that pick among trained floats (an arg-min, a verdict):
    #: within the tolerance the pick may change, so they are skipped and their inputs compared instead
    derived: str | None = None


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def compare(expected: dict, got: dict, tol: Tolerance) -> list[str]:
    """Problems (empty = every expected value reproduced)."""
    derived = re.compile(tol.derived) if tol.derived else None
    problems = []
    for key, want in expected.items():
        if key not in got:
            problems.append(f"{key}: missing (expected {want!r})")
            continue
        have = got[key]
        if derived is not None and derived.search(key):
            continue
        if _is_number(want) and _is_number(have):
            if isinstance(want, float) or isinstance(have, float):
                if math.isnan(want) and math.isnan(have):
                    continue
                if math.isinf(want) or math.isinf(have):
                    ok = want == have
                else:
                    ok = abs(have - want) <= tol.atol + tol.rtol * abs(want)
            else:
                ok = have == want
            if not ok:
                problems.append(f"{key}: got {have!r}, expected {want!r} "
                                f"(|diff| {abs(have - want):.3g} > atol {tol.atol:g} + rtol {tol.rtol:g} x |expected|)")
        elif have != want:
            problems.append(f"{key}: got {have!r}, expected {want!r}")
    return problems


def update(stages: list[str] | None = None) -> None:
    for nb in smoke_notebooks():
        if stages and nb.stage not in stages:
            continue
        folder = ensure_smoke_results(nb)
        target = EXPECTED / nb.stage
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for path in sorted(folder.iterdir()):
            if path.name not in SKIP_FILES and path.suffix in (".json", ".csv"):
                shutil.copy(path, target / path.name)
        print(f"{nb.stage}: expected values from {folder.relative_to(ROOT)}")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "update":
        sys.exit(__doc__)
    update(sys.argv[2:] or None)
