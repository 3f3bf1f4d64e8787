# %% [markdown]
# # Charles & Konecny, Fig. 7 — simulated MAML frontiers for several L (App. D.1)
#
# As Fig. 5 (gamma = 0.001, alpha = 0, GD, d in {5, 100}) for L in {2, 5, 10, 100}. Expected: the MAML
# and FedAvg curves agree longer for small L/mu; the d = 100 cusp sits at each L's one-shot Delta.
#
# This notebook computes and writes the results (`results/charles_fig7/`); the figure is drawn from
# those files by `fig7_simulated_maml_L_plot`, so a figure change never recomputes.

# %% tags=["parameters"]
stage = "charles_fig7"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import report
from pflkit.experiments import charles

cfg = charles.CharlesFig7Config.from_namespace(globals())
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
