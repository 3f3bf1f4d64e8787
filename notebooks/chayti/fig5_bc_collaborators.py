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

# %% tags=["parameters"]
stage = "chayti_fig5"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pathlib import Path

from pflkit import plotting, report
from pflkit.experiments import chayti
from pflkit.paths import resolve

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
plotting.use_style()
fig, ax = plotting.plt.subplots(figsize=(7.5, 4.6))
chayti.loss_axes(ax, result.curves)
ax.axhline(result.table["paper_floor"].iloc[0], color="0.4", linestyle=":", linewidth=1,
           label="a^2 b sigma^2 / 2 (paper-level floor)")
ax.legend(fontsize=7, title="solid: mean, band: 10-90% of runs, dashed: exact", title_fontsize=7)
plotting.finish(fig, plotting.title(f"Chayti Fig. 5: BC for several N (eta={cfg.eta}, a={cfg.a}, b={cfg.b})",
                                    result.data_label, result.scale))
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig5_bc_collaborators")

# %%
report.write_stage(cfg.results_dir, result.metrics, curves=result.curves, final=result.table)
print("wrote", [str(Path(p).name) for p in figure_files], "and", cfg.results_dir)
