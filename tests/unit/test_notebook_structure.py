"""What papermill and nbval depend on in a notebook is checked (issue 56): `pflkit notebooks check` compares each
code cell's tags with the twin's (a JupyterLab save that drops the ``parameters`` tag is caught) and requires the
parameters cell in both, and a stage refuses a twin without its parameters cell before anything is removed (it ran
the smoke profile, removed the stage's earlier outputs and failed with a misleading error)."""
import shutil
from pathlib import Path

import nbformat
import pytest

from pflkit import notebooks
from pflkit.notebooks import StageError, check_twins, notebook_from_twin

ROOT = Path(__file__).resolve().parents[2]
TWIN = "notebooks/perm/fig1_synthetic.py"
TAG_LINE = '# %% tags=["parameters"]'
TEXT = (ROOT / TWIN).read_text()
assert TAG_LINE in TEXT and '\nprofile = "smoke"' in TEXT


def _untag(nb):
    for cell in nb.cells:
        cell.metadata.get("tags", []).clear()
    return nb


def _tag(tag):
    def change(nb):
        [c for c in nb.cells if c.cell_type == "code"][-1].metadata.setdefault("tags", []).append(tag)
        return nb
    return change


NO_PROFILE = TEXT.replace('\nprofile = "smoke"', "\nprofile_ = 'smoke'", 1)
TWO_CELLS = TEXT + f"\n{TAG_LINE}\nx = 1\n"

CHECK_CASES = [
    # (what the twin holds, what the stored notebook becomes, problems' ends expected: (file, words))
    ("in step", TEXT, None, []),
    ("a save dropped the tag", TEXT, _untag, [("fig1_synthetic.ipynb", "cell tags differ from fig1_synthetic.py"),
                                              ("fig1_synthetic.ipynb", "0 code cells are tagged 'parameters'")]),
    ("an nbval tag only in the notebook", TEXT, _tag("nbval-skip"),
     [("fig1_synthetic.ipynb", "the notebook has ['nbval-skip'], the twin []")]),
    ("neither has the tag", TEXT.replace(TAG_LINE, "# %%"), None,
     [("fig1_synthetic.py", "0 code cells are tagged"), ("fig1_synthetic.ipynb", "0 code cells are tagged")]),
    ("the cell names no profile", NO_PROFILE, None,
     [("fig1_synthetic.py", "does not assign profile"), ("fig1_synthetic.ipynb", "does not assign profile")]),
    ("two parameters cells", TWO_CELLS, None, [("fig1_synthetic.py", "2 code cells are tagged 'parameters'"),
                                               ("fig1_synthetic.ipynb", "2 code cells are tagged 'parameters'")]),
]


@pytest.mark.parametrize("twin_text,change,expected", [c[1:] for c in CHECK_CASES], ids=[c[0] for c in CHECK_CASES])
def test_notebooks_check_compares_tags_and_the_parameters_cell(tmp_path, twin_text, change, expected):
    twin = tmp_path / TWIN
    twin.parent.mkdir(parents=True)
    twin.write_text(twin_text)
    nb = notebook_from_twin(twin)
    nbformat.write(change(nb) if change else nb, twin.with_suffix(".ipynb"))
    problems = check_twins(tmp_path)
    for name, words in expected:
        assert any(p.startswith(str(twin.parent / name)) and words in p for p in problems), (name, words, problems)
    assert len(problems) == len(expected), problems


REFUSED = [  # (which names the cell assigns is notebooks check's: the runner's tests run twins that assign fewer)
    ("no parameters tag", TEXT.replace(TAG_LINE, "# %%"), "0 code cells are tagged 'parameters'"),
    ("the tag on a markdown cell", TEXT.replace(TAG_LINE, "# %%").replace("# %% [markdown]",
                                                                         '# %% [markdown] tags=["parameters"]', 1),
     "0 code cells are tagged 'parameters'"),
    ("two parameters cells", TWO_CELLS, "2 code cells are tagged 'parameters'"),
]


@pytest.mark.parametrize("text,words", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_stage_refuses_a_twin_without_its_parameters_cell_before_removing_anything(tmp_path, monkeypatch, text,
                                                                                     words):
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    twin = tmp_path / TWIN
    twin.parent.mkdir(parents=True)
    twin.write_text(text)
    old = tmp_path / "results" / "perm_fig1" / "metrics.json"  # an earlier run's output
    old.parent.mkdir(parents=True)
    old.write_text("{}")
    removed = []
    monkeypatch.setattr(notebooks, "project_root", lambda: tmp_path)
    monkeypatch.setattr(notebooks, "_remove", removed.append)
    with pytest.raises(StageError, match="nothing was run or removed") as err:
        notebooks.run_stage("perm_fig1", "notebooks/perm/fig1_synthetic.ipynb")
    assert f"stage perm_fig1: {TWIN}: " in str(err.value) and words in str(err.value)
    assert removed == [] and old.read_text() == "{}"
    assert not (tmp_path / "build" / "running").exists()


def test_the_committed_twins_have_their_parameters_cell():
    nb = notebooks._runnable_notebook("perm_fig1", ROOT / TWIN, (ROOT / TWIN).read_bytes(), ROOT)
    assert notebooks.parameters_problem(nb) is None
    assert check_twins(ROOT) == []
