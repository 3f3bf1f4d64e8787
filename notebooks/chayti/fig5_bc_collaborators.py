# %% [markdown]
# # Chayti et al., Fig. 5 — BC with more collaborators: better, then saturated
#
# Bias correction on the noisy quadratic for several numbers of collaborators N with a fixed collaboration
# weight a and EMA rate b. Expected: going from N = 1 to N = 10 lowers the level BC converges to, further
# collaborators barely help — with a and b independent of N the EMA's own noise (order
# a^2 b sigma^2 (1 + 1/N) / 2) does not shrink with N; avoiding saturation needs a and b chosen per N.
# Solid: mean over runs (independent draws per curve); band: 10-90% of runs; dashed: exact expected loss;
# dotted grey: the paper-level floor a^2 b sigma^2 / 2.
#
# The parameters cell runs the small **smoke** profile (what nbval runs); `dvc repro` runs `chayti_fig5`.
#
# This notebook simulates and writes the results (`results/chayti_fig5/`); the figure is drawn from
# those files by `fig5_bc_collaborators_plot`, so a figure change never re-runs the simulation.

# %% tags=["parameters"]
stage = "chayti_fig5"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import report
from pflkit.experiments import chayti

cfg = chayti.ChaytiFig5Config.from_namespace(globals())
result = chayti.fig5_bc_collaborators(cfg)
print(result.data_label, "|", result.scale)

# %% [markdown]
# Final and tail loss per N (units of 1e-3) with the exact floor, and the claim check.
# This output is the regression reference.

# %%
# NBVAL_CHECK_OUTPUT
report.print_table(chayti.display_table(result.table))
claims = result.metrics["claims"]
print("tail loss ratio between consecutive N:",
      {k: round(v, 3) for k, v in claims["tail_ratio_between_consecutive_N"].items()})

# %%
report.write_result(cfg.results_dir, result, curves=result.curves, final=result.table)
print("wrote", cfg.results_dir)
