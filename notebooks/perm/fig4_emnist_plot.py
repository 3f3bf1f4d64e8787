# %% [markdown]
# # PERM, Fig. 4 (figure) — EMNIST (MLP 2 x 200): personalized accuracy and loss
#
# Drawn from the files `fig4_emnist` wrote (`results/perm_fig4/` under `dvc repro`, `build/<profile>/perm_fig4/`
# for a profile's run): mean personalized test accuracy and loss over clients vs rounds, one line per method, band
# over seeds, the per-client majority-class baseline dashed. Under the panels, why PERM ends where it does, from
# metrics.json (`largest_step`, `alpha_zero_fraction`: under Alg. 1's shuffle a visit moves model i by eta *
# alpha_ij * N) and the other methods' step sizes. The title names the dataset that actually ran (a substitute is
# named as such) and the scale. Nothing is trained here; the look comes from params.yaml's `figures` settings (a
# change there re-runs this notebook alone).

# %% tags=["parameters"]
stage = "perm_fig4_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what fig4_emnist.ipynb wrote by default)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/perm_fig4
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import plotting, report
from pflkit.figures import perm as draw
from pflkit.paths import resolve

cfg = plotting.FigureConfig.from_namespace(globals())
plotting.configure(cfg)
result = report.read_result(cfg.results_dir)
run = result.run_info["config"]  # the compute stage's config, as it ran
print(result.data_label, "|", result.scale)

# %%
fig = plotting.accuracy_loss_figure(result.history, "PERM Fig. 4: personalized accuracy and loss", result.data_label,
                                    result.scale, notes=draw.alpha_diagnostics(result.metrics, run["lr"]))
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig4_emnist")
print("wrote", [p.name for p in figure_files])
