"""Notebook hygiene: every notebook has its py:percent twin in step, stored smoke outputs for nbval,
a regression reference (a metric table nbval compares exactly, or expected smoke results that
tests/regression compares within measured tolerances), a parameters cell, clean stored outputs, and a
DVC stage that depends on the twin."""
from pathlib import Path

import nbformat
import pytest
import yaml

from pflkit.notebooks import check_twins

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def test_twins_in_step():
    assert check_twins(ROOT) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_notebook_is_ready_for_nbval_and_papermill(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert any("parameters" in c.metadata.get("tags", []) for c in code), "no cell tagged parameters"
    checked = [c for c in code if c.source.startswith("# NBVAL_CHECK_OUTPUT")]
    assert all(c.outputs for c in checked), "a cell nbval compares has no stored output"
    stage = next(line.split('"')[1] for c in code for line in c.source.splitlines() if line.startswith("stage = "))
    expected = ROOT / "tests" / "regression" / "expected" / stage
    if stage.endswith("_plot"):  # a plot stage: nbval runs it, and its stored run wrote both figure formats
        printed = "".join("".join(o.get("text", "")) for c in code for o in c.outputs)
        assert ".png" in printed and ".svg" in printed, "a plot notebook's stored run names the figures it wrote"
    else:
        assert checked or expected.is_dir(), "no regression reference: neither an nbval-compared cell nor expected"
    assert not any(o.get("output_type") == "error" for c in code for o in c.outputs)
    twin = str(path.with_suffix(".py").relative_to(ROOT))
    users = [name for name, s in STAGES.items() if twin in s.get("deps", [])]
    assert users, f"no dvc stage depends on {twin}"
    for name in users:
        assert str(path.relative_to(ROOT)) in STAGES[name]["cmd"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_stored_outputs_are_clean(path):
    """No empty or whitespace-only stderr output, no kernel transport warning in any stored notebook."""
    nb = nbformat.read(path, as_version=4)
    for n, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        for out in cell.outputs:
            text = out.get("text", "") if out.get("output_type") == "stream" else ""
            assert not (out.get("name") == "stderr" and not text.strip()), f"code cell {n}: empty stderr output"
            assert "without encryption" not in text, f"code cell {n}: kernel transport warning stored"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_papermill_parses_every_parameter(path):
    """papermill reads the parameters cell to match injected values; a line it cannot parse (e.g. a
    comment holding '=') makes every stage run warn 'Passed unknown parameter'."""
    from papermill.translators import PythonTranslator

    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    assigned = [line.split("=")[0].strip() for line in cell.source.splitlines()
                if line[:1].isalpha() and "=" in line.split("#")[0]]
    assert [p.name for p in PythonTranslator.inspect(cell)] == assigned
