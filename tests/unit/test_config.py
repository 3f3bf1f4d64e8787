"""Stage configs: params.yaml validates; bad values fail early with the key, value and what is allowed."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pflkit.config import ConfigError, load_params, registry, stage_values, validate_all, validate_stage

ROOT = Path(__file__).resolve().parents[2]


def test_committed_params_are_valid():
    params = load_params(ROOT / "params.yaml")
    assert validate_all(params) == []
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    stages = {name for name, s in spec.items() if s["cmd"].startswith("python -m pflkit stage ")}
    data = {name for name, s in spec.items() if s["cmd"].startswith("python -m pflkit data ")}
    assert set(spec) - stages - data == {"claims"}, "every other dvc stage runs a notebook or prepares data"
    assert all(name.startswith("data_") for name in data) and len(data) >= 8
    assert stages <= set(registry()), "every notebook stage has a registered config"
    compute = {name for name in stages if not name.endswith("_plot")}
    assert compute <= set(params), "every compute stage has a params.yaml section"
    assert "figures" in params and "data" in params, "the plot stages' and data stages' sections"


def test_stage_values_add_runner_paths():
    v = stage_values({"defaults": {"device": "cpu"}, "perm_fig1": {"rounds": 3}}, "perm_fig1")
    assert v == {"device": "cpu", "rounds": 3, "stage": "perm_fig1", "results_dir": "results/perm_fig1",
                 "figures_dir": "figures/perm"}


@pytest.mark.parametrize("key, value, match", [
    ("rounds", 0, r"perm_fig1\.rounds: Input should be greater than or equal to 1 \(got 0\)"),
    ("local_steps", 0, r"local_steps: .*greater than or equal to 1"),
    ("lr", {"local": -0.1, "fedavg": 0.1, "localized_fedavg": 0.1},
     r"lr: .*values > 0; bad entries: \{'local': -0.1\}"),
    ("lr", {"fedavg": 0.1}, r"perm_fig1\.lr: no value for methods \['local', 'localized_fedavg', 'perm',"),
    ("num_clients", 1, r"num_clients: .*greater than or equal to 2"),
    ("test_fraction", 1.5, r"test_fraction: .*less than 1"),
    ("methods", ["perm2"], r"methods: must be a non-empty list from .*unknown: \['perm2'\]"),
    ("rounds", "many", r"rounds: Input should be a valid integer"),
    ("device", "tpu", r"device: must be one of \('auto', 'cpu', 'cuda'\)"),
    ("roudns", 5, r"roudns: unknown key \(did you mean .rounds.\?\) \(value 5\); allowed keys: .*rounds"),
])
def test_bad_values_are_rejected(key, value, match):
    params = load_params(ROOT / "params.yaml")
    params["perm_fig1"][key] = value
    with pytest.raises(ConfigError, match=match):
        validate_stage(params, "perm_fig1")


def test_cuda_without_gpu_is_rejected():
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    params = load_params(ROOT / "params.yaml")
    params["perm_fig1"]["device"] = "cuda"
    with pytest.raises(ConfigError, match="no CUDA GPU is available"):
        validate_stage(params, "perm_fig1")


def test_validate_cli_reports_every_problem(tmp_path):
    params = load_params(ROOT / "params.yaml")
    params["perm_fig1"]["rounds"] = -1
    params["perm_fig1"]["batch_size"] = 0
    params["perm_fgi2"] = {"rounds": 1}
    bad = tmp_path / "params.yaml"
    bad.write_text(yaml.safe_dump(params))
    out = subprocess.run([sys.executable, "-m", "pflkit", "validate", str(bad)], capture_output=True, text=True)
    assert out.returncode == 1
    assert "perm_fig1.rounds" in out.stderr and "perm_fig1.batch_size" in out.stderr
    assert "perm_fgi2: unknown section" in out.stderr
    ok = subprocess.run([sys.executable, "-m", "pflkit", "validate", str(ROOT / "params.yaml")],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
