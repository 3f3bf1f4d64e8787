# %% [markdown]
# # Chayti et al., Fig. 1 (figure) — speedup of weighted gradient averaging over training alone
#
# Drawn from the files `fig1_speedup` wrote (`results/chayti_fig1/`: `heatmap.csv` and `check.csv` and
# `run.json` under `dvc repro`, `build/<profile>/chayti_fig1/` for a profile's run): (a) the heat map of
# S(N, tau) = 1 + N / (1 + N tau) over N and tau (log axes) with contour lines; (b) the measured speedup Alone
# loss / WGA(a*) loss per checked (N, tau) (points, +-2 SE) against S(N, tau) (lines). Nothing is simulated
# here; the look comes from params.yaml's `figures` settings (a change there re-runs this notebook alone).

# %% tags=["parameters"]
stage = "chayti_fig1_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what fig1_speedup.ipynb wrote by default)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/chayti_fig1
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import plotting, report
from pflkit.figures import chayti as draw
from pflkit.paths import resolve

cfg = plotting.FigureConfig.from_namespace(globals())
plotting.configure(cfg)
result = report.read_result(cfg.results_dir)
run = result.run_info["config"]  # the compute stage's config, as it ran
print(result.data_label, "|", result.scale)

# %%
fig = draw.speedup_figure(result.heatmap, result.check, run["check_eta"], run["check_runs"],
                          "Chayti Fig. 1: WGA speedup over training alone", result.data_label, result.scale)
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig1_speedup")
print("wrote", [p.name for p in figure_files])
