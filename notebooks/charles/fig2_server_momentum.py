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
# # Charles & Konecny, Fig. 2 — server momentum
#
# mu = 1, several L, alpha = 0, gamma = 1/(2L), Theta_{1:K} with K in [1, 1e6]; ServerOpt is gradient
# descent with no momentum, Nesterov or heavy-ball momentum (Table 2). Expected: a strict ordering
# heavy-ball < Nesterov < none, a larger benefit for larger L/mu, and a heavy-ball frontier symmetric
# about rho = Delta (the `asymmetry` column: max |Delta(rho) - rho(Delta)|, 0 for a symmetric curve).

# %% tags=["parameters"]
stage = "charles_fig2"
mu = 1.0
L_values = [2.0, 10.0, 100.0]
gamma_factor = 0.5
server_opts = ["gd", "nesterov", "heavy_ball"]
k_min = 1.0
k_max = 1e6
num_k = 40
device = "cpu"
threads = "auto"  # torch CPU threads; auto means $OMP_NUM_THREADS if set, else 1
results_dir = "build/smoke/charles_fig2"
figures_dir = "build/smoke/figures/charles"

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
