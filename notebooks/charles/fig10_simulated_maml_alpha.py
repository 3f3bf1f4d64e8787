# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: -jupytext.text_representation
#   kernelspec:
#     display_name: Python (pflkit)
#     language: python
#     name: pflkit
# ---

# %% [markdown]
# # Charles & Konecny, Fig. 10 — simulated proximal MAML frontiers (App. D.2)
#
# As Fig. 5 (L = 10, gamma = 0.001, GD, d in {5, 100}) with alpha in {0, 0.5, 1, 10}, against the
# Theta_{1:K} frontier with the same alpha. Expected: alpha shrinks the FedAvg curve but barely moves
# the MAML curves (the cusp stays at the alpha = 0 one-shot Delta).

# %% tags=["parameters"]
stage = "charles_fig10"
mu = 1.0
L_values = [10.0]
dims = [5, 100]
gamma = 0.001
alphas = [0.0, 0.5, 1.0, 10.0]
server_opts = ["gd"]
seed = 0
k_min = 1.0
k_max = 1e6
num_k = 60
device = "cpu"
threads = "auto"  # torch CPU threads; auto means $OMP_NUM_THREADS if set, else 1
results_dir = "build/smoke/charles_fig10"
figures_dir = "build/smoke/figures/charles"

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
