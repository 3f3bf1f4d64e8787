# %% [markdown]
# # Charles & Konecny, Fig. 2 (figure) — server momentum
#
# Drawn from the files `fig2_server_momentum` wrote (`results/charles_fig2/frontier.csv` under `dvc repro`,
# `build/<profile>/charles_fig2/` for a profile's run): one panel per L, one frontier per ServerOpt, the
# diagonal rho = Delta dotted. Nothing is computed here; the look comes from params.yaml's `figures` settings
# (a change there re-runs this notebook alone).

# %% tags=["parameters"]
stage = "charles_fig2_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what fig2_server_momentum.ipynb wrote by default)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/charles_fig2
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
fig = draw.frontier_figure(result.frontier, "L", "ServerOpt",
                           "Charles & Konecny Fig. 2: server momentum (Theta_1:K, gamma = 1/(2L))",
                           result.data_label, result.scale, diagonal=True)
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig2_server_momentum")
print("wrote", [p.name for p in figure_files])
