"""Figures apart from computing (issue 21): no compute stage can import drawing code (pflkit.plotting,
pflkit.figure_config, pflkit.figures, matplotlib, seaborn), every plot stage draws from its source stage's result
files only, and the drawing helpers of pflkit.figures draw what the tables hold."""
import ast
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402

from pflkit.figures import charles as draw_charles  # noqa: E402
from pflkit.figures import chayti as draw_chayti  # noqa: E402
from pflkit.plotting import plt, series_palette  # noqa: E402
from pflkit.theory import speedup  # noqa: E402
from repo_files import load

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PFLKIT = SRC / "pflkit"
dvc_stages = load("scripts/dvc_stages.py", "dvc_stages_for_split")
STAGES = dvc_stages.load_stages().STAGES
COMPUTE = [s for s in STAGES if not s.is_plot]
PLOT = [s for s in STAGES if s.is_plot]
DRAWING_PACKAGES = {"matplotlib", "seaborn"}


def closure(stage) -> set[Path]:
    """The pflkit files the stage's notebook and runner can import (what dvc.yaml lists as its code deps)."""
    return dvc_stages.import_closure([ROOT / stage.notebook], [stage.config_module, *dvc_stages.RUNNER_MODULES], SRC)


def top_level_imports(path: Path) -> set[str]:
    """The absolute imports of a file (any depth of the syntax tree), as top-level package names."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("stage", COMPUTE, ids=[s.name for s in COMPUTE])
def test_compute_stages_import_no_drawing_code(stage):
    files = closure(stage)
    drawing = sorted(str(f.relative_to(SRC)) for f in files
                     if f in (PFLKIT / "plotting.py", PFLKIT / "figure_config.py") or PFLKIT / "figures" in f.parents)
    assert not drawing, f"{stage.name} can import drawing code: {drawing}"
    third_party = {f"{f.relative_to(ROOT)}: {name}" for f in [ROOT / stage.notebook, *files]
                   for name in top_level_imports(f) & DRAWING_PACKAGES}
    assert not third_party, f"{stage.name} imports a plotting library: {sorted(third_party)}"


@pytest.mark.parametrize("stage", PLOT, ids=[s.name for s in PLOT])
def test_plot_stages_read_their_source_results_only(stage):
    experiments = sorted(f.name for f in closure(stage) if f.parent == PFLKIT / "experiments")
    assert set(experiments) <= {"__init__.py", "result.py"}, f"{stage.name} imports compute code: {experiments}"
    text = (ROOT / stage.notebook).read_text()
    assert f'stage = "{stage.name}"' in text
    assert "report.read_result(cfg.results_dir)" in text and "plotting.configure(cfg)" in text


def test_the_figure_modules_import_no_compute_module():
    for module in ("charles", "chayti"):
        imported = {n.module for n in ast.walk(ast.parse((PFLKIT / "figures" / f"{module}.py").read_text()))
                    if isinstance(n, ast.ImportFrom) and n.module}
        assert not {m for m in imported if "experiments" in m}, (module, imported)


def test_a_plot_notebook_loads_no_torch():
    """Every plot notebook's imports and its config (``FigureConfig.from_namespace``, device auto, threads applied
    only where a stage computes) leave torch unloaded: 1.1 s of every plot stage's kernel (a fresh process each;
    the runner's side: the next test)."""
    imports = sorted({ast.unparse(n) for s in PLOT for n in ast.walk(ast.parse((ROOT / s.notebook).read_text()))
                      if isinstance(n, (ast.Import, ast.ImportFrom))})
    code = "\n".join(["import sys", *imports,
                      "cfg = plotting.FigureConfig.from_namespace(dict(stage='charles_fig1_plot', profile='default'))",
                      "print(cfg.device, cfg.computes, sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["auto", "False", "[]"], out.stdout


def test_the_stage_runner_validates_a_plot_stage_without_drawing_or_array_packages():
    """The runner's own steps for a plot stage (the command line, validation, the kernel's environment, the
    runtime line) load no matplotlib, seaborn, scipy, pandas, numpy or torch: the kernel draws, the runner
    only checks (FigureConfig lives in pflkit.figure_config, and pflkit.io names pandas only for annotations).
    Moving FigureConfig back into pflkit.plotting, or importing pandas in pflkit.io, fails this; so does naming
    PFLKIT_REQUIRE_PREPARED through pflkit.data.prepared, or resolving a plot stage's device (torch)."""
    code = "\n".join(["import pathlib, sys, tempfile",
                      "import pflkit.__main__, pflkit.io  # run_stage writes through pflkit.io",
                      "from pflkit.config import load_params, validate_stage",
                      "from pflkit.notebooks import _kernel_environment, record_runtime",
                      "stage = validate_stage(load_params('params.yaml'), 'charles_fig1_plot')",
                      "tmp = pathlib.Path(tempfile.mkdtemp())",
                      "env = _kernel_environment(tmp / 'progress', b'code', tmp / 'params.yaml', 'default')",
                      "record_runtime(tmp, 'charles_fig1_plot', 'default', 1.0, stage)",
                      "assert env['PFLKIT_REQUIRE_PREPARED'] == '1', env",
                      "assert (tmp / 'build/runtimes.csv').read_text().splitlines()[1].split(',')[3] == 'cpu'",
                      "heavy = {'matplotlib', 'seaborn', 'scipy', 'pandas', 'numpy', 'torch'}",
                      "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))"])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]"], out.stdout


# ------------------------------------------------------------------------------------ the helpers
def test_speedup_map_draws_the_heatmap_table_as_its_grid():
    ns, taus = np.array([1, 10, 100]), np.array([1e-3, 1e-1, 10.0])
    heatmap = pd.DataFrame({"N": np.repeat(ns, 3), "tau": np.tile(taus, 3),
                            "speedup": speedup.wga_speedup(np.repeat(ns, 3), np.tile(taus, 3))})
    fig, ax = plt.subplots()
    draw_chayti.speedup_map(ax, fig, heatmap.sample(frac=1, random_state=0))  # row order must not matter
    mesh = ax.collections[0]
    assert np.allclose(np.asarray(mesh.get_array()).reshape(3, 3), speedup.wga_speedup(ns[:, None], taus[None, :]))
    assert ax.get_xscale() == ax.get_yscale() == "log" and "tau" in ax.get_xlabel() and "N" in ax.get_ylabel()
    plt.close(fig)


def curves_and_final(floors: list[float]):
    labels = [f"zeta={z}" for z in range(len(floors))]
    curves = pd.DataFrame([{"step": s, "label": lab, "mean": 1.0 / (s + 1), "q10": 0.5 / (s + 1), "q90": 2.0 / (s + 1),
                            "theory": 1.0 / (s + 1)} for lab in labels for s in range(3)])
    return curves, pd.DataFrame({"label": labels, "paper_floor": floors})


def test_sweep_figure_draws_one_floor_per_curve_in_its_colour_or_one_shared_grey_floor():
    curves, final = curves_and_final([0.1, 0.2])
    fig = draw_chayti.sweep_figure(curves, final, "floor", "what", "data", "scale")
    ax = fig.axes[0]
    colours = series_palette(list(final["label"]))
    floors = {line.get_ydata()[0]: to_rgb(line.get_color()) for line in ax.get_lines() if line.get_linestyle() == ":"
              and len(line.get_ydata())}
    assert floors == {0.1: to_rgb(colours["zeta=0"]), 0.2: to_rgb(colours["zeta=1"])}
    assert fig._suptitle.get_text() == "what\ndata (scale)"
    plt.close(fig)
    curves, final = curves_and_final([0.3, 0.3])
    ax = draw_chayti.sweep_figure(curves, final, "floor", "what", "data", "scale").axes[0]
    dotted = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
    assert [(line.get_ydata()[0], line.get_label()) for line in dotted] == [(0.3, "floor")]
    plt.close("all")


def test_loss_by_task_figure_has_one_panel_per_task_in_run_json_order():
    run_info = {"task_labels": [{"task": "femnist", "label": "F"}, {"task": "cifar100", "label": "C"}]}
    labels = draw_charles.task_labels(run_info)
    assert list(labels) == ["femnist", "cifar100"]
    history = pd.DataFrame([{"task": t, "round": r, "gamma": g, "metric": "train_loss", "value": 1.0 + r + g}
                            for t in labels for r in range(2) for g in (0.0, 0.1)])
    fig = draw_charles.loss_by_task_figure(history, labels, "what", "K=2; femnist: x; cifar100: y")
    assert [ax.get_title() for ax in fig.axes] == ["F\nx", "C\ny"]  # each task's dataset and its own scale
    assert fig._suptitle.get_text() == "what\nK=2"  # two lines: what, and the scale the tasks share
    assert fig.axes[0].get_xlabel() == "communication round" and "nats" in fig.axes[0].get_ylabel()
    plt.close(fig)
