# %% [markdown]
# # PERM, Theorem 1 — the estimated mixing weights approach the optimal ones as w^R -> w*
#
# No figure in the paper: Theorem 1 says the alpha estimated at Alg. 3's output w^R converges to
# alpha* (eq. 2 at the optimum w*) as w^R -> w*. On PERM's synthetic two-group data we run exact
# FedAvg with one local step (gradient descent on the average loss, so w^R -> w* linearly), solve
# eq. (2) exactly at each checkpoint, and plot ||w^R - w*|| and the mean ||alpha_hat_i - alpha*_i||_1.
# The right panel shows how much of each client's alpha lies inside its own group (the mechanism
# behind Fig. 1). The parameters cell runs the `smoke` profile (params.yaml `profiles.smoke`); `dvc repro`
# uses `perm_alpha_convergence` in params.yaml.

# %% tags=["parameters"]
stage = "perm_alpha_convergence"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import report
from pflkit.experiments import perm as experiment

cfg = experiment.PermAlphaConvergenceConfig.from_namespace(globals())
result = experiment.alpha_convergence(cfg)
table, shares, record = result.convergence, result.shares, result.metrics

# %%
# trained float32 results: tests/regression compares them within measured tolerances
summary = result.table
report.print_table(summary)

# %% [markdown]
# Reading a run: where a seed's data are well separated, the alpha error falls with ||w^R - w*|| and every
# client's alpha stays inside its own group. A seed whose data are almost all one label in both groups
# has no finite minimizer of the logistic loss: ||w^R - w*|| then stays large and alpha rightly mixes
# across the two groups, which pulls the mean and the minimum own-group mass below 1. The per-seed rows
# are in `convergence.csv` (`results/perm_alpha_convergence/` at params.yaml scale); the last cell prints
# that run's final numbers.

# %%
last = summary.iloc[-1]
metrics = {**record, "final_R": int(summary.index[-1]), "w_error": float(last.w_error),
           "alpha_error_l1": float(last.alpha_error_l1), "own_group_mass_mean": float(last.own_group_mass_mean),
           "own_group_mass_min": float(shares.own_group_mass.min())}
report.write_stage(cfg.results_dir, metrics, convergence=table, own_group_mass=shares,
                   run_info={"stage": cfg.stage, "scale": result.scale, "data_label": result.data_label,
                             "config": cfg.model_dump(), "environment": report.environment()})
models = experiment.save_convergence_models(cfg, result)

# %%
# this run's numbers under dvc repro, else read from results/perm_alpha_convergence/ (not compared by nbval)
report.print_measured(cfg, lambda m: (f"R = {m['final_R']}: ||w^R - w*|| {m['w_error']:.2e}, mean alpha error "
                                      f"{m['alpha_error_l1']:.2e}, own-group mass mean {m['own_group_mass_mean']:.3f} "
                                      f"(min over clients {m['own_group_mass_min']:.3f})"), metrics)
