"""Issue 30: inside a stage run (PFLKIT_PROGRESS set by the stage runner) progress bars are off, so the
executed report keeps no progress-bar outputs (the terminal gets progress.note's lines); elsewhere
(JupyterLab, nbval) the bar is on, as a widget where ipywidgets is installed (a dependency)."""
import importlib.util

from pflkit import progress


def test_bars_are_off_inside_a_stage_run_and_on_elsewhere(monkeypatch, tmp_path):
    monkeypatch.delenv(progress.ENV, raising=False)
    assert not progress.bar(3, "x").disable
    monkeypatch.setenv(progress.ENV, str(tmp_path / "progress"))
    assert progress.bar(3, "x").disable


def test_ipywidgets_is_installed_for_widget_bars():
    assert importlib.util.find_spec("ipywidgets") is not None
