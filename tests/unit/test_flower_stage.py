"""The flower_equivalence stage's config and its run where Flower is not installed (what `make test` sees
without the extra): the in-process and one-process protocol rows, Flower's engines skipped and said so."""
import pytest

from pflkit.config import ConfigError, load_params, stage_values
from pflkit.experiments import flower as experiment
from pflkit.paths import project_root

PARAMS = load_params(project_root() / "params.yaml")


def _cfg(**overrides):
    values = stage_values(PARAMS, "flower_equivalence", "smoke")
    values.update(overrides)
    return experiment.FlowerEquivalenceConfig.build(values)


@pytest.mark.parametrize("key, value, match", [
    ("methods", ["fedavg", "local"],
     r"flower_equivalence\.methods: .*federated engine runs, from .*got \['local'\] \(local: Alone trains every"),
    ("engines", ["cloud"], r"flower_equivalence\.engines\.0: .*'simulation' or 'deployment'"),
    ("engines", ["simulation", "simulation"], r"flower_equivalence\.engines: .*repeated: \['simulation'\]"),
    ("ray_cpus", 0, r"flower_equivalence\.ray_cpus: .*greater than or equal to 1"),
    ("timeout", 0.0, r"flower_equivalence\.timeout: .*greater than 0"),
])
def test_bad_values_name_the_key_and_what_is_allowed(key, value, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(**{key: value})


def test_the_stage_accepts_the_methods_whose_class_declares_federated():
    """The accepted keys come from the registry's classes (``federated``), not from a list kept by hand."""
    from pflkit.experiments.curves import FEDERATED_METHODS, METHODS
    assert FEDERATED_METHODS == ("fedavg", "localized_fedavg", "perm", "perm_alpha", "perfedavg_fo", "perfedavg_hf",
                                 "pfedme")
    refused = set(METHODS) - set(FEDERATED_METHODS)  # each class says why in ``federated``
    assert refused == {"local", "perm_hetero", "perm_hetero_paper", "heterofl", "fedrolex", "small_fedavg"}
    assert all(isinstance(METHODS[k].algorithm.federated, str) for k in refused)
    every = list(FEDERATED_METHODS)
    assert _cfg(methods=every, lr={k: 0.1 for k in every}).methods == every


def test_without_flower_the_stage_runs_in_process_and_the_protocol_and_says_what_it_skipped(monkeypatch):
    monkeypatch.setattr(experiment, "flower_installed", lambda: False)
    result = experiment.equivalence(_cfg())
    assert result.engines_run == ["in-process", "loopback"]
    assert result.engines_skipped == ["simulation", "deployment"]
    assert list(result.history["engine"].unique()) == ["in-process", "loopback"]
    assert "flower" not in result.metrics
    for method in ("FedAvg", "PERM"):
        row = result.metrics["loopback"][method]
        assert row["max_abs_diff_accuracy"] <= 1e-4 and row["max_abs_diff_loss"] <= 1e-6
        assert row["accuracy"] == pytest.approx(result.metrics["in_process"][method]["accuracy"], abs=1e-4)
    text = experiment.describe(result.metrics, result.engines_skipped)
    assert "Flower is not installed (pip install -e '.[flower]'" in text
    assert "skipped the simulation and deployment engine(s)" in text


def test_the_cli_says_when_flower_is_missing(monkeypatch, capsys):
    monkeypatch.setattr(experiment, "flower_installed", lambda: False)
    assert experiment.command("simulate", "smoke") == 2
    assert "Flower is not installed: pip install -e '.[flower]'" in capsys.readouterr().out
