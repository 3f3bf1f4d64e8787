"""A stage's config for a test, from params.yaml: the one source of every stage value (issue 27). A test names
only what it changes; every other setting is the stage's own (``config.stage_values``: ``defaults``, the
section, the profile's overlay), so no test keeps a second copy of a stage's values."""
from pflkit.config import load_params, stage_config, stage_values
from pflkit.paths import project_root

PARAMS = load_params(project_root() / "params.yaml")


def values(name: str, profile: str = "default", /, **changes) -> dict:
    """params.yaml's values of stage ``name`` under ``profile`` (runner keys included), with ``changes`` on top
    (``stage``, ``results_dir``, ... may be among them)."""
    return {**stage_values(PARAMS, name, profile), **changes}


def build(name: str, profile: str = "default", /, **changes):
    """Stage ``name``'s config class validated on ``values(name, profile, **changes)`` (a ConfigError names the
    key)."""
    return stage_config(name).build(values(name, profile, **changes))


def _section(section, algorithm, given: dict) -> dict:
    """A full mapping of method section ``section`` for a test's own setting: ``given``, and for every other key
    the algorithm class's default (params.yaml gives every key of a section; a test's hand-made section takes the
    rest from the class, as ``section`` itself did before params.yaml became the one source)."""
    import inspect
    signature = inspect.signature(algorithm.__init__).parameters
    rest = {k: signature[k].default for k in section.model_fields if k not in given and k in signature}
    return {**rest, **given}


def perm_section(**given) -> dict:
    from pflkit.algorithms import PERM
    from pflkit.experiments.curves import PermSection
    return _section(PermSection, PERM, given)


def perfedavg_section(**given) -> dict:
    from pflkit.algorithms import PerFedAvg
    from pflkit.methods import PerFedAvgSection
    return _section(PerFedAvgSection, PerFedAvg, given)


def pfedme_section(**given) -> dict:
    from pflkit.algorithms import PFedMe
    from pflkit.methods import PFedMeSection
    return _section(PFedMeSection, PFedMe, given)
