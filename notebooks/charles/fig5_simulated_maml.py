# %% [markdown]
# # Charles & Konecny, Fig. 5 — simulated MAML frontiers
#
# mu = 1, L = 10, alpha = 0, gamma = 0.001, Theta_K with K in [1, 1e6] beyond Lemma 4's range: for each
# K a fresh random A = b1 B^T B + b2 I (lmin = mu, lmax = L; d in {5, 100}) gives rho from cond(Q A)
# (Table 2) and Delta = (sqrt lmax(Q) - sqrt lmin(Q)) / (sqrt lmax(Q) + sqrt lmin(Q)) (Lemma 5 form).
# Compared with the analytic Theta_{1:K} (FedAvg) frontier. Expected: the d = 100 MAML curve has a cusp
# (its smallest rho) at the Delta where the FedAvg curve meets the Delta axis (one-shot averaging):
# `cusp_delta` vs `one_shot_delta` in the table, and their `abs_difference`.

# %% tags=["parameters"]
stage = "charles_fig5"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import plotting, report
from pflkit.experiments import charles
from pflkit.paths import resolve

cfg = charles.CharlesFig5Config.from_namespace(globals())
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
facet = "L_values"
groups = list(frame.groupby(facet, sort=False)) if facet != "L_values" else [(None, frame)]
fig, axes = plotting.plt.subplots(1, len(groups), figsize=(5.2 * len(groups), 4.6), squeeze=False)
for ax, (key, part) in zip(axes[0], groups):
    charles.plot_simulated(ax, part, title=None if key is None else f"{facet} = {key}")
plotting.finish(fig, plotting.title("Charles & Konecny Fig. 5: simulated MAML (Theta_K) vs FedAvg (Theta_1:K)",
                                    result.data_label, result.scale))
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig5_simulated_maml")

# %%
report.write_stage(cfg.results_dir, result.metrics, frontier=result.frame)
print("wrote", [p.name for p in figure_files], "and", cfg.results_dir)
