# %% [markdown]
# # Charles & Konecny, Fig. 4 — FedAvg-style vs MAML-style frontiers
#
# mu = 1, L = 10, alpha = 0: Theta_{1:K} with gamma = 0.001 (bound 11) and Theta_K with
# gamma = 1/(2LK) (bound 13, inside Lemma 4's range), K in [1, 1e6], three ServerOpts. Expected: the
# Theta_K frontier is a subset of the Theta_{1:K} frontier (`maml_distance_to_fedavg` ~ 0).

# %% tags=["parameters"]
stage = "charles_fig4"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import plotting, report
from pflkit.experiments import charles
from pflkit.paths import resolve

cfg = charles.CharlesFig4Config.from_namespace(globals())
result = charles.fig4(cfg)
print(result.data_label, "|", result.scale)

# %% [markdown]
# Per-curve summary (rounded; the regression reference).

# %%
# NBVAL_CHECK_OUTPUT
report.print_table(result.table)

# %%
plotting.use_style()
fig, ax = plotting.plt.subplots(figsize=(6.5, 5))
charles.plot_curves(ax, result.frame, hue="ServerOpt", style="method")
plotting.finish(fig, plotting.title("Charles & Konecny Fig. 4: FedAvg (Theta_1:K) vs MAML (Theta_K)",
                                    result.data_label, result.scale))
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig4_fedavg_vs_maml")

# %%
report.write_stage(cfg.results_dir, result.metrics, frontier=result.frame)
print("wrote", [p.name for p in figure_files], "and", cfg.results_dir)
