"""The driver of the Ray cells tests: charles_fig12 at the smoke profile, as its notebook runs it (the stage's
outputs and every setting's final model under OUT/results), with the grid's gammas and the tasks' rounds
replaced when OVERRIDES (JSON: {"gammas": [...], "rounds": n}) says so. The executor and the cell store are
the environment's ($PFLKIT_EXECUTOR, $PFLKIT_CELLS).

    python tests/integration/cells_driver.py OUT [OVERRIDES]

The tests start it with :func:`launch` and read its last line, the run's ``cells`` (run.json), with :func:`cells_of`.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def launch(out: Path, store: Path, executor: str, overrides: dict | None = None, **popen) -> subprocess.Popen:
    """The driver in a process of its own, on ``executor`` with the cell store ``store``, one thread."""
    env = {**os.environ, "PFLKIT_EXECUTOR": executor, "PFLKIT_CELLS": str(store), "OMP_NUM_THREADS": "1",
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen([sys.executable, __file__, str(out), json.dumps(overrides or {})], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def cells_of(stdout: str) -> dict:
    """The run's ``cells`` the driver printed last."""
    return json.loads(stdout.strip().splitlines()[-1])


def computed(cells: dict) -> int:
    """Cells the run computed (the others it found in the store)."""
    return sum(t["computed"] for t in cells["tasks"])


def main(out: str, overrides: str = "{}") -> None:
    from pflkit import report
    from pflkit.experiments import charles_nn

    more = json.loads(overrides)
    cfg = charles_nn.CharlesFig12Config.from_namespace({
        "stage": "charles_fig12", "profile": "smoke", "results_dir": str(Path(out, "results")),
        "figures_dir": str(Path(out, "figures"))})
    if "rounds" in more:
        cfg = cfg.model_copy(update={"tasks": {k: t.model_copy(update={"rounds": more["rounds"]})
                                               for k, t in cfg.tasks.items()}})
    if "gammas" in more:
        cfg = cfg.model_copy(update={"gammas": more["gammas"]})
    result = charles_nn.fig12(cfg)
    report.write_result(cfg.results_dir, result, diverged=result.diverged)
    charles_nn.save_models(cfg, result)
    print(json.dumps(result.run_info["cells"]))


if __name__ == "__main__":
    main(*sys.argv[1:])
