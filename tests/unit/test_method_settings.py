"""params.yaml reaches every method: client sampling, aggregation weighting and minibatch order are
set from a stage's config (the way published FedAvg / Per-FedAvg / pFedMe setups are written)."""
import pytest

from pflkit.algorithms import FedAvg, LocalizedFedAvg, PerFedAvg, PFedMe
from pflkit.algorithms.perm import PERM
from pflkit.config import ConfigError, load_params, stage_values
from pflkit.engine import FunctionalModel
from pflkit.experiments import perm as E
from pflkit.models import logistic
from pflkit.paths import project_root

ROOT = project_root()


def smoke_config(**changes):
    values = stage_values(load_params(ROOT / "params.yaml"), "perm_fig1", "smoke")
    values.update(changes)
    return E.PermFig1Config.build(values)


def test_server_settings_reach_the_fedavg_family():
    cfg = smoke_config(clients_per_round=3, weighting="samples", methods=["fedavg", "localized_fedavg",
                                                                          "perfedavg_fo", "pfedme", "perm"])
    model = FunctionalModel(lambda: logistic((cfg.dim,), 2))
    built = {k: E.METHODS[k].make(model, cfg) for k in cfg.methods}
    for key, cls in (("fedavg", FedAvg), ("localized_fedavg", LocalizedFedAvg), ("perfedavg_fo", PerFedAvg),
                     ("pfedme", PFedMe)):
        assert isinstance(built[key], cls)
        assert built[key].clients_per_round == 3 and built[key].weighting == "samples"
    assert isinstance(built["perm"], PERM)  # PERM's shuffling has every client host a model each round


@pytest.mark.parametrize("section", ["perm", "perfedavg", "pfedme"])
def test_a_method_section_has_no_code_default_and_a_missing_key_is_named(section):
    """params.yaml is the one source of the methods' settings: every key of their sections is required (a
    profile's overlay replaces the whole mapping and gives every key), and one left out is named."""
    cls = type(getattr(smoke_config(), section))
    assert all(field.is_required() for field in cls.model_fields.values()), cls
    values = stage_values(load_params(ROOT / "params.yaml"), "perm_fig1", "smoke")[section]
    dropped = sorted(values)[0]
    with pytest.raises(ConfigError, match=rf"perm_fig1\.{section}\.{dropped}: .*[Ff]ield required"):
        smoke_config(**{section: {k: v for k, v in values.items() if k != dropped}})


def test_shuffled_batch_order_runs_and_differs_from_with_replacement():
    base = smoke_config(methods=["fedavg"], seeds=[0], rounds=2)
    a = E.fig1(base, show_progress=False, checkpoint=False).table
    b = E.fig1(smoke_config(methods=["fedavg"], seeds=[0], rounds=2, batch_order="shuffled"),
               show_progress=False, checkpoint=False).table
    assert a.loc["FedAvg", "loss_mean"] != b.loc["FedAvg", "loss_mean"]


@pytest.mark.parametrize("changes, match", [
    (dict(clients_per_round=0), r"clients_per_round: .*greater than or equal to 1"),
    (dict(clients_per_round=11), r"clients_per_round: 11 > num_clients = 10"),
    (dict(weighting="by-size"), r"weighting: .*'uniform' or 'samples'"),
    (dict(batch_order="sorted"), r"batch_order: .*'replacement' or 'shuffled'"),
])
def test_bad_server_settings_name_the_key(changes, match):
    with pytest.raises(ConfigError, match=match):
        smoke_config(**changes)
