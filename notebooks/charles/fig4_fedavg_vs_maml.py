# %% [markdown]
# # Charles & Konecny, Fig. 4 — FedAvg-style vs MAML-style frontiers
#
# mu = 1, L = 10, alpha = 0: Theta_{1:K} with gamma = 0.001 (bound 11) and Theta_K with
# gamma = 1/(2LK) (bound 13, inside Lemma 4's range), K in [1, 1e6], three ServerOpts. Expected: the
# Theta_K frontier is a subset of the Theta_{1:K} frontier (`maml_distance_to_fedavg` ~ 0).
#
# This notebook computes and writes the results (`results/charles_fig4/`); the figure is drawn from
# those files by `fig4_fedavg_vs_maml_plot`, so a figure change never recomputes.

# %% tags=["parameters"]
stage = "charles_fig4"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import report
from pflkit.experiments import charles

cfg = charles.CharlesFig4Config.from_namespace(globals())
result = charles.fig4(cfg)
print(result.data_label, "|", result.scale)

# %% [markdown]
# Per-curve summary (rounded; the regression reference).

# %%
# NBVAL_CHECK_OUTPUT
report.print_table(result.table)

# %%
report.write_result(cfg.results_dir, result, frontier=result.frame)
print("wrote", cfg.results_dir)
