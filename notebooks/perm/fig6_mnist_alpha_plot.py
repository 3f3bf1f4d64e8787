# %% [markdown]
# # PERM, Fig. 6 (figure) — two-stage PERM's mixing weights on MNIST
#
# Drawn from what `fig6_mnist_alpha` wrote (`results/perm_fig6/alpha.csv`, `alpha_summary.csv`): one heat
# map of alpha per partition (homogeneous vs one class per client), clients sorted by majority label, with
# each panel's mass on same-label clients and alpha's effective support in its title.

# %% tags=["parameters"]
stage = "perm_fig6_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what fig6_mnist_alpha.ipynb wrote by default)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/perm_fig6
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import plotting, report
from pflkit.figures import perm as draw
from pflkit.paths import resolve

cfg = plotting.FigureConfig.from_namespace(globals())
plotting.configure(cfg)
result = report.read_result(cfg.results_dir)
summary = result.alpha_summary.set_index("panel")
print(result.data_label, "|", result.scale)

# %%
mats = [(draw.matrix(result.alpha[result.alpha["panel"] == name], "alpha"), "alpha_i(j) (weight)",
         f"{name}\nsame-label mass {summary.loc[name, 'same_label_mass_mean']:.2f}, "
         f"support {summary.loc[name, 'effective_support_mean']:.1f}", "viridis") for name in summary.index]
fig = draw.heatmaps_figure(mats, "PERM Fig. 6: two-stage PERM mixing weights alpha", result.data_label, result.scale,
                           order_label="sorted by majority label")
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig6_mnist_alpha")
print("wrote", [p.name for p in figure_files])
