# %% [markdown]
# # Charles & Konecny, Fig. 13 (figure) — client learning rate, tuned server learning rate
#
# Drawn from the files `fig13_client_lr_tuned_eta` wrote (`results/charles_fig13/history.csv` and `run.json`
# under `dvc repro`, `build/<profile>/charles_fig13/` for a profile's run): training loss vs rounds of the
# tuned (gamma, eta) settings, one panel per task (titled by the dataset that ran), one line per client
# learning rate gamma. Nothing is trained here; the look comes from params.yaml's `figures` settings (a change
# there re-runs this notebook alone).

# %% tags=["parameters"]
stage = "charles_fig13_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what fig13_client_lr_tuned_eta.ipynb wrote by default)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/charles_fig13
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import plotting, report
from pflkit.figures import charles as draw
from pflkit.paths import resolve

cfg = plotting.FigureConfig.from_namespace(globals())
plotting.configure(cfg)
result = report.read_result(cfg.results_dir)
run = result.run_info["config"]  # the compute stage's config, as it ran
print(result.data_label, "|", result.scale)

# %%
fig = draw.loss_by_task_figure(result.history, draw.task_labels(result.run_info),
                               "Charles & Konecny Fig. 13: training loss, eta tuned per gamma, alpha = 0, "
                               f"Theta_1:{run['local_steps']}", result.scale)
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig13_client_lr_tuned_eta")
print("wrote", [p.name for p in figure_files])
