# %% [markdown]
# # Charles & Konecny, Fig. 5 — simulated MAML frontiers
#
# mu = 1, L = 10, alpha = 0, gamma = 0.001, Theta_K with K in [1, 1e6] beyond Lemma 4's range: for each
# K a fresh random A = b1 B^T B + b2 I (lmin = mu, lmax = L; d in {5, 100}) gives rho from cond(Q A)
# (Table 2) and Delta = (sqrt lmax(Q) - sqrt lmin(Q)) / (sqrt lmax(Q) + sqrt lmin(Q)) (Lemma 5 form).
# Compared with the analytic Theta_{1:K} (FedAvg) frontier. Expected: the d = 100 MAML curve has a cusp
# (its smallest rho) at the Delta where the FedAvg curve meets the Delta axis (one-shot averaging):
# `cusp_delta` vs `one_shot_delta` in the table, and their `abs_difference`.
#
# This notebook computes and writes the results (`results/charles_fig5/`); the figure is drawn from
# those files by `fig5_simulated_maml_plot`, so a figure change never recomputes.

# %% tags=["parameters"]
stage = "charles_fig5"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import report
from pflkit.experiments import charles

cfg = charles.CharlesFig5Config.from_namespace(globals())
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
