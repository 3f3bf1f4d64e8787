# %% [markdown]
# # PERM, Theorem 1 (figure) — the estimated mixing weights approach the optimal ones
#
# Drawn from what `alpha_convergence` wrote (`convergence.csv`, `own_group_mass.csv`): left, ||w^R - w*|| and the
# mean ||alpha_hat_i - alpha*_i||_1 against the FedAvg rounds R (log-log: the mean over seeds, each seed a thin
# line; no +-sd band on a log axis); right, how much of each client's alpha lies inside its own group at the last
# checkpoint.

# %% tags=["parameters"]
stage = "perm_alpha_convergence_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what alpha_convergence.ipynb wrote by default)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import plotting, report
from pflkit.figures import perm as draw
from pflkit.paths import resolve

cfg = plotting.FigureConfig.from_namespace(globals())
plotting.configure(cfg)
result = report.read_result(cfg.results_dir)
table, shares = result.convergence, result.own_group_mass
print(result.data_label, "|", result.scale)

# %%
fig = draw.alpha_convergence_figure(table, shares, result.metrics["final_R"],
                                    "PERM Theorem 1: alpha_hat -> alpha* as w^R -> w*", result.data_label,
                                    result.scale)
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "alpha_convergence")
print("wrote", [p.name for p in figure_files])
