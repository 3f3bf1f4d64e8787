# %% [markdown]
# # Chayti et al., Fig. 3 — bias correction (BC) is insensitive to the heterogeneity zeta
#
# BC (Alg. 3: g_t = (1 - a) g_0 + a (g_avg - c_t), EMA bias estimate c_{t+1} = (1 - b) c_t + b (g_avg - g_0))
# on the noisy quadratic for several zeta (the collaborators' optimum), fixed eta, a, b. Expected: every
# curve ends at the same level (BC's floor does not depend on zeta); larger zeta only takes longer, and
# while the bias estimate is still poor the loss first rises (x is pulled towards a * zeta).
# Solid: mean over runs (independent draws per curve); band: 10-90% of runs; dashed: exact expected loss;
# dotted grey: the paper-level floor a^2 b sigma^2 / 2 (an order of magnitude, not exact).
#
# The parameters cell runs the small **smoke** profile (what nbval runs); `dvc repro` runs `chayti_fig3`.
#
# This notebook simulates and writes the results (`results/chayti_fig3/`); the figure is drawn from
# those files by `fig3_bc_zeta_plot`, so a figure change never re-runs the simulation.

# %% tags=["parameters"]
stage = "chayti_fig3"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import report
from pflkit.experiments import chayti

cfg = chayti.ChaytiFig3Config.from_namespace(globals())
result = chayti.fig3_bc_heterogeneity(cfg)
print(result.data_label, "|", result.scale)

# %% [markdown]
# Final and tail loss per zeta (units of 1e-3) with the exact floor, and the claim check.
# This output is the regression reference.

# %%
# NBVAL_CHECK_OUTPUT
report.print_table(chayti.display_table(result.table))
claims = result.metrics["claims"]
print("largest pairwise difference of tail losses:", claims["max_pairwise_tail_difference_in_se"], "SE")
print("steps until the mean loss stays below 2x the floor:", claims["steps_to_2x_floor"])

# %%
report.write_result(cfg.results_dir, result, curves=result.curves, final=result.table)
print("wrote", cfg.results_dir)
