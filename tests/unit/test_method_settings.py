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


@pytest.mark.parametrize("section", ["perm", "perfedavg", "pfedme", "ditto"])
def test_a_method_section_has_no_code_default_and_a_missing_key_is_named(section):
    """params.yaml is the one source of the methods' settings: every key of their sections is required (a
    profile's overlay replaces the whole mapping and gives every key), and one left out is named."""
    cls = type(getattr(smoke_config(), section))
    assert all(field.is_required() for field in cls.model_fields.values()), cls
    values = stage_values(load_params(ROOT / "params.yaml"), "perm_fig1", "smoke")[section]
    dropped = sorted(values)[0]
    with pytest.raises(ConfigError, match=rf"perm_fig1\.{section}\.{dropped}: .*[Ff]ield required"):
        smoke_config(**{section: {k: v for k, v in values.items() if k != dropped}})


def test_a_records_section_is_an_optional_field_of_every_config_that_runs_curve_methods():
    """A method's section is defined once, beside its record (``Method.section``, the config field ``needs[0]``):
    every config that names curve methods by key gets that field (``curves.MethodSettings``), None unless given,
    and records sharing a field share its model. So the timing stage may time Ditto, as any curve method."""
    from pflkit.experiments.curves import RunConfig
    from pflkit.methods import DittoSection, PerFedAvgSection, PFedMeSection, TorchFedSection
    sections = {}
    for key, method in E.METHODS.items():
        if method.section is not None:
            assert sections.setdefault(method.needs[0], method.section) is method.section, key
    assert sections == {"perm_torchfed": TorchFedSection, "perfedavg": PerFedAvgSection, "pfedme": PFedMeSection,
                        "ditto": DittoSection}
    for cls in (RunConfig, E.PermFig1Config, E.ImageCurvesConfig, E.PermFig3Config):
        for name, model in sections.items():
            field = cls.model_fields[name]
            assert field.default is None and field.annotation == model | None, (cls, name)
    values = stage_values(load_params(ROOT / "params.yaml"), "perm_fig3", "smoke")
    with pytest.raises(ConfigError, match=r"perm_fig3\.ditto: not given, but methods lists ditto"):
        E.PermFig3Config.build({**values, "methods": ["ditto"], "lr": {"ditto": 0.1}})
    cfg = E.PermFig3Config.build({**values, "methods": ["ditto"], "lr": {"ditto": 0.1},
                                  "ditto": {"lam": 0.01, "personal_steps": None}})
    assert cfg.ditto == DittoSection(lam=0.01, personal_steps=None)


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
