# %% [markdown]
# # Charles & Konecny, Fig. 7 — simulated MAML frontiers for several L (App. D.1)
#
# As Fig. 5 (gamma = 0.001, alpha = 0, GD, d in {5, 100}) for L in {2, 5, 10, 100}. Expected: the MAML
# and FedAvg curves agree longer for small L/mu; the d = 100 cusp sits at each L's one-shot Delta.

# %% tags=["parameters"]
stage = "charles_fig7"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import plotting, report
from pflkit.experiments import charles
from pflkit.paths import resolve

cfg = charles.CharlesFig7Config.from_namespace(globals())
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
facet = "L"
groups = list(frame.groupby(facet, sort=False)) if facet != "L_values" else [(None, frame)]
fig, axes = plotting.plt.subplots(1, len(groups), figsize=(5.2 * len(groups), 4.6), squeeze=False)
for ax, (key, part) in zip(axes[0], groups):
    charles.plot_simulated(ax, part, title=None if key is None else f"{facet} = {key}")
plotting.finish(fig, plotting.title("Charles & Konecny Fig. 7: simulated MAML (Theta_K) vs FedAvg (Theta_1:K)",
                                    result.data_label, result.scale))
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig7_simulated_maml_L")

# %%
report.write_stage(cfg.results_dir, result.metrics, frontier=result.frame)
print("wrote", [p.name for p in figure_files], "and", cfg.results_dir)
