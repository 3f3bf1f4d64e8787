# %% [markdown]
# # Charles & Konecny, Figs. 6 and 11 (figures) — server momentum and alpha on FEMNIST (tuned learning rates)
#
# Drawn from the files `fig6_server_momentum_and_alpha_femnist` wrote (`results/charles_fig6/history.csv` and
# `run.json` under `dvc repro`, `build/<profile>/charles_fig6/` for a profile's run): the tuned curves' test
# accuracy vs rounds, (left) server momentum with alpha = 0, (right) no momentum and varying alpha (Fig. 6);
# Fig. 11 adds their test loss below. Nothing is trained here; the look comes from params.yaml's `figures`
# settings (a change there re-runs this notebook alone).

# %% tags=["parameters"]
stage = "charles_fig6_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what fig6_server_momentum_and_alpha_femnist.ipynb wrote)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/charles_fig6
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
fig = draw.fig6_figure(result.history, f"Charles & Konecny Fig. 6: LocalUpdate Theta_1:{run['local_steps']}, "
                       "tuned gamma and eta", result.data_label, result.scale)
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig6_server_momentum_and_alpha_femnist")

# %%
fig = draw.fig11_figure(result.history, "Charles & Konecny Fig. 11 (re-plot of Fig. 6 with test loss)",
                        result.data_label, result.scale)
figure_files += plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig11_server_momentum_and_alpha_femnist")
print("wrote", [p.name for p in figure_files])
