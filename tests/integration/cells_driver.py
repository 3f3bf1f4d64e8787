"""The driver of the Ray cells tests: charles_fig12 at the smoke profile, as its notebook runs it (the stage's
outputs and every setting's final model under OUT/results), with the grid's gammas and the tasks' rounds
replaced when OVERRIDES (JSON: {"gammas": [...], "rounds": n}) says so. The executor and the cell store are
the environment's ($PFLKIT_EXECUTOR, $PFLKIT_CELLS).

    python tests/integration/cells_driver.py OUT [OVERRIDES]
"""
import json
import sys
from pathlib import Path

from pflkit import report
from pflkit.experiments import charles_nn


def main(out: str, overrides: str = "{}") -> None:
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
