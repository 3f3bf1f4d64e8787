# %% [markdown]
# # Charles & Konecny, Fig. 9 (figure) — proximal MAML-style frontiers
#
# Drawn from the files `fig9_proximal_maml` wrote (`results/charles_fig9/frontier.csv` under `dvc repro`,
# `build/<profile>/charles_fig9/` for a profile's run): one Theta_K frontier per alpha, drawn from thick to
# thin so that overlapping curves stay visible. Nothing is computed here; the look comes from params.yaml's
# `figures` settings (a change there re-runs this notebook alone).

# %% tags=["parameters"]
stage = "charles_fig9_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what fig9_proximal_maml.ipynb wrote by default)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/charles_fig9
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
fig = draw.frontier_figure(draw.labelled(result.frontier, "alpha"), None, "alpha",
                           "Charles & Konecny Fig. 9: proximal MAML (Theta_K, gamma = 1e-7, GD)",
                           result.data_label, result.scale, layered=True)
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig9_proximal_maml")
print("wrote", [p.name for p in figure_files])
