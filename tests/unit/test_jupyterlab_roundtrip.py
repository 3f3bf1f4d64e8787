"""Open, run and save a notebook in JupyterLab: its py:percent twin (the code its DVC stage depends on)
must stay byte-identical, so the stage stays up to date.

JupyterLab saves paired notebooks through jupytext's contents manager (the `jupyterlab_jupytext`
server extension installs ``jupytext.AsyncTextFileContentsManager``); these tests call that same
manager on a copy of the project's notebooks and the project's ``jupytext.toml``.
"""
from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(p.relative_to(ROOT) for p in (ROOT / "notebooks").rglob("*.ipynb")
                   if ".ipynb_checkpoints" not in p.parts)


@pytest.fixture
def project(tmp_path):
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    shutil.copy(ROOT / "jupytext.toml", tmp_path / "jupytext.toml")
    return tmp_path


def lab_open_run_save(root: Path, path: str, edit=None) -> None:
    """What JupyterLab does: get the notebook model, run it (new outputs and execution counts), and
    optionally let the user ``edit`` the cells, then save through the jupytext contents manager."""
    manager = jupytext.AsyncTextFileContentsManager(root_dir=str(root))

    async def go():
        model = await manager.get(path)
        for n, cell in enumerate(model["content"]["cells"], start=1):
            if cell["cell_type"] == "code":
                cell["execution_count"] = n
                cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": f"run {n}\n"}]
        if edit is not None:
            edit(model["content"])
        await manager.save(model, path)

    asyncio.run(go())


def test_notebooks_are_found():
    assert len(NOTEBOOKS) >= 26


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[str(p) for p in NOTEBOOKS])
def test_open_run_save_keeps_the_twin_byte_identical(project, notebook):
    twin = project / notebook.with_suffix(".py")
    before = twin.read_bytes()
    lab_open_run_save(project, str(notebook))
    assert twin.read_bytes() == before, f"saving {notebook} in JupyterLab changed {twin.name}"


def test_a_code_edit_saved_in_jupyterlab_does_reach_the_twin(project):
    """The check above can fail: a real code change is written to the twin."""
    notebook = "notebooks/perm/fig1_synthetic.ipynb"
    twin = project / "notebooks/perm/fig1_synthetic.py"
    before = twin.read_text()

    def edit(content):
        code = next(c for c in content["cells"] if c["cell_type"] == "code")
        code["source"] += "\nedited_in_lab = True"

    lab_open_run_save(project, notebook, edit)
    after = twin.read_text()
    assert after != before and "edited_in_lab = True" in after
    assert "jupytext_version" not in after


def test_without_the_metadata_filter_saving_would_stamp_the_twin(project):
    """Guards the fix itself: remove the filter (config and notebook metadata) and a save writes a
    metadata header with jupytext's version stamp into the twin, which is what invalidated every stage."""
    (project / "jupytext.toml").write_text('formats = "ipynb,py:percent"\n')
    notebook = project / "notebooks/perm/fig1_synthetic.ipynb"
    notebook.write_text(notebook.read_text().replace('"notebook_metadata_filter": "-all"', '"unused": "-all"'))
    twin = project / "notebooks/perm/fig1_synthetic.py"
    twin.touch()  # the twin stays the newer file of the pair (jupytext refuses to open an outdated twin)
    assert "jupytext_version" not in twin.read_text()
    lab_open_run_save(project, "notebooks/perm/fig1_synthetic.ipynb")
    assert "jupytext_version" in twin.read_text()
