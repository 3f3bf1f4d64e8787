# %% [markdown]
# # PERM, Fig. 3 — wall-clock time of one communication round
#
# One round = every client does its local work once (K = 20 local steps in the paper), measured on
# the CPU with a fixed number of threads ("a limited environment"). PERM's rounds include its
# periodic global-model and alpha updates, so its mean is the amortized per-round cost. Expected
# (paper): PERM costs about as much as FedAvg; Per-FedAvg and pFedMe cost more (extra gradient
# evaluations per step). Times depend on the machine: the compared table below therefore lists only
# what was measured; the times are in the figure and in metrics.json.

# %% tags=["parameters"]
stage = "perm_fig3"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
import platform

from pflkit import report
from pflkit.experiments import perm as experiment

cfg = experiment.PermFig3Config.from_namespace(globals())
times = experiment.fig3(cfg).times

# %%
# NBVAL_CHECK_OUTPUT
print(times.groupby(["workload", "method"]).size().rename("rounds timed").to_string())

# %%
summary = times.groupby(["workload", "method"])["seconds"].agg(["median", "mean", "std"])
summary["vs FedAvg (median)"] = summary["median"] / summary.xs("FedAvg", level="method")["median"].reindex(
    summary.index.get_level_values("workload")).to_numpy()
print(summary.round(4).to_string())

# %%
flat = summary.reset_index()
per_round = {f"{r.workload}/{r.method}": {"median": r["median"], "mean": r["mean"],
                                           "vs_fedavg": r["vs FedAvg (median)"]} for _, r in flat.iterrows()}
machine = f"{platform.machine()} CPU, {cfg.threads} thread(s), device {cfg.device}"
scale = f"K={cfg.local_steps} local steps, batch {cfg.batch_size}, {cfg.repeats} rounds timed; {machine}"
metrics = {"machine": machine, "seconds_per_round": per_round}
report.write_stage(cfg.results_dir, metrics, times=times,
                   run_info={"stage": cfg.stage, "config": cfg.model_dump(), "environment": report.environment(),
                             "data_label": ", ".join(cfg.workloads), "scale": scale})
