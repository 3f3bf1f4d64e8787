# %% [markdown]
# # PERM with heterogeneous client models (figure) — accuracy and cost per budget group
#
# Drawn from what `hetero` wrote (`clients.csv`, `costs.csv`): left, the personalized test accuracy of each
# budget group r (mean over the group's clients, bar = mean over seeds with its band); right, the training
# compute per client per round (log scale), from the cost formulas in the `hetero` notebook.

# %% tags=["parameters"]
stage = "perm_hetero_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what hetero.ipynb wrote by default)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/perm_hetero
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
fig = draw.hetero_figure(result.clients, result.costs,
                        "PERM-hetero (Sec. 3.3): personalized accuracy and cost per budget group",
                        result.data_label, result.scale)
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "hetero")
print("wrote", [p.name for p in figure_files])
