# %% [markdown]
# # Charles & Konecny, Fig. 9 — proximal MAML-style frontiers (App. D.2)
#
# mu = 1, L = 10, gamma = 1e-7, Theta_K with K in [1, 1e6] (kept inside gamma < 1/(KL + alpha)),
# ServerOpt = GD, several alpha (the paper does not list them; params.yaml uses Fig. 3's). Expected:
# alpha changes how much of the frontier is traversed, not its shape (curves overlap).

# %% tags=["parameters"]
stage = "charles_fig9"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import plotting, report
from pflkit.experiments import charles
from pflkit.paths import resolve

cfg = charles.CharlesFig9Config.from_namespace(globals())
result = charles.fig9(cfg)
print(result.data_label, "|", result.scale)

# %% [markdown]
# Per-curve summary (rounded; the regression reference).

# %%
# NBVAL_CHECK_OUTPUT
report.print_table(result.table)

# %%
plotting.use_style()
fig, ax = plotting.plt.subplots(figsize=(5.5, 4.5))
frame = result.frame.assign(alpha=result.frame["alpha"].map("alpha = {:g}".format))
widths = {a: w for a, w in zip(frame["alpha"].unique(), [6, 4, 2.5, 1])}
for a, part in frame.groupby("alpha", sort=False):
    ax.plot(part["rho"], part["delta"], linewidth=widths[a], label=a)
ax.legend(fontsize=8)
charles.frontier_axes(ax)
plotting.finish(fig, plotting.title("Charles & Konecny Fig. 9: proximal MAML (Theta_K, gamma = 1e-7, GD)",
                                    result.data_label, result.scale))
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig9_proximal_maml")

# %%
report.write_stage(cfg.results_dir, result.metrics, frontier=result.frame)
print("wrote", [p.name for p in figure_files], "and", cfg.results_dir)
