"""pflkit.paths.shown: how every message shows a path (project-relative inside the project, else as it is)."""
import os

from pflkit.paths import shown


def test_a_path_inside_the_project_is_shown_relative_to_it_and_one_outside_as_it_is(tmp_path):
    root = tmp_path / "project"
    (root / "results").mkdir(parents=True)
    assert shown(root / "results" / "x.csv", root) == os.path.join("results", "x.csv")
    assert shown(tmp_path / "elsewhere.csv", root) == str(tmp_path / "elsewhere.csv")


def test_a_relative_path_is_read_from_the_working_folder(tmp_path, monkeypatch):
    root = tmp_path / "project"
    (root / "data").mkdir(parents=True)
    monkeypatch.chdir(root / "data")
    assert shown("prepared", root) == os.path.join("data", "prepared")
