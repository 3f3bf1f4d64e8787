# %% [markdown]
# # Charles & Konecny, Fig. 3 — proximal client updates (FedProx)
#
# mu = 1, L = 10, Theta_{1:K}, gamma = 1/(2(L + alpha)), ServerOpt = GD, alpha in {0, 0.5, 1, 5},
# K in [1, 1e6]. Expected: each alpha > 0 frontier is a subset of the alpha = 0 frontier
# (`distance_to_alpha0_frontier` ~ 0) that stops further from rho = 0 as alpha grows.
#
# This notebook computes and writes the results (`results/charles_fig3/`); the figure is drawn from
# those files by `fig3_proximal_plot`, so a figure change never recomputes.

# %% tags=["parameters"]
stage = "charles_fig3"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import report
from pflkit.experiments import charles

cfg = charles.CharlesFig3Config.from_namespace(globals())
result = charles.fig3(cfg)
print(result.data_label, "|", result.scale)

# %% [markdown]
# Per-curve summary (rounded; the regression reference).

# %%
# NBVAL_CHECK_OUTPUT
report.print_table(result.table)

# %%
report.write_result(cfg.results_dir, result, frontier=result.frame)
print("wrote", cfg.results_dir)
