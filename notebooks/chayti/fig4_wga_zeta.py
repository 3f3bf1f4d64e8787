# %% [markdown]
# # Chayti et al., Fig. 4 — WGA's loss floor grows like zeta^2
#
# Weighted gradient averaging (Alg. 2: g_t = (1 - a) g_0 + a g_avg) on the noisy quadratic for several
# zeta, fixed eta and a. Expected: the level WGA converges to grows like zeta^2 — WGA can only converge up
# to a^2 zeta^2 / (2 mu) (its fixed point is x = a zeta), so only a = 0 (training alone) removes the bias.
# Solid: mean over runs (independent draws per curve); band: 10-90% of runs; dashed: exact expected loss;
# dotted: the floor a^2 zeta^2 / (2 mu) for each zeta (mu = 1).
#
# The parameters cell runs the small **smoke** profile (what nbval runs); `dvc repro` runs `chayti_fig4`.
#
# This notebook simulates and writes the results (`results/chayti_fig4/`); the figure is drawn from
# those files by `fig4_wga_zeta_plot`, so a figure change never re-runs the simulation.

# %% tags=["parameters"]
stage = "chayti_fig4"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import report
from pflkit.experiments import chayti

cfg = chayti.ChaytiFig4Config.from_namespace(globals())
result = chayti.fig4_wga_heterogeneity(cfg)
print(result.data_label, "|", result.scale)

# %% [markdown]
# Final and tail loss per zeta (units of 1e-3) with the exact floor, and the claim check.
# This output is the regression reference.

# %%
# NBVAL_CHECK_OUTPUT
report.print_table(chayti.display_table(result.table))
claims = result.metrics["claims"]
print("log-log slope of the tail loss vs zeta (bias-dominated zetas):",
      claims["loglog_slope_tail_vs_zeta_bias_dominated"])
print("tail loss / (a^2 zeta^2 / 2):", {k: round(v, 3) for k, v in claims["tail_over_paper_floor"].items()})

# %%
report.write_result(cfg.results_dir, result, curves=result.curves, final=result.table)
print("wrote", cfg.results_dir)
