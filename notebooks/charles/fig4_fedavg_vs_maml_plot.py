# %% [markdown]
# # Charles & Konecny, Fig. 4 (figure) — FedAvg-style vs MAML-style frontiers
#
# Drawn from the files `fig4_fedavg_vs_maml` wrote (`results/charles_fig4/frontier.csv` under `dvc repro`,
# `build/<profile>/charles_fig4/` for a profile's run): Theta_{1:K} (FedAvg) and Theta_K (MAML) frontiers, colour
# = ServerOpt; FedAvg wide and pale, MAML dashed on top, so both show where they coincide. Nothing is computed
# here; the look comes from params.yaml's `figures` settings (a change there re-runs this notebook alone).

# %% tags=["parameters"]
stage = "charles_fig4_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what fig4_fedavg_vs_maml.ipynb wrote by default)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/charles_fig4
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
fig = draw.frontier_figure(result.frontier, None, "ServerOpt",
                           "Charles & Konecny Fig. 4: FedAvg (Theta_1:K) vs MAML (Theta_K)",
                           result.data_label, result.scale, style="method")
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig4_fedavg_vs_maml")
print("wrote", [p.name for p in figure_files])
