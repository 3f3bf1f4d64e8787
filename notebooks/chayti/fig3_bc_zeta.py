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

# %% tags=["parameters"]
stage = "chayti_fig3"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pathlib import Path

from pflkit import plotting, report
from pflkit.experiments import chayti
from pflkit.paths import resolve

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
plotting.use_style()
fig, ax = plotting.plt.subplots(figsize=(7.5, 4.6))
chayti.loss_axes(ax, result.curves)
ax.axhline(result.table["paper_floor"].iloc[0], color="0.4", linestyle=":", linewidth=1,
           label="a^2 b sigma^2 / 2 (paper-level floor)")
ax.legend(fontsize=7, title="solid: mean, band: 10-90% of runs, dashed: exact", title_fontsize=7)
plotting.finish(fig, plotting.title(f"Chayti Fig. 3: BC for several zeta (eta={cfg.eta}, a={cfg.a}, b={cfg.b})",
                                    result.data_label, result.scale))
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig3_bc_zeta")

# %%
report.write_stage(cfg.results_dir, result.metrics, curves=result.curves, final=result.table)
print("wrote", [str(Path(p).name) for p in figure_files], "and", cfg.results_dir)
