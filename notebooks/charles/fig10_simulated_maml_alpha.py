# %% [markdown]
# # Charles & Konecny, Fig. 10 — simulated proximal MAML frontiers (App. D.2)
#
# As Fig. 5 (L = 10, gamma = 0.001, GD, d in {5, 100}) with alpha in {0, 0.5, 1, 10}, against the
# Theta_{1:K} frontier with the same alpha. Expected: alpha shrinks the FedAvg curve but barely moves
# the MAML curves (the cusp stays at the alpha = 0 one-shot Delta).
#
# This notebook computes and writes the results (`results/charles_fig10/`); the figure is drawn from
# those files by `fig10_simulated_maml_alpha_plot`, so a figure change never recomputes.

# %% tags=["parameters"]
stage = "charles_fig10"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import report
from pflkit.experiments import charles

cfg = charles.CharlesFig10Config.from_namespace(globals())
result = charles.simulated(cfg)
print(result.data_label, "|", result.scale)

# %% [markdown]
# Per-curve summary (rounded; the regression reference).

# %%
# NBVAL_CHECK_OUTPUT
report.print_table(result.table)

# %%
report.write_result(cfg.results_dir, result, frontier=result.frame)
print("wrote", cfg.results_dir)
