# %% [markdown]
# # PERM and FedAvg on Flower (figure): every engine against the batched in-process engine
#
# Drawn from what `equivalence` wrote (`history.csv`, `differences.csv`): left, the personalized test accuracy
# per round of each method (its colour) on each engine (its line and marker); right, every engine's accuracy
# minus in-process (symlog), with the band of the 1e-4 bar.

# %% tags=["parameters"]
stage = "flower_equivalence_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what equivalence.ipynb wrote by default)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import plotting, report
from pflkit.figures import flower as draw
from pflkit.paths import resolve

cfg = plotting.FigureConfig.from_namespace(globals())
plotting.configure(cfg)
result = report.read_result(cfg.results_dir)
print(result.data_label, "|", result.scale)

# %%
fig = draw.figure(result.history, result.differences, result.metrics["tolerance"], result.data_label, result.scale)
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "equivalence")
print("wrote", [p.name for p in figure_files])
