"""Does a Charles grid cell that pflkit's divergence rule stops recover? (issue 28's CIFAR-100 finding)

    python benchmarks/charles_divergence_probe.py [--stage charles_fig12] [--profile paper] [--task cifar100]
                                                  [--rounds 5] [--etas 0.01,0.001] [--gamma 0]

Builds the stage's task exactly as the stage does (``charles_nn._task_setup``: data, model, evaluator at the
profile's values) and runs ``run_grid`` for gamma and each eta with the divergence rule off, printing the
watched loss per round and eta. The paper profile's CIFAR-100 task (ResNet-18-GN x1) takes about 100 s a round
for two settings on a 2-core CPU.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main(argv=None) -> int:
    from pflkit.config import load_params, stage_config, stage_values
    from pflkit.experiments import charles_nn
    from pflkit.paths import project_root

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stage", default="charles_fig12")
    p.add_argument("--profile", default="paper")
    p.add_argument("--task", default="cifar100")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--etas", default="0.01,0.001")
    p.add_argument("--gamma", type=float, default=0.0)
    a = p.parse_args(argv)
    cfg = stage_config(a.stage).build(stage_values(load_params(project_root() / "params.yaml"), a.stage, a.profile))
    if a.task not in cfg.tasks:
        p.error(f"--task must be one of {sorted(cfg.tasks)}, got {a.task!r}")
    t = cfg.tasks[a.task]
    task, data, model, evaluate = charles_nn._task_setup(cfg, t)
    watch = f"{cfg.eval_split}_loss"
    print(f"{a.stage} ({a.profile}) {a.task}: {task.model_desc}, {data.num_clients} clients, watching {watch}",
          flush=True)
    settings = [charles_nn.Setting(gamma=a.gamma, eta=float(e), variant=f"eta = {e}") for e in a.etas.split(",")]
    start = time.perf_counter()
    run = charles_nn.run_grid(model, data, settings, rounds=a.rounds, local_steps=cfg.local_steps,
                              batch_size=t.batch_size, clients_per_round=t.clients_per_round, seed=cfg.seed,
                              evaluate=evaluate, eval_every=1, diverge_factor=float("inf"), watch=watch,
                              settings_chunk=cfg.settings_chunk, show_progress=True)
    h = run.history[run.history["metric"] == watch].pivot(index="round", columns="eta", values="value")
    print(h.to_string(float_format=lambda v: f"{v:.3f}"))
    print(f"{time.perf_counter() - start:.0f} s; pflkit's rule stops a setting at {cfg.diverge_factor:g} x its "
          "first value")
    return 0


if __name__ == "__main__":
    sys.exit(main())
