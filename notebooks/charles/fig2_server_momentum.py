# %% [markdown]
# # Charles & Konecny, Fig. 2 — server momentum
#
# mu = 1, several L, alpha = 0, gamma = 1/(2L), Theta_{1:K} with K in [1, 1e6]; ServerOpt is gradient
# descent with no momentum, Nesterov or heavy-ball momentum (Table 2). Expected: a strict ordering
# heavy-ball < Nesterov < none, a larger benefit for larger L/mu, and a heavy-ball frontier symmetric
# about rho = Delta (the `asymmetry` column: max |Delta(rho) - rho(Delta)|, 0 for a symmetric curve).
#
# This notebook computes and writes the results (`results/charles_fig2/`); the figure is drawn from
# those files by `fig2_server_momentum_plot`, so a figure change never recomputes.

# %% tags=["parameters"]
stage = "charles_fig2"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import report
from pflkit.experiments import charles

cfg = charles.CharlesFig2Config.from_namespace(globals())
result = charles.fig2(cfg)
print(result.data_label, "|", result.scale)

# %% [markdown]
# Per-curve summary (rounded; the regression reference).

# %%
# NBVAL_CHECK_OUTPUT
report.print_table(result.table)

# %%
report.write_result(cfg.results_dir, result, frontier=result.frame)
print("wrote", cfg.results_dir)
