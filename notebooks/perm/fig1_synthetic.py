# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: -jupytext.text_representation
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
# feature means; logistic regression. PERM (single loop, Alg. 2) against Local, FedAvg, localized
# FedAvg, Per-FedAvg (first order) and pFedMe. Each method's personalized models are scored on every client's
# held-out test split (unweighted mean over clients, band = ±1 sd over seeds). The dashed line is the
# per-client majority-class baseline.
#
# The parameters cell below is a small **smoke** configuration (fast, used by the nbval regression
# test). `dvc repro` runs this notebook with the `perm_fig1` section of `params.yaml` (paper scale:
# N = 50, 500 samples per client, d = 60) and writes the executed copy to `reports/perm/`.
# Learning rates are per method (`lr`), each the best of the same grid at the same round budget
# (`python -m pflkit tune perm_fig1`); see params.yaml. PERM's rounds are shuffle steps: one round =
# every client hosts one model for K local steps, as in a FedAvg round.

# %% tags=["parameters"]
stage = "perm_fig1"
num_clients = 10
samples_per_client = 100
dim = 60
test_fraction = 0.2
rounds = 5
local_steps = 5
batch_size = 20
lr = {"local": 0.2, "fedavg": 0.2, "localized_fedavg": 0.2, "perm": 1.0, "perfedavg_fo": 0.2, "pfedme": 0.2}
finetune_steps = 5
finetune_lr = 0.2
methods = ["local", "fedavg", "localized_fedavg", "perm", "perfedavg_fo", "pfedme"]
seeds = [0, 1]
eval_every = 1
perm = {"lam": 300.0, "alpha_solver": "gd", "alpha_steps": 50, "global_lr": 0.5, "update_every": 5}
perfedavg = {"alpha": 0.02}
pfedme = {"personal_lr": 0.01, "lam": 20.0, "inner_steps": 5, "beta": 1.0}
device = "cpu"
threads = "auto"  # torch CPU threads; auto means $OMP_NUM_THREADS if set, else 1
results_dir = "build/smoke/perm_fig1"
figures_dir = "build/smoke/figures/perm"

# %%
from pathlib import Path

from pflkit import plotting, report
from pflkit.experiments import perm as experiment
from pflkit.paths import resolve

cfg = experiment.PermFig1Config.from_namespace(globals())
result = experiment.fig1(cfg)
print(result.data_label, "|", result.scale)

# %% [markdown]
# Final-round personalized metrics (mean and sd over seeds). This table is the regression reference.

# %%
# trained float32 results: tests/regression compares them within measured tolerances
report.print_table(result.table)

# %%
print(experiment.describe_claim(result.metrics.get("claim_perm_best")))

# %% [markdown]
# The line above judges this run; at the tiny smoke defaults it is not the paper's setting. **Measured at
# params.yaml scale** (`dvc repro perm_fig1`: N = 50, 500 samples, d = 60, 100 rounds, 3 seeds): PERM
# 0.980 +- 0.011 > Local 0.963 > localized FedAvg 0.929 > pFedMe 0.902 > Per-FedAvg 0.893 > FedAvg 0.887
# (= majority class): **the paper's Fig. 1 claim holds.**

# %% [markdown]
# Fig. 1's mechanism: the share of PERM's final alpha_i inside client i's own group, per seed, next to
# the share of label 1 in each group. Where both groups label almost everything 1 (seed 2 at paper
# scale: 99%), their gradients agree and alpha rightly mixes across the groups.

# %%
# trained float32 results: tests/regression compares them within measured tolerances
import pandas as pd

alpha_table = pd.json_normalize([{"seed": s, **v} for s, v in result.metrics.get("perm_alpha", {}).items()])
print(alpha_table.round(3).to_string(index=False))

# %%
fig = plotting.accuracy_loss_figure(result.history, "PERM Fig. 1: personalized accuracy and loss",
                                   result.data_label, result.scale)
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig1_synthetic")

# %%
from pflkit.runner import curves

report.write_stage(cfg.results_dir, result.metrics, history=result.history, run_info=result.run_info,
                   curves_accuracy=curves(result.history, "accuracy"))
print("wrote", [str(Path(p).name) for p in figure_files], "and", cfg.results_dir)
