# %% [markdown]
# # Charles & Konecny, Fig. 1 — Pareto frontiers as gamma or K varies
#
# *Convergence and Accuracy Trade-Offs in Federated Learning and Meta-Learning*, Sec. 5, Fig. 1.
# mu = 1, alpha = 0, Theta_{1:K}, ServerOpt = gradient descent, L in {5, 50}. Left: gamma = 0.01 and K
# varies in [1, 1e6]; right: K = 100 and gamma varies in (0, 1/L). Each point is (rho, Delta) from the
# kappa bound (11), Table 2 and eq. (17) (`pflkit.theory.surrogate.frontier`).
#
# The parameters cell runs the `smoke` profile (a small grid); `dvc repro` runs the `charles_fig1` section
# of params.yaml.
#
# This notebook computes and writes the results (`results/charles_fig1/`); the figure is drawn from
# those files by `fig1_frontiers_gamma_and_K_plot`, so a figure change never recomputes.

# %% tags=["parameters"]
stage = "charles_fig1"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import report
from pflkit.experiments import charles

cfg = charles.CharlesFig1Config.from_namespace(globals())
result = charles.fig1(cfg)
print(result.data_label, "|", result.scale)

# %% [markdown]
# Per-curve summary (rounded; the regression reference).

# %%
# NBVAL_CHECK_OUTPUT
report.print_table(result.table)

# %%
report.write_result(cfg.results_dir, result, frontier=result.frame)
print("wrote", cfg.results_dir)
