# %% [markdown]
# # Charles & Konecny, Fig. 10 — simulated proximal MAML frontiers (App. D.2)
#
# As Fig. 5 (L = 10, gamma = 0.001, GD, d in {5, 100}) with alpha in {0, 0.5, 1, 10}, against the
# Theta_{1:K} frontier with the same alpha. Expected: alpha shrinks the FedAvg curve but barely moves
# the MAML curves (the cusp stays at the alpha = 0 one-shot Delta).

# %% tags=["parameters"]
stage = "charles_fig10"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import plotting, report
from pflkit.experiments import charles
from pflkit.paths import resolve

cfg = charles.CharlesFig10Config.from_namespace(globals())
result = charles.simulated(cfg)
print(result.data_label, "|", result.scale)

# %% [markdown]
# Per-curve summary (rounded; the regression reference).

# %%
# NBVAL_CHECK_OUTPUT
report.print_table(result.table)

# %%
plotting.use_style()
frame = result.frame
facet = "alpha"
groups = list(frame.groupby(facet, sort=False)) if facet != "L_values" else [(None, frame)]
fig, axes = plotting.plt.subplots(1, len(groups), figsize=(5.2 * len(groups), 4.6), squeeze=False)
for ax, (key, part) in zip(axes[0], groups):
    charles.plot_simulated(ax, part, title=None if key is None else f"{facet} = {key}")
plotting.finish(fig, plotting.title("Charles & Konecny Fig. 10: simulated MAML (Theta_K) vs FedAvg (Theta_1:K)",
                                    result.data_label, result.scale))
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig10_simulated_maml_alpha")

# %%
report.write_stage(cfg.results_dir, result.metrics, frontier=result.frame)
print("wrote", [p.name for p in figure_files], "and", cfg.results_dir)
