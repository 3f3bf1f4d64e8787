"""Flower and Ray stay offline (no telemetry, update checks or run-time installs: ``pflkit.flower.OFFLINE_ENV``)
where an engine starts, and importing pflkit.flower writes nothing to the environment (issue 27)."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from pflkit.flower import OFFLINE_ENV
from pflkit.flower.spec import RunSpec

MODULES = ["pflkit.flower", "pflkit.flower.client", "pflkit.flower.credentials", "pflkit.flower.deployment",
           "pflkit.flower.loopback", "pflkit.flower.reaper", "pflkit.flower.server", "pflkit.flower.simulation",
           "pflkit.flower.spec", "pflkit.experiments.flower", "pflkit.figures.flower"]
# modules that import flwr at import time: checked too where the extra pflkit[flower] is installed
FLOWER_MODULES = ["pflkit.flower.apps"]


def test_importing_pflkit_flower_leaves_the_environment_alone():
    flower = importlib.util.find_spec("flwr") is not None
    modules = MODULES + (FLOWER_MODULES if flower else [])
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE_ENV and k != "GRPC_VERBOSITY"}
    # Flower's own import sets GRPC_VERBOSITY (flwr.supercore.grpc): imported first, so only pflkit's writes count
    flwr_first = "import flwr.app, flwr.clientapp, flwr.serverapp; " if flower else ""
    code = ("import importlib, json, os, sys; " + flwr_first + "before = dict(os.environ); "
            "[importlib.import_module(m) for m in sys.argv[1:]]; "
            "print(json.dumps({k: v for k, v in os.environ.items() if before.get(k) != v}))")
    out = subprocess.run([sys.executable, "-c", code, *modules], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {}


def test_a_clientapp_process_imports_torch_and_flower_but_no_table_or_plotting_library():
    """Flower starts a ClientApp process for every message, so what importing the ClientApp's module loads is paid
    per message (benchmarks/flower_floor.py's torch floor): pandas (0.3 s here), scipy, matplotlib, seaborn,
    pydantic and yaml stay out of it; torch is the ClientApp's own."""
    pytest.importorskip("flwr")
    code = ("import json, sys; import pflkit.flower.apps; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1:]))))")
    heavy = ["pandas", "scipy", "matplotlib", "seaborn", "pydantic", "yaml", "torch"]
    out = subprocess.run([sys.executable, "-c", code, *heavy], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ["torch"]


def test_the_simulation_engine_goes_offline_before_flower_and_ray_start(monkeypatch):
    pytest.importorskip("ray")
    pytest.importorskip("flwr")
    from pflkit.flower import simulation

    for key in OFFLINE_ENV:
        monkeypatch.delenv(key, raising=False)
    seen = {}

    class Stop(Exception):
        pass

    def start_ray(init_args):
        seen.update({k: os.environ.get(k) for k in OFFLINE_ENV})
        raise Stop

    monkeypatch.setattr(simulation, "start_ray", start_ray)
    spec = RunSpec("FedAvg", {}, {"name": "logistic"}, {"name": "perm_synthetic", "kwargs": {
        "num_clients": 2, "samples_per_client": 10, "dim": 3, "test_fraction": 0.2, "seed": 0}}, 0, 1)
    with pytest.raises(Stop):
        simulation.simulate([spec], num_cpus=1)
    assert seen == OFFLINE_ENV


def test_the_deployment_engine_passes_the_offline_switches_to_its_processes(tmp_path):
    pytest.importorskip("flwr")
    from pflkit.flower.deployment import Deployment

    env = Deployment(1, workdir=tmp_path, insecure=True).env
    assert {k: env[k] for k in OFFLINE_ENV} == OFFLINE_ENV
