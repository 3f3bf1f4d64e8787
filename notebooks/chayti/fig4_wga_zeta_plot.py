# %% [markdown]
# # Chayti et al., Fig. 4 (figure) — WGA's loss floor grows like zeta^2
#
# Drawn from the files `fig4_wga_zeta` wrote (`results/chayti_fig4/`: `curves.csv` and `final.csv` and
# `run.json` under `dvc repro`, `build/<profile>/chayti_fig4/` for a profile's run): WGA's loss over the
# steps, one curve per zeta. Solid: mean loss over runs; band: 10-90% of runs; dashed: the exact expected
# loss; dotted: the floor a^2 zeta^2 / (2 mu) of each zeta (mu = 1), in its curve's colour. Nothing is
# simulated here; the look comes from params.yaml's `figures` settings (a change there re-runs this notebook
# alone).

# %% tags=["parameters"]
stage = "chayti_fig4_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what fig4_wga_zeta.ipynb wrote by default)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/chayti_fig4
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
fig = draw.sweep_figure(result.curves, result.final, "a^2 zeta^2 / 2 (floor per zeta)",
                        f"Chayti Fig. 4: WGA for several zeta (eta={run['eta']}, a={run['a']})",
                        result.data_label, result.scale)
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig4_wga_zeta")
print("wrote", [p.name for p in figure_files])
