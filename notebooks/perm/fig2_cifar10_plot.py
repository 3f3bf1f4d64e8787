# %% [markdown]
# # PERM, Fig. 2 (figure) — CIFAR-10 (2 classes per client, CNN): personalized accuracy and loss
#
# Drawn from the files `fig2_cifar10` wrote (`results/perm_fig2/` under `dvc repro`, `build/<profile>/perm_fig2/`
# for a profile's run): mean personalized test accuracy and loss over clients vs rounds, one line per method, band
# over seeds, the per-client majority-class baseline dashed. Under the panels, why PERM ends where it does, from
# metrics.json (`largest_step`, `alpha_zero_fraction`: under Alg. 1's shuffle a visit moves model i by eta *
# alpha_ij * N) and the other methods' step sizes. The title names the dataset that actually ran (a substitute is
# named as such) and the scale. Nothing is trained here; the look comes from params.yaml's `figures` settings (a
# change there re-runs this notebook alone).

# %% tags=["parameters"]
stage = "perm_fig2_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what fig2_cifar10.ipynb wrote by default)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/perm_fig2
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
fig = plotting.accuracy_loss_figure(result.history, "PERM Fig. 2: personalized accuracy and loss", result.data_label,
                                    result.scale, notes=draw.alpha_diagnostics(result.metrics, run["lr"]))
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig2_cifar10")
print("wrote", [p.name for p in figure_files])
