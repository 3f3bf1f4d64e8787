# %% [markdown]
# # Charles & Konecny, Fig. 3 (figure) — proximal client updates (FedProx)
#
# Drawn from the files `fig3_proximal` wrote (`results/charles_fig3/frontier.csv` under `dvc repro`,
# `build/<profile>/charles_fig3/` for a profile's run): one frontier per proximal strength alpha, drawn from wide
# to narrow (as the paper's Fig. 9) so coinciding frontiers all show. Nothing is computed here; the look comes
# from params.yaml's `figures` settings (a change there re-runs this notebook alone).

# %% tags=["parameters"]
stage = "charles_fig3_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what fig3_proximal.ipynb wrote by default)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/charles_fig3
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
                           "Charles & Konecny Fig. 3: proximal updates (Theta_1:K, GD)",
                           result.data_label, result.scale, layered=True)
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig3_proximal")
print("wrote", [p.name for p in figure_files])
