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
fig, ax = plotting.plt.subplots(figsize=(5.5, 4.5))
frame = draw.labelled(result.frontier, "alpha")
widths = {a: w for a, w in zip(frame["alpha"].unique(), [6, 4, 2.5, 1])}
for a, part in frame.groupby("alpha", sort=False):
    ax.plot(part["rho"], part["delta"], linewidth=widths[a], label=a)
ax.legend(fontsize=8)
draw.frontier_axes(ax)
plotting.finish(fig, plotting.title("Charles & Konecny Fig. 9: proximal MAML (Theta_K, gamma = 1e-7, GD)",
                                    result.data_label, result.scale))
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig9_proximal_maml")
print("wrote", [p.name for p in figure_files])
