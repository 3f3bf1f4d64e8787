# %% [markdown]
# # PERM, Theorem 1 (figure) — the estimated mixing weights approach the optimal ones
#
# Drawn from what `alpha_convergence` wrote (`convergence.csv`, `own_group_mass.csv`): left, ||w^R - w*||
# and the mean ||alpha_hat_i - alpha*_i||_1 against the FedAvg rounds R (log-log, band over seeds); right,
# how much of each client's alpha lies inside its own group at the last checkpoint.

# %% tags=["parameters"]
stage = "perm_alpha_convergence_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what alpha_convergence.ipynb wrote by default)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
import seaborn as sns

from pflkit import plotting, report
from pflkit.paths import resolve

cfg = plotting.FigureConfig.from_namespace(globals())
plotting.configure(cfg)
result = report.read_result(cfg.results_dir)
table, shares = result.convergence, result.own_group_mass
print(result.data_label, "|", result.scale)

# %%
fig, (ax_err, ax_own) = plotting.plt.subplots(1, 2, figsize=(11, 4))
long = table[table.R > 0].melt(id_vars=["seed", "R"], value_vars=["w_error", "alpha_error_l1"],
                               var_name="quantity", value_name="error")
long["quantity"] = long["quantity"].map({"w_error": "||w^R - w*||_2",
                                         "alpha_error_l1": "mean_i ||alpha_i - alpha*_i||_1"})
sns.lineplot(data=long, x="R", y="error", hue="quantity", marker="o", errorbar=plotting.band(), ax=ax_err)
ax_err.set(xscale="log", yscale="log", xlabel="FedAvg rounds R (exact, K = 1)", ylabel="distance to the optimum (log)")
sns.histplot(data=shares, x="own_group_mass", hue="group", bins=20, binrange=(0, 1), multiple="stack", ax=ax_own)
ax_own.set(xlabel=f"share of alpha_i inside client i's own group (R = {result.metrics['final_R']})",
           ylabel="clients (count)")
plotting.finish(fig, plotting.title("PERM Theorem 1: alpha_hat -> alpha* as w^R -> w*", result.data_label,
                                    result.scale))
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "alpha_convergence")
print("wrote", [p.name for p in figure_files])
