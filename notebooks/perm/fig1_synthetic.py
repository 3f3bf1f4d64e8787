# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python (pflkit)
#     language: python
#     name: pflkit
# ---

# %% [markdown]
# # PERM, Fig. 1 — personalized learning on synthetic two-group data
#
# Deng et al., *Distributed Personalized Empirical Risk Minimization*, Section 5, Fig. 1.
# N clients in two groups with opposite labelling rules (y = sign(w.x) vs sign(-w.x)) and shifted
# feature means; logistic regression. Each method's personalized models are scored on every client's
# held-out test split (unweighted mean over clients, band = ±1 sd over seeds). The dashed line is the
# per-client majority-class baseline.
#
# The parameters cell below is a small **smoke** configuration (fast, used by the nbval regression
# test). `dvc repro` runs this notebook with the `perm_fig1` section of `params.yaml` (paper scale:
# N = 50, 500 samples per client, d = 60) and writes the executed copy to `reports/perm/`.
# Learning rates are per method (`lr`), chosen from a small grid; see params.yaml.

# %% tags=["parameters"]
stage = "perm_fig1"
num_clients = 10
samples_per_client = 100
dim = 60
test_fraction = 0.2
rounds = 5
local_steps = 5
batch_size = 20
lr = {"local": 0.2, "fedavg": 0.2, "localized_fedavg": 0.2}
finetune_steps = 5
finetune_lr = 0.2
methods = ["local", "fedavg", "localized_fedavg"]
seeds = [0, 1]
eval_every = 1
device = "cpu"
results_dir = "build/smoke/perm_fig1"
figures_dir = "build/smoke/figures/perm"

# %%
from pathlib import Path

from pflkit import plotting, report
from pflkit.experiments import perm
from pflkit.paths import resolve

cfg = perm.PermFig1Config.from_namespace(globals())
result = perm.fig1(cfg)
print(result.data_label, "|", result.scale)

# %% [markdown]
# Final-round personalized metrics (mean and sd over seeds). This table is the regression reference.

# %%
# NBVAL_CHECK_OUTPUT
report.print_table(result.table)

# %%
plotting.use_style()
fig, (ax_acc, ax_loss) = plotting.plt.subplots(1, 2, figsize=(11, 4))
plotting.plot_curves(ax_acc, result.history, "accuracy", "personalized test accuracy (fraction correct)")
plotting.plot_curves(ax_loss, result.history, "loss", "personalized test loss (cross-entropy, nats)",
                     baseline=False)
plotting.finish(fig, plotting.title("PERM Fig. 1: personalized accuracy and loss", result.data_label, result.scale))
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig1_synthetic")

# %%
from pflkit.runner import curves

report.write_stage(cfg.results_dir, result.metrics, history=result.history, run_info=result.run_info,
                   curves_accuracy=curves(result.history, "accuracy"))
print("wrote", [str(Path(p).name) for p in figure_files], "and", cfg.results_dir)
