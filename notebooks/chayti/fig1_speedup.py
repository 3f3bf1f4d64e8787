# %% [markdown]
# # Chayti et al., Fig. 1 — speedup of weighted gradient averaging over training alone
#
# Chayti, Karimireddy, Stich, Flammarion, Jaggi, *Linear Speedup in Personalized Collaborative
# Learning*, Sec. 4. With the optimal collaboration weight a* = N / (N + 1 + N tau), WGA's speedup over
# training alone is S(N, tau) = 1 + N / (1 + N tau), where tau = mu T zeta^2 / (L sigma^2) is the
# cumulative bias (formulas restored in PAPERS.md: the scraped paper lost its math).
#
# (a) the heat map of S over the number of collaborators N and tau (log axes), with contour lines.
# (b) a simulated check: on the 1-D noisy quadratic with step size eta the stationary losses of Alone
# and WGA(a) differ exactly by the factor of the bound with tau = zeta^2 (2 - eta) / (eta sigma^2), so
# Alone's loss / WGA(a*)'s loss measures S(N, tau). Points: mean over runs with ±2 SE; lines: theory.
#
# The parameters cell runs the small **smoke** profile (what nbval runs). `dvc repro` runs the `chayti_fig1`
# section of params.yaml and writes the executed copy to reports/chayti/.
#
# This notebook simulates and writes the results (`results/chayti_fig1/`); the figure is drawn from
# those files by `fig1_speedup_plot`, so a figure change never re-runs the simulation.

# %% tags=["parameters"]
stage = "chayti_fig1"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import report
from pflkit.experiments import chayti

cfg = chayti.ChaytiFig1Config.from_namespace(globals())
result = chayti.fig1_speedup(cfg)
print(result.data_label, "|", result.scale)

# %% [markdown]
# Measured vs theoretical speedup at the check points (z = difference in standard errors).
# This table is the regression reference.

# %%
# NBVAL_CHECK_OUTPUT
report.print_table(result.table)

# %%
report.write_result(cfg.results_dir, result, check=result.table, heatmap=result.curves)
print("wrote", cfg.results_dir)
