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
# # PERM, Fig. 2 — CIFAR-10, 50 clients with 2 classes each, 2-layer CNN
#
# Personalized accuracy and loss vs communication rounds for PERM (after 10 warm-up rounds of FedAvg),
# Per-FedAvg, pFedMe and localized FedAvg. The paper uses CIFAR-10 (32x32x3). **Offline, CIFAR-10
# cannot be downloaded here: the stage then runs the substitute named in params.yaml
# (`dataset.substitute`) with the partition given there, and the title, the printed dataset line and
# metrics.json say so.** The CNN is sized from the input shape; its width is a CPU-scale choice (params.yaml).
# Smoke defaults below; `dvc repro` runs `perm_fig2` from params.yaml.

# %% tags=["parameters"]
stage = "perm_fig2"
dataset = {"name": "cifar10", "substitute": "fashion-mnist", "allow_download": False, "root": "data/raw"}
num_clients = 10
partition = {"scheme": "classes", "classes_per_client": 2}
pool_size = 2000
test_fraction = 0.2
model = {"name": "cnn", "channels": [8, 16], "hidden": [64]}
rounds = 4
local_steps = 3
batch_size = 20
lr = {"localized_fedavg": 0.05, "perm": 0.01, "perfedavg_fo": 0.02, "pfedme": 0.05, "fedavg": 0.05}
finetune_steps = 3
finetune_lr = 0.05
methods = ["localized_fedavg", "perm", "perfedavg_fo", "pfedme"]
seeds = [0]
eval_every = 1
perm = {"lam": 30000.0, "alpha_solver": "exact", "warmup_rounds": 2, "alpha_init": "estimate", "update_every": 2,
        "global_lr": 0.05}
perfedavg = {"alpha": 0.02}
pfedme = {"personal_lr": 0.02, "lam": 15.0, "inner_steps": 5, "beta": 1.0}  # 0.05 (params.yaml) is chaotic at this tiny scale: other CPUs moved pFedMe by 7 points
device = "cpu"
threads = "auto"  # torch CPU threads; auto means $OMP_NUM_THREADS if set, else 1
results_dir = "build/smoke/perm_fig2"
figures_dir = "build/smoke/figures/perm"

# %%
from pflkit import plotting, report
from pflkit.experiments import perm as experiment
from pflkit.paths import resolve
from pflkit.runner import curves

cfg = experiment.PermFig2Config.from_namespace(globals())
result = experiment.image_curves(cfg)
print("data:", result.data_label, "| source:", result.metrics["source"], "|", result.scale)

# %%
# trained float32 results: tests/regression compares them within measured tolerances
report.print_table(result.table)

# %%
print(experiment.describe_claim(result.metrics.get("claim_perm_best")))

# %% [markdown]
# **Measured at params.yaml scale** (`dvc repro perm_fig2`: Fashion-MNIST substitute, 50 clients x 2 classes,
# 60 rounds, 3 seeds, every method at its best lr of a 4-value grid on the same round budget; 12 minutes
# on a 2-core CPU): final personalized accuracy pFedMe 0.937 +- 0.010, localized FedAvg 0.850 +- 0.021,
# PERM 0.767 +- 0.026, Per-FedAvg (FO) 0.727 +- 0.036 (majority class 0.466). **The paper's claim (PERM best)
# does not hold here.** PERM's best lr sits at the grid's low edge and it falls off on both sides
# (0.74 @ 0.01, 0.71 @ 0.005, 0.68 @ 0.02 for seed 0): its shuffling step eta * alpha_ij * N is large
# on the few clients alpha favours. This is a CPU-scale run on a substitute dataset, not the paper's setting.

# %%
fig = plotting.accuracy_loss_figure(result.history, "PERM Fig. 2: personalized accuracy and loss",
                                    result.data_label, result.scale)
figure_files = plotting.save_figure(fig, resolve(cfg.figures_dir) / "fig2_cifar10")

# %%
report.write_stage(cfg.results_dir, result.metrics, history=result.history, run_info=result.run_info,
                   curves_accuracy=curves(result.history, "accuracy"))
