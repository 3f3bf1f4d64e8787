# %% [markdown]
# # Chayti et al., Fig. 3 (figure) — bias correction (BC) is insensitive to the heterogeneity zeta
#
# Drawn from the files `fig3_bc_zeta` wrote (`results/chayti_fig3/`: `curves.csv` and `final.csv` and
# `run.json` under `dvc repro`, `build/<profile>/chayti_fig3/` for a profile's run): BC's loss over the steps,
# one curve per zeta. Solid: mean loss over runs; band: 10-90% of runs; dashed: the exact expected loss;
# dotted: the paper-level floor a^2 b sigma^2 / 2. Nothing is simulated here; the look comes from
# params.yaml's `figures` settings (a change there re-runs this notebook alone).

# %% tags=["parameters"]
stage = "chayti_fig3_plot"
profile = "smoke"  # the profile whose results to draw (smoke: what fig3_bc_zeta.ipynb wrote by default)
results_dir = None  # None: the compute stage's results for the profile; dvc repro passes results/chayti_fig3
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
fig = draw.sweep_figure(result.curves, result.final, "a^2 b sigma^2 / 2 (paper-level floor)",
                        f"Chayti Fig. 3: BC for several zeta (eta={run['eta']}, a={run['a']}, b={run['b']})",
                        result.data_label, result.scale)
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig3_bc_zeta")
print("wrote", [p.name for p in figure_files])
