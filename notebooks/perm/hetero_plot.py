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
import seaborn as sns

from pflkit import plotting, report
from pflkit.paths import resolve

cfg = plotting.FigureConfig.from_namespace(globals())
plotting.configure(cfg)
result = report.read_result(cfg.results_dir)
print(result.data_label, "|", result.scale)

# %%
fig, (ax_acc, ax_cost) = plotting.plt.subplots(1, 2, figsize=(13, 5))
names = list(dict.fromkeys(result.costs["method"]))  # the methods, in the stage's order
palette = plotting.method_palette(names + ["Majority class"])
budget_order = sorted(set(result.clients["budget"]), reverse=True)
per_seed = result.clients.groupby(["method", "budget", "seed"], as_index=False)["accuracy"].mean()
sns.barplot(data=per_seed, x="budget", y="accuracy", hue="method", hue_order=names + ["Majority class"],
            palette=palette, errorbar=plotting.band(), ax=ax_acc, order=budget_order)
ax_acc.set_xlabel("client budget r (width fraction of the server MLP)")
ax_acc.set_ylabel("personalized test accuracy (fraction correct)")
ax_acc.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
sns.barplot(data=result.costs, x="budget", y="train_mflops_per_round", hue="method", hue_order=names,
            palette=palette, ax=ax_cost, order=budget_order)
ax_cost.set_yscale("log")
ax_cost.set_xlabel("client budget r (width fraction of the server MLP)")
ax_cost.set_ylabel("training compute per client per round (MFLOPs)")
ax_cost.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
plotting.finish(fig, plotting.title("PERM-hetero (Sec. 3.3): personalized accuracy and cost per budget group",
                                    result.data_label, result.scale))
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "hetero")
print("wrote", [p.name for p in figure_files])
