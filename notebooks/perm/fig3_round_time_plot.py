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
from pflkit import plotting, report
from pflkit.figures import perm as draw
from pflkit.paths import resolve

cfg = plotting.FigureConfig.from_namespace(globals())
plotting.configure(cfg)
result = report.read_result(cfg.results_dir)
times, setting = result.times, result.run_info["config"]
print(result.data_label, "|", result.scale)

# %%
fig = draw.round_time_figure(times, setting["num_clients"], "PERM Fig. 3: wall-clock time per round",
                             result.data_label, result.scale)
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig3_round_time")
print("wrote", [p.name for p in figure_files])
