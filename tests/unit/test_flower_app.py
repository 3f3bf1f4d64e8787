"""pflkit as a Flower App (issue 55): pyproject.toml's [tool.flwr.app] names pflkit's ServerApp and ClientApp and
a run config with every key ``spec.RUN_CONFIG`` lists, from which ``spec.specs_from_run_config`` builds the run
(``flwr run --run-config`` changes it); a bad value is refused naming its key; the App Bundle a deployment writes
names the same components. `flwr run` itself runs in tests/integration/test_flower.py."""
import json
import tomllib
from pathlib import Path

import pytest

from pflkit.flower.spec import RUN_CONFIG, RunSpec, specs_from_run_config, specs_to_json

ROOT = Path(__file__).resolve().parents[2]
APP = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]


def test_pyproject_is_a_flower_app_whose_run_config_is_one_pflkit_run():
    assert APP["publisher"] == "pflkit"
    assert APP["components"] == {"serverapp": "pflkit.flower.apps:flower_server_app",
                                 "clientapp": "pflkit.flower.apps:flower_client_app"}
    assert list(APP["config"]) == list(RUN_CONFIG)  # every key, in the order the table documents them
    (spec,) = specs_from_run_config(APP["config"])
    assert (spec.method, spec.rounds, spec.seed, spec.min_clients) == ("FedAvg", 3, 0, None)
    assert spec.settings == {"local_steps": 20, "lr": 0.1, "batch_size": 20}
    assert spec.federation().num_clients == 3
    spec.algorithm(spec.functional_model((10,), 2))  # the settings build the method


def test_the_run_config_overrides_build_another_method_and_specs_replace_the_keys():
    perm = specs_from_run_config({**APP["config"], "method": "PERM", "num-server-rounds": 4, "min-clients": 0,
                                  "settings": json.dumps({"local_steps": 2, "lr": 0.5, "batch_size": 4, "lam": 10.0,
                                                          "update_every": 2})})[0]
    assert perm.method == "PERM" and perm.rounds == 4 and perm.settings["lam"] == 10.0
    fedavg = specs_from_run_config({**APP["config"], "min-clients": 2})[0]
    assert fedavg.min_clients == 2
    two = [perm, fedavg]
    assert specs_from_run_config({"specs": specs_to_json(two)}) == two


@pytest.mark.parametrize("key, value, match", [
    ("method", "Nope", r"method must be one of .* or an import path"),
    ("settings", "{not json", r"run config settings must be the method class's keywords as a JSON object"),
    ("data-kwargs", "[1, 2]", r"run config data-kwargs must be the data builder's keywords as a JSON object"),
    ("num-server-rounds", 2.5, r"run config num-server-rounds must be communication rounds, an integer >= 1"),
    ("num-server-rounds", 0, r"rounds must be an integer >= 1"),
    ("seed", True, r"run config seed must be the run's seed"),
    ("timeout", "soon", r"run config timeout must be seconds a pass waits for its replies, > 0"),
    ("min-clients", -1, r"min_clients must be None \(every client\) or an integer >= 1"),
    ("batch-order", "random", r"batch_order must be one of"),
    ("model", "resnet", r"model.name must be one of"),
], ids=lambda v: str(v)[:20])
def test_a_bad_run_config_value_is_refused_naming_its_key(key, value, match):
    with pytest.raises(ValueError, match=match):
        specs_from_run_config({**APP["config"], key: value})


def test_a_run_config_missing_keys_names_each_and_what_it_holds():
    config = {k: v for k, v in APP["config"].items() if k not in ("seed", "data")}
    with pytest.raises(ValueError, match=r"the run config lacks \['data', 'seed'\]: pflkit's App needs data: a key "
                                         r"of pflkit.flower.spec.DATASETS; seed: the run's seed"):
        specs_from_run_config(config)


def test_the_deployments_app_bundle_names_the_same_components(tmp_path):
    pytest.importorskip("tomli_w")
    from pflkit.flower.deployment import app_bundle

    spec = RunSpec("FedAvg", {"local_steps": 1, "lr": 0.1, "batch_size": 2}, {"name": "logistic"},
                   {"name": "perm_synthetic", "kwargs": {"num_clients": 2}}, 0, 1)
    folder = app_bundle(tmp_path / "app", [spec], tmp_path / "r.json")
    bundle = tomllib.loads((folder / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert bundle["components"] == APP["components"]
    assert specs_from_run_config(bundle["config"]) == [spec]
