# %% [markdown]
# # Charles & Konecny, Fig. 8 (figure) — simulated MAML frontiers with server momentum
#
# Drawn from the files `fig8_simulated_maml_momentum` wrote (`results/charles_fig8/frontier.csv` under
# `dvc repro`, `build/<profile>/charles_fig8/` for a profile's run): the simulated Theta_K (MAML) points, one
# colour per dimension d, one panel per ServerOpt, over the analytic Theta_{1:K} (FedAvg) frontier (black).
# Nothing is computed here; the look comes from params.yaml's `figures` settings (a change there re-runs this
# notebook alone).

# %% tags=["parameters"]
stage = "charles_fig8_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what fig8_simulated_maml_momentum.ipynb wrote by default)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/charles_fig8
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
fig = draw.simulated_figure(result.frontier, "ServerOpt",
                           "Charles & Konecny Fig. 8: simulated MAML (Theta_K) vs FedAvg (Theta_1:K)",
                           result.data_label, result.scale)
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig8_simulated_maml_momentum")
print("wrote", [p.name for p in figure_files])
