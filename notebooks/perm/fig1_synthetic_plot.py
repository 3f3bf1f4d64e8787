# %% [markdown]
# # PERM, Fig. 1 (figure) — personalized accuracy and loss on synthetic two-group data
#
# Drawn from the files `fig1_synthetic` wrote (`results/perm_fig1/` under `dvc repro`,
# `build/<profile>/perm_fig1/` for a profile's run): mean personalized test accuracy and loss over clients vs
# rounds, one line per method, band over seeds (on a linear axis only: the loss goes on a log axis, without band,
# when it spans more than a decade), the per-client majority-class baseline dashed. Nothing is trained here; the
# look comes from params.yaml's `figures` settings (a change there re-runs this notebook alone).

# %% tags=["parameters"]
stage = "perm_fig1_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what fig1_synthetic.ipynb wrote by default)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/perm_fig1
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import plotting, report
from pflkit.paths import resolve

cfg = plotting.FigureConfig.from_namespace(globals())
plotting.configure(cfg)
result = report.read_result(cfg.results_dir)
print(result.data_label, "|", result.scale)

# %%
fig = plotting.accuracy_loss_figure(result.history, "PERM Fig. 1: personalized accuracy and loss",
                                    result.data_label, result.scale)
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig1_synthetic")
print("wrote", [p.name for p in figure_files])
