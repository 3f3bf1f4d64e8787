# %% [markdown]
# # PERM, Fig. 4 — EMNIST, 50 clients, MLP (2 x 200)
#
# Personalized accuracy and loss vs communication rounds for PERM, localized FedAvg and Per-FedAvg
# (and Local as a reference). The paper uses EMNIST with its natural writer split. **Offline, EMNIST
# cannot be downloaded here: the stage then runs the substitute named in params.yaml
# (`dataset.substitute`) with the partition given there, and the title, the printed dataset line and
# metrics.json say so.** PERM's final alpha (first seed) is saved for Fig. 5.
# The parameters cell runs the `smoke` profile (params.yaml `profiles.smoke`); `dvc repro` runs `perm_fig4`
# from params.yaml.

# %% tags=["parameters"]
stage = "perm_fig4"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import report
from pflkit.experiments import perm as experiment
from pflkit.runner import curves

cfg = experiment.PermFig4Config.from_namespace(globals())
result = experiment.image_curves(cfg)
print("data:", result.data_label, "| source:", result.metrics["source"], "|", result.scale)

# %%
# trained float32 results: tests/regression compares them within measured tolerances
report.print_table(result.table)

# %%
print(experiment.describe_claim(result.metrics.get("claim_perm_best")))

# %% [markdown]
# ## Verdict
#
# Every method at its best lr of the same grid and round budget (`python -m pflkit tune perm_fig4`): this run's
# numbers when `dvc repro` runs it, else read from the results it wrote. Three PERMs are judged apart: Alg. 1 as
# written (`PERM`), the variant whose rounds visit clients in proportion to alpha (`PERM (alpha visits)`), and the
# rule of a PERM co-author's code (`PERM (TorchFed shuffle)`: alpha from the clients' gradient correlation after a
# FedAvg warm-up, each visit moving a model towards its plain local result by that weight; docs/papers.md, "Beside
# the authors' code"). The "why" lines come from each run's final alpha: the share of alpha that is 0 (under Alg.
# 1's shuffle those visits leave a model where it is) and the largest step eta * alpha_ij * N (it caps the usable
# eta, so Alg. 1 underfits). The PERM investigation (benchmarks/results/perm_investigation.md: steps per model, step
# sizes, and a sweep of lambda, warm-up, update period, solver, K and lr) backs this on the same data. Fig. 5 shows
# how well alpha follows the label overlap. This is a CPU-scale run on a substitute dataset, not the paper's
# setting.

# %%
# this run's results under dvc repro, else read from results/perm_fig4/ (not compared by nbval)
report.print_measured(cfg, experiment.describe_final, result.metrics, result.scale)

# %%
report.write_result(cfg.results_dir, result, curves_accuracy=curves(result.history, "accuracy"))
experiment.save_alpha(result, cfg.alpha_file)
models = experiment.save_models(cfg, result)
print("wrote", cfg.results_dir, "and", len(models), "trained models")
