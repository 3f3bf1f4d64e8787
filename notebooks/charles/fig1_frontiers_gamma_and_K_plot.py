# %% [markdown]
# # Charles & Konecny, Fig. 1 (figure) — Pareto frontiers as gamma or K varies
#
# Drawn from the files `fig1_frontiers_gamma_and_K` wrote (`results/charles_fig1/frontier.csv` under
# `dvc repro`, `build/<profile>/charles_fig1/` for a profile's run): one (rho, Delta) curve per L; left: gamma
# fixed and K varies, right: K fixed and gamma varies. Nothing is computed here; the look comes from
# params.yaml's `figures` settings (a change there re-runs this notebook alone).

# %% tags=["parameters"]
stage = "charles_fig1_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what fig1_frontiers_gamma_and_K.ipynb wrote by default)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/charles_fig1
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import plotting, report
from pflkit.figures import charles as draw
from pflkit.paths import resolve

cfg = plotting.FigureConfig.from_namespace(globals())
plotting.configure(cfg)
result = report.read_result(cfg.results_dir)
print(result.data_label, "|", result.scale)

# %%
fig = draw.frontier_figure(draw.labelled(result.frontier, "L"), "panel", "L",
                           "Charles & Konecny Fig. 1: Pareto frontiers (Theta_1:K, alpha = 0, GD)",
                           result.data_label, result.scale)
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig1_frontiers_gamma_and_K")
print("wrote", [p.name for p in figure_files])
