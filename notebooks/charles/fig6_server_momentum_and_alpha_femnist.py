# %% [markdown]
# # Charles & Konecny, Figs. 6 and 11 — server momentum and alpha on FEMNIST (tuned learning rates)
#
# Test accuracy of LocalUpdate with Theta_{1:K} (paper: K = 50, M = 10 clients a round, B = 20) on
# FEMNIST with the CNN. Left: alpha = 0 and ServerOpt = gradient descent with no momentum, Nesterov or
# heavy-ball momentum (beta = 0.9). Right: no momentum and varying proximal strength alpha. Every curve
# uses its own tuned (gamma, eta): all grid settings of all curves run batched, and the pair with the
# best mean test accuracy over the last evaluations is kept (App. E.3; the paper tunes both on
# {1e-3, 1e-2.5, ..., 10} and averages the last 100 rounds). Fig. 11 re-plots the same experiment (it adds
# the tuned curves' test loss). The "alpha = 0" curve is the "no momentum" run (not recomputed).
# Paper's claims: server momentum improves convergence; alpha has little to no effect once learning
# rates are tuned (matching the quadratic frontiers of Figs. 2 and 3).
#
# **What runs here.** Offline, FEMNIST is replaced by the substitute named in params.yaml (Fashion-MNIST,
# Dirichlet writer-like split), labelled in the title and metrics.json. CPU scale (params.yaml): a
# narrowed CNN, fewer clients, local steps, rounds and a smaller tuning grid. The CNN trains with its
# dropout layers (0.25, 0.5) and is evaluated without. The parameters cell runs the `smoke` profile
# (params.yaml `profiles.smoke`); `dvc repro charles_fig6`
# runs params.yaml.
#
# This notebook trains and writes the results (`results/charles_fig6/`) and the final models of every grid
# setting (`models/charles_fig6/`); both figures are drawn from those files by
# `fig6_server_momentum_and_alpha_femnist_plot`, so a figure change never retrains.

# %% tags=["parameters"]
stage = "charles_fig6"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import report
from pflkit.experiments import charles_nn

cfg = charles_nn.CharlesFig6Config.from_namespace(globals())
result = charles_nn.fig6(cfg)
print(charles_nn.describe(result))

# %% [markdown]
# Tuned (gamma, eta) per curve, the mean test accuracy over all evaluated rounds (a convergence-speed
# summary: higher = faster) and the final accuracy (mean of the last evaluations) — the regression
# reference — then the claims in numbers.

# %%
# trained float32 results: tests/regression compares them within measured tolerances
report.print_table(result.table)
print("diverged:", [(d["variant"], d["gamma"], d["eta"]) for d in result.metrics["diverged"]])

# %%
claims = result.metrics["claims"]
for v, gain in claims.get("momentum_speeds_convergence", {}).items():
    print(f"{v} vs no momentum: mean accuracy over rounds {gain['acc_mean_over_rounds_gain']:+.3f}, "
          f"final {gain['acc_final_gain']:+.3f}")
if "alpha_spread_final_accuracy" in claims:
    print(f"alpha: spread of final accuracy across alphas = {claims['alpha_spread_final_accuracy']:.3f}")

# %%
report.write_result(cfg.results_dir, result, grid=result.grid, tuned=result.tuned, diverged=result.diverged)
models = charles_nn.save_models(cfg, result)
print("wrote", cfg.results_dir, "and", len(models), "model file(s): every setting's final model, per task")
