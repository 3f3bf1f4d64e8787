# %% [markdown]
# # PERM, Fig. 3 (figure) — wall-clock time of one communication round
#
# Drawn from the times `fig3_round_time` measured (`results/perm_fig3/times.csv`): one bar per method and
# workload, the mean over the timed rounds with +-1 sd. Times depend on the machine named in the title.

# %% tags=["parameters"]
stage = "perm_fig3_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what fig3_round_time.ipynb wrote by default)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/perm_fig3
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
import seaborn as sns

from pflkit import plotting, report
from pflkit.paths import resolve

cfg = plotting.FigureConfig.from_namespace(globals())
plotting.configure(cfg)
result = report.read_result(cfg.results_dir)
times, setting = result.times, result.run_info["config"]
print(result.data_label, "|", result.scale)

# %%
workloads = list(dict.fromkeys(times["workload"]))
fig, axes = plotting.plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4), squeeze=False)
for ax, workload in zip(axes[0], workloads):
    sub = times[times.workload == workload].assign(ms=lambda d: d.seconds * 1e3)
    sns.barplot(data=sub, x="method", y="ms", errorbar=plotting.band(), ax=ax)
    ax.set(xlabel="method", ylabel="time per communication round (ms)",
           title=f"{workload}, N={setting['num_clients']}")
    ax.tick_params(axis="x", rotation=20)
plotting.finish(fig, plotting.title("PERM Fig. 3: wall-clock time per round", result.data_label, result.scale))
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig3_round_time")
print("wrote", [p.name for p in figure_files])
