"""Every figure every plot stage draws from the smoke profile's results passes the figure lint (each is saved
through plotting.save_figure, which refuses a figure the lint fails). Here, not in tests/unit: `make test` runs
this folder after the notebooks in the same process, so build/smoke/ is complete and nothing else writes it
meanwhile (a unit test running a stage beside nbval would race it for the same folder)."""
import re
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from pflkit import stages  # noqa: E402
from pflkit.plotting import plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PLOT_STAGES = [s for s in stages.STAGES if s.is_plot]


# ---------------------------------------------------------------- every plot stage's figures pass
def smoke_results(source: str) -> Path:
    """build/smoke/<source>/, run first (`python -m pflkit stage <source> --profile smoke`) when it is missing."""
    folder = ROOT / "build" / "smoke" / source
    if not (folder / "metrics.json").is_file():
        run = subprocess.run([sys.executable, "-m", "pflkit", "stage", source, "--profile", "smoke"], cwd=ROOT,
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-3000:]
    return folder


def draw_plot_stage(stage, results: Path, figures: Path) -> None:
    """Run the plot notebook's twin in this process with its smoke parameters, reading ``results``, writing
    ``figures`` (every figure through plotting.save_figure, so through the lint)."""
    code = (ROOT / stage.notebook).read_text()
    code = re.sub(r"^results_dir = None", f"results_dir = {str(results)!r}", code, flags=re.M)
    code = re.sub(r"^figures_dir = None", f"figures_dir = {str(figures)!r}", code, flags=re.M)
    assert f"results_dir = {str(results)!r}" in code and f"figures_dir = {str(figures)!r}" in code
    try:
        exec(compile(code, str(stage.notebook), "exec"), {"__name__": "__main__"})
    finally:
        plt.close("all")


@pytest.mark.slow
@pytest.mark.parametrize("stage", PLOT_STAGES, ids=[s.name for s in PLOT_STAGES])
def test_every_plot_stage_draws_figures_that_pass_the_lint(stage, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    draw_plot_stage(stage, smoke_results(stage.source), tmp_path)
    for name in stage.figure_names:
        assert (tmp_path / f"{name}.png").is_file() and (tmp_path / f"{name}.svg").is_file(), name
