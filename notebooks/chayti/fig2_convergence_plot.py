# %% [markdown]
# # Chayti et al., Fig. 2 (figure) — Alone vs WGA vs BC
#
# Drawn from the files `fig2_convergence` wrote (`results/chayti_fig2/`: `curves.csv` and `final.csv` and
# `run.json` under `dvc repro`, `build/<profile>/chayti_fig2/` for a profile's run): one panel per setting of
# params.yaml's `panels` (in its order), the loss of Alone (blue), WGA (green) and BC (orange: the paper's
# caption) over the steps, each panel titled with the step sizes. Solid: mean loss over runs; band: 10-90% of
# runs; dashed: the exact expected loss. Nothing is simulated here; the look comes from params.yaml's `figures`
# settings (a change there re-runs this notebook alone).

# %% tags=["parameters"]
stage = "chayti_fig2_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what fig2_convergence.ipynb wrote by default)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/chayti_fig2
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import plotting, report
from pflkit.figures import chayti as draw
from pflkit.paths import resolve

cfg = plotting.FigureConfig.from_namespace(globals())
plotting.configure(cfg)
result = report.read_result(cfg.results_dir)
run = result.run_info["config"]  # the compute stage's config, as it ran
print(result.data_label, "|", result.scale)

# %%
fig = draw.convergence_figure(result.curves, result.final, [p["label"] for p in run["panels"]],
                              "Chayti Fig. 2: Alone vs WGA vs BC (eta tuned for Alone and WGA)",
                              result.data_label, result.scale)
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig2_convergence")
print("wrote", [p.name for p in figure_files])
