# %% [markdown]
# # Charles & Konecny, Fig. 2 — server momentum
#
# mu = 1, several L, alpha = 0, gamma = 1/(2L), Theta_{1:K} with K in [1, 1e6]; ServerOpt is gradient
# descent with no momentum, Nesterov or heavy-ball momentum (Table 2). Expected: a strict ordering
# heavy-ball < Nesterov < none, a larger benefit for larger L/mu, and a heavy-ball frontier symmetric
# about rho = Delta (the `asymmetry` column: max |Delta(rho) - rho(Delta)|, 0 for a symmetric curve).

# %% tags=["parameters"]
stage = "charles_fig2"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import plotting, report
from pflkit.experiments import charles
from pflkit.paths import resolve

cfg = charles.CharlesFig2Config.from_namespace(globals())
result = charles.fig2(cfg)
print(result.data_label, "|", result.scale)

# %% [markdown]
# Per-curve summary (rounded; the regression reference).

# %%
# NBVAL_CHECK_OUTPUT
report.print_table(result.table)

# %%
plotting.use_style()
Ls = list(dict.fromkeys(result.frame["L"]))
ncols = min(2, len(Ls))
nrows = -(-len(Ls) // ncols)
fig, axes = plotting.plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 4.4 * nrows), squeeze=False)
for ax in axes.flat[len(Ls):]:
    ax.set_visible(False)
for ax, L in zip(axes.flat, Ls):
    charles.plot_curves(ax, result.frame[result.frame["L"] == L], hue="ServerOpt", title=f"L = {L:g}")
    ax.plot([0, 1], [0, 1], color="0.6", linestyle=":", linewidth=1)
plotting.finish(fig, plotting.title("Charles & Konecny Fig. 2: server momentum (Theta_1:K, gamma = 1/(2L))",
                                    result.data_label, result.scale))
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig2_server_momentum")

# %%
report.write_stage(cfg.results_dir, result.metrics, frontier=result.frame)
print("wrote", [p.name for p in figure_files], "and", cfg.results_dir)
