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
    ("deployment_rounds", 0, r"flower_equivalence\.deployment_rounds: .*greater than or equal to 1"),
    ("deployment_rounds", 3, r"flower_equivalence\.deployment_rounds: 3 must be a round the in-process run "
                             r"evaluates \(a multiple of eval_every = 2, or rounds = 2\) within 1\.\.2"),
])
def test_bad_values_name_the_key_and_what_is_allowed(key, value, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(**{key: value})


@pytest.mark.parametrize("rounds, eval_every, deployment_rounds, accepted", [
    (10, 2, 4, True), (10, 2, 10, True), (10, 3, 10, True), (10, 3, 6, True),
    (10, 2, 3, False), (10, 2, 12, False), (10, 3, 4, False),
])
def test_the_deployment_runs_a_prefix_of_the_rounds_that_ends_on_an_evaluated_round(rounds, eval_every,
                                                                                    deployment_rounds, accepted):
    """issue 55: the deployment engine's rounds (stock Flower: a ClientApp process per message) end on a round the
    in-process run evaluates, so its last evaluation is compared with one."""
    values = dict(rounds=rounds, eval_every=eval_every, deployment_rounds=deployment_rounds)
    if accepted:
        assert _cfg(**values).deployment_rounds == deployment_rounds
    else:
        with pytest.raises(ConfigError, match=r"flower_equivalence\.deployment_rounds: .*must be a round the "):
            _cfg(**values)


def test_the_stage_accepts_the_methods_whose_class_declares_federated():
    """The accepted keys come from the registry's classes (``federated``), not from a list kept by hand."""
    from pflkit.experiments.curves import CURVE_METHODS, FEDERATED_METHODS, HETERO_METHODS, METHODS
    assert FEDERATED_METHODS == ("fedavg", "localized_fedavg", "perm", "perm_alpha", "perm_torchfed", "perfedavg_fo",
                                 "perfedavg_hf", "pfedme", "ditto")
    refused = set(CURVE_METHODS + HETERO_METHODS) - set(FEDERATED_METHODS)  # each class says why in ``federated``
    assert refused == {"local", "perm_hetero", "perm_hetero_paper", "heterofl", "fedrolex", "small_fedavg"}
    assert all(isinstance(METHODS[k].algorithm.federated, str) for k in refused)
    every = list(FEDERATED_METHODS)
    fig1 = stage_values(PARAMS, "perm_fig1")  # the methods' own settings, where this stage gives none
    cfg = _cfg(methods=every, lr={k: 0.1 for k in every}, perm_torchfed={"warmup_rounds": 1}, rounds=4,
               ditto={"lam": 0.1, "personal_steps": None}, perm_alpha={**fig1["perm"], "update_every": 2},
               **{k: fig1[k] for k in ("finetune_steps", "finetune_lr", "perfedavg", "pfedme")})
    assert cfg.methods == every


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


def test_the_torchfed_variant_runs_the_same_through_the_federated_pass_protocol(monkeypatch):
    """PERM (TorchFed shuffle)'s interpolation happens in the server's part of the round (its passes are Alg. 1's
    visits with plain steps), so the loopback protocol, a federation's messages in one process, reproduces it."""
    monkeypatch.setattr(experiment, "flower_installed", lambda: False)
    cfg = _cfg(methods=["perm_torchfed"], lr={"perm_torchfed": 0.5, "fedavg": 0.2}, perm_torchfed={"warmup_rounds": 1})
    result = experiment.equivalence(cfg)
    row = result.metrics["loopback"]["PERM (TorchFed shuffle)"]
    assert row["max_abs_diff_accuracy"] <= 1e-4 and row["max_abs_diff_loss"] <= 1e-6


def test_the_cli_says_when_flower_is_missing(monkeypatch, capsys):
    monkeypatch.setattr(experiment, "flower_installed", lambda: False)
    assert experiment.command("simulate", "smoke") == 2
    assert "Flower is not installed: pip install -e '.[flower]'" in capsys.readouterr().out


def _history(engine_values: dict, base_values: dict):
    """A two-round history of one method on in-process and the simulation engine (accuracy, loss)."""
    import pandas as pd

    rows = []
    for engine, values in (("in-process", base_values), ("simulation", engine_values)):
        for r in (0, 2):
            for metric in ("accuracy", "loss"):
                rows.append({"engine": engine, "round": r, "method": "FedAvg", "seed": 0, "metric": metric,
                             "value": values.get((r, metric), 0.5)})
    return pd.DataFrame(rows)


NAN = float("nan")


@pytest.mark.parametrize("engine, base, verdict, shown", [
    ({}, {}, "reproduces", "largest |difference| 0.00e+00 (loss 0.00e+00)"),
    ({(2, "accuracy"): NAN}, {}, "does NOT reproduce", "largest |difference| NaN (a run's value is not a number) "
                                                        "(loss 0.00e+00)"),
    ({(0, "loss"): NAN}, {}, "does NOT reproduce", "(loss NaN (a run's value is not a number))"),
    ({}, {(2, "accuracy"): NAN, (2, "loss"): NAN}, "does NOT reproduce", "largest |difference| NaN"),
], ids=["equal", "engine accuracy NaN", "engine loss NaN at round 0", "in-process NaN"])
def test_a_nan_on_either_side_of_the_equivalence_check_reads_as_a_failure(engine, base, verdict, shown):
    """``.abs().max()`` skips NaN: a NaN difference used to print as 0.00e+00 and pass. Now it is no number
    within the tolerance (of accuracy, and a NaN loss difference fails too): the verdict fails, metrics.json
    keeps it as null, and the text says NaN."""
    history = _history(engine, base)
    table = experiment.final_table(history, 2)
    metrics = experiment.summary(table, history, ["in-process", "simulation"])
    row = metrics["flower"]["simulation"]["FedAvg"]
    assert row["within_tolerance"] is (verdict == "reproduces")
    assert set(metrics["in_process"]["FedAvg"]) <= {"accuracy", "loss"}  # no difference columns of its own
    text = experiment.describe(metrics)
    assert f"Flower simulation (Ray) {verdict} in-process FedAvg" in text and shown in text
