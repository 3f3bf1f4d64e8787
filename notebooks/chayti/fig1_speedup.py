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

# %% tags=["parameters"]
stage = "chayti_fig1"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pathlib import Path

import numpy as np
import seaborn as sns
from matplotlib.colors import LogNorm

from pflkit import plotting, report
from pflkit.experiments import chayti
from pflkit.paths import resolve
from pflkit.theory import speedup as theory

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
plotting.use_style()
fig, (ax_map, ax_check) = plotting.plt.subplots(1, 2, figsize=(12, 4.6))
n_grid, tau_grid, speedup = result.extra["n_grid"], result.extra["tau_grid"], result.extra["speedup"]
mesh = ax_map.pcolormesh(tau_grid, n_grid, speedup, norm=LogNorm(vmin=1, vmax=speedup.max()), shading="auto",
                         cmap="viridis", rasterized=True)
levels = [lv for lv in (1.1, 2, 5, 10, 50, 100, 500) if lv < speedup.max()]
contours = ax_map.contour(tau_grid, n_grid, speedup, levels=levels, colors="white", linewidths=0.8)
ax_map.clabel(contours, fmt="%g", fontsize=8)
ax_map.set(xscale="log", yscale="log", xlabel="cumulative bias tau = mu T zeta^2 / (L sigma^2)",
           ylabel="number of collaborators N")
fig.colorbar(mesh, ax=ax_map, label="speedup S(N, tau) over training alone")
ax_map.set_title("(a) S(N, tau) = 1 + N / (1 + N tau)")

taus = np.logspace(np.log10(min(cfg.check_tau)) - 1, np.log10(max(cfg.check_tau)) + 1, 200)
palette = sns.color_palette("colorblind", len(cfg.check_n))
for color, n in zip(palette, cfg.check_n):
    ax_check.plot(taus, theory.wga_speedup(n, taus), color=color, label=f"N={n}: theory")
    sub = result.table[result.table["N"] == n]
    ax_check.errorbar(sub["tau"], sub["speedup_measured"], yerr=2 * sub["speedup_se"], fmt="o", color=color,
                      capsize=3, label=f"N={n}: simulated WGA(a*) (±2 SE)")
ax_check.set(xscale="log", yscale="log", xlabel="cumulative bias tau",
             ylabel="speedup (Alone loss / WGA(a*) loss)")
ax_check.set_title(f"(b) simulated check, eta={cfg.check_eta}, {cfg.check_runs} runs per point")
ax_check.legend(fontsize=7)
plotting.finish(fig, plotting.title("Chayti Fig. 1: WGA speedup over training alone", result.data_label,
                                    result.scale))
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig1_speedup")

# %%
report.write_stage(cfg.results_dir, result.metrics, check=result.table,
                   heatmap=result.curves)
print("wrote", [str(Path(p).name) for p in figure_files], "and", cfg.results_dir)
