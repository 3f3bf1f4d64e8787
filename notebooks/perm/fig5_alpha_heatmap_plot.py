# %% [markdown]
# # PERM, Fig. 5 (figure) — the learned mixing weights of the Fig. 4 run
#
# Drawn from `results/perm_fig5/alpha.csv` (what `fig5_alpha_heatmap` wrote): left, alpha (row i = client
# i's weights over all clients); right, the overlap of the clients' label distributions for reference.
# Clients are ordered by majority label, so clients with similar labels sit together.

# %% tags=["parameters"]
stage = "perm_fig5_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what fig5_alpha_heatmap.ipynb wrote by default)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/perm_fig5
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import plotting, report
from pflkit.figures import perm as draw
from pflkit.paths import resolve

cfg = plotting.FigureConfig.from_namespace(globals())
plotting.configure(cfg)
result = report.read_result(cfg.results_dir)
print(result.data_label, "|", result.scale)

# %%
fig = draw.heatmaps_figure([(draw.matrix(result.alpha, "alpha"), "alpha_i(j) (weight)", "learned alpha", "viridis"),
                            (draw.matrix(result.alpha, "overlap"), "label-distribution overlap p_i . p_j",
                             "label overlap (for reference)", "mako")],
                           "PERM Fig. 5: mixing weights of the Fig. 4 run", result.data_label, result.scale)
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig5_alpha_heatmap")
print("wrote", [p.name for p in figure_files])
