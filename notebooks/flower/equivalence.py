# %% [markdown]
# # PERM and FedAvg on a real federated engine: Flower, simulated and deployed
#
# PERM's Fig. 1 setting (synthetic two-group data, logistic regression; `notebooks/perm/fig1_synthetic.py`)
# with fewer rounds, run with the same seed and client schedule on four engines:
#
# * **in-process**: pflkit's batched engine (every client at once, `runner.run`), the reference;
# * **federated protocol, one process**: the server and client code of `pflkit.flower` without a transport
#   (`pflkit.flower.loopback`): the server holds the algorithm's state and its random generator, draws the
#   round's clients as the batched engine does, and sends each client its model and the pass's key; each
#   client runs the algorithm's own client update for itself alone, drawing its minibatches from its own
#   stream of that key (as it does inside the batch);
# * **Flower simulation**: the same ServerApp and ClientApp on Flower's simulation engine (Ray actors);
# * **Flower deployment**: one SuperLink and one SuperNode per client as separate local processes
#   (`pflkit.flower.deployment`), the run submitted with `flwr run`.
#
# The Flower engines need the extra `pflkit[flower]` (`make reproduce` installs it; `make test` does not):
# without it they are skipped and said so below. The figure (`equivalence_plot`, from the files this notebook
# writes) shows the curves and every engine's accuracy minus in-process (the bar is 1e-4 on the final
# personalized accuracy).

# %% tags=["parameters"]
stage = "flower_equivalence"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import report
from pflkit.experiments import flower as experiment

cfg = experiment.FlowerEquivalenceConfig.from_namespace(globals())
result = experiment.equivalence(cfg)
print(result.data_label, "|", result.scale)
print("engines run:", ", ".join(experiment.ENGINE_NAMES[e] for e in result.engines_run))
if result.engines_skipped:
    print(f"Flower is not installed ({experiment.INSTALL_HINT}): skipped", ", ".join(result.engines_skipped))

# %% [markdown]
# Final personalized metrics per method and engine (mean over seeds), and each engine's largest
# |difference| from in-process over every evaluated round. The in-process and one-process rows are the
# regression reference; Flower's rows follow when Flower ran.

# %%
# trained float32 results: tests/regression compares them within measured tolerances
report.print_table(result.table, decimals=6)

# %%
print(experiment.describe(result.metrics, result.engines_skipped))

# %% [markdown]
# Wall time per communication round (training passes; evaluation apart), on this machine and load: the
# batched engine runs every client in one process; Flower adds messages, and its deployment engine starts a
# ClientApp process for every message (`benchmarks/flower.py` measures start-up, memory and bytes too).

# %%
# timings: not compared by the tests (they vary)
timing = experiment.timing_table(result.timings)
print(timing.round(3).to_string() if len(timing) else "no timings")

# %% [markdown]
# The verdicts at params.yaml scale: this run's when `dvc repro` runs it, else read from the results it wrote:

# %%
# this run's results under dvc repro, else read from results/flower_equivalence/ (not compared by nbval)
report.print_measured(cfg, experiment.describe, result.metrics, result.scale)

# %%
report.write_result(cfg.results_dir, result, final=result.table.reset_index(), differences=result.differences)
models = experiment.save_models(cfg, result)
print("wrote", cfg.results_dir, "and", len(models), "in-process trained models")
