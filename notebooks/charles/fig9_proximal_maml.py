# %% [markdown]
# # Charles & Konecny, Fig. 9 — proximal MAML-style frontiers (App. D.2)
#
# mu = 1, L = 10, gamma = 1e-7, Theta_K with K in [1, 1e6] (kept inside gamma < 1/(KL + alpha)),
# ServerOpt = GD, several alpha (the paper does not list them; params.yaml uses Fig. 3's). Expected:
# alpha changes how much of the frontier is traversed, not its shape (curves overlap).
#
# This notebook computes and writes the results (`results/charles_fig9/`); the figure is drawn from
# those files by `fig9_proximal_maml_plot`, so a figure change never recomputes.

# %% tags=["parameters"]
stage = "charles_fig9"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import report
from pflkit.experiments import charles

cfg = charles.CharlesFig9Config.from_namespace(globals())
result = charles.fig9(cfg)
print(result.data_label, "|", result.scale)

# %% [markdown]
# Per-curve summary (rounded; the regression reference).

# %%
# NBVAL_CHECK_OUTPUT
report.print_table(result.table)

# %%
report.write_result(cfg.results_dir, result, frontier=result.frame)
print("wrote", cfg.results_dir)
