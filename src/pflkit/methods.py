"""The methods the stages run, one record each (``Method``): key (params.yaml), display name, factory from a
stage config, algorithm class, the settings it needs and their section's model, whether its paper runs it.

Torch-free: the plot stages read the names here (and their styles by the same keys: ``plotting.STYLES``);
``Method.algorithm`` imports the class when asked, ``Method.make`` builds the method through its factory. A
method's own settings section is defined here beside its record (the curve stages' configs get one optional
field per section: ``experiments.curves.MethodSettings``); PERM's, validated with the library's alpha solvers,
is ``experiments.curves.PermSection``.
"""
from __future__ import annotations

from typing import Callable, Literal, NamedTuple

from pydantic import Field

from .config import Section
from .stages import resolve

_COLLABORATIVE = "pflkit.algorithms.collaborative"


class TorchFedSection(Section):
    """PERM (TorchFed shuffle)'s one setting: the FedAvg warm-up rounds before alpha is estimated (the source's
    ``num_comms_warmup``, configs/_base_/federated/fedshuffle.py)."""
    warmup_rounds: int = Field(ge=1)


class PerFedAvgSection(Section):
    """Per-FedAvg's inner step alpha (its outer step beta is lr['perfedavg_fo' | 'perfedavg_hf'])."""
    alpha: float = Field(ge=0)
    delta: float = Field(gt=0)  # finite-difference Hessian-vector products (HF)


class PFedMeSection(Section):
    """pFedMe's personal lr, lambda, K inner steps and server mixing beta (its lr is lr['pfedme'])."""
    personal_lr: float = Field(gt=0)
    lam: float = Field(gt=0)
    inner_steps: int = Field(ge=1)
    beta: float = Field(gt=0)


class DittoSection(Section):
    """Ditto's personal models (see pflkit.algorithms.ditto.Ditto): the pull lambda towards the global model and
    their SGD steps per round (null: local_steps); both models step at lr['ditto'] (one learning rate, as
    ``lr_sweep`` tunes one per method)."""
    lam: float = Field(ge=0)
    personal_steps: int | None = Field(ge=1)


def _local(cls, m, c):
    return cls(m, local_steps=c.local_steps, lr=c.lr["local"], batch_size=c.batch_size)


def _server(c) -> dict:
    """The FedAvg family's server settings from the config: participants per round and weighting."""
    return {"clients_per_round": c.clients_per_round, "weighting": c.weighting}


def _fedavg(cls, m, c):
    return cls(m, local_steps=c.local_steps, lr=c.lr["fedavg"], batch_size=c.batch_size, **_server(c))


def _localized(cls, m, c):
    return cls(m, local_steps=c.local_steps, lr=c.lr["localized_fedavg"], batch_size=c.batch_size,
               finetune_steps=c.finetune_steps, finetune_lr=c.finetune_lr, **_server(c))


def _perm(cls, m, c, key: str = "perm", visit: str = "shuffle"):
    """PERM from section ``key`` and lr[key]: 'perm' is Alg. 1 as written; 'perm_alpha' the variant whose
    rounds visit clients in proportion to alpha (``PERM(visit='alpha')``); 'perm_torchfed' TorchFed's fedshuffle
    rule (``PERM(visit='interpolate')``); each variant with its own section and lr."""
    return cls(m, **_perm_settings(c, getattr(c, key), c.lr[key], c.lr.get("fedavg")), visit=visit)


def _perm_torchfed(cls, m, c):
    """TorchFed's fedshuffle (``PERM(visit='interpolate', alpha_init='correlation')``, two-stage as the source:
    alpha estimated once, after ``perm_torchfed.warmup_rounds`` FedAvg rounds at lr['fedavg']), K plain steps at
    lr['perm_torchfed']. Its alpha is no eq. (2) problem, so no lambda (0 is passed, never read)."""
    return cls(m, local_steps=c.local_steps, lr=c.lr["perm_torchfed"], batch_size=c.batch_size, lam=0.0,
               warmup_rounds=c.perm_torchfed.warmup_rounds, warmup_lr=c.lr.get("fedavg"), alpha_init="correlation",
               update_every=None, visit="interpolate")


def _perm_settings(c, p, lr: float, warmup_lr: float | None) -> dict:
    """PERM's settings from the run config ``c`` and its PERM section ``p`` (PERM's, or PERM-hetero's)."""
    return dict(local_steps=c.local_steps, lr=lr, batch_size=c.batch_size, lam=p.lam, alpha_solver=p.alpha_solver,
                alpha_steps=p.alpha_steps, alpha_samples=p.alpha_samples, global_lr=p.global_lr,
                global_steps=p.global_steps, warmup_rounds=p.warmup_rounds, warmup_lr=warmup_lr,
                alpha_init=p.alpha_init, update_every=p.update_every)


def _perfedavg(variant):
    def make(cls, m, c):
        return cls(m, alpha=c.perfedavg.alpha, beta=c.lr[f"perfedavg_{variant}"], local_steps=c.local_steps,
                   batch_size=c.batch_size, variant=variant, delta=c.perfedavg.delta, **_server(c))
    return make


def _pfedme(cls, m, c):
    p = c.pfedme
    return cls(m, lr=c.lr["pfedme"], personal_lr=p.personal_lr, lam=p.lam, local_steps=c.local_steps,
               batch_size=c.batch_size, inner_steps=p.inner_steps, beta=p.beta, **_server(c))


def _ditto(cls, m, c):
    d = c.ditto
    return cls(m, lr=c.lr["ditto"], local_steps=c.local_steps, batch_size=c.batch_size, lam=d.lam,
               personal_lr=c.lr["ditto"], personal_steps=d.personal_steps or c.local_steps, **_server(c))


#: PERM-hetero's method keys -> the discrepancy each runs with (None: the ``perm`` section's; 'paper': Sec. 3.3's D
#: as written, shown beside it)
PERM_HETERO_DISCREPANCY = {"perm_hetero": None, "perm_hetero_paper": "paper"}


def perm_hetero_section(key: str, c):
    """The ``perm`` section PERM-hetero's method ``key`` runs with (a PERM_HETERO_DISCREPANCY key): the config's,
    its discrepancy replaced where the key names one."""
    discrepancy = PERM_HETERO_DISCREPANCY[key]
    return c.perm if discrepancy is None else c.perm.model_copy(update={"discrepancy": discrepancy})


def _perm_hetero(key: str):
    """PERM-hetero from its ``perm`` section (``perm_hetero_section``); its warm-up FedAvg runs at HeteroFL's lr."""
    def make(cls, m, c, spec, fractions):
        p = perm_hetero_section(key, c)
        return cls(m, spec, fractions=fractions, extraction=p.extraction, complexity=p.complexity,
                   discrepancy=p.discrepancy, name=METHODS[key].name,
                   **_perm_settings(c, p, c.lr[key], c.lr.get("heterofl")))
    return make


def _partial(key: str, extraction: str, smallest: bool = False):
    """Partial-training FedAvg (static: HeteroFL, rolling: FedRolex) fine-tuned locally; ``smallest``: everyone
    trains the smallest budget's model (small-model FedAvg)."""
    def make(cls, m, c, spec, fractions):
        widths = [min(c.budgets)] * len(fractions) if smallest else fractions
        return cls(m, spec, fractions=widths, extraction=extraction, local_steps=c.local_steps, lr=c.lr[key],
                   batch_size=c.batch_size, finetune_steps=c.finetune_steps, finetune_lr=c.finetune_lr,
                   name=METHODS[key].name)
    return make


class Method(NamedTuple):
    """One method: its display name (history, tables, figures), its factory reading a stage config's fields
    (``factory(cls, model, cfg, ...)``; None: a stage runs it itself), the algorithm class's import path (the
    class declares ``federated``, ``tolerates_missing``), and the stages that run it: ``family`` "curves" (PERM's
    curve, timing and Flower stages: ``make(model, cfg)``), "hetero" (perm_hetero, whose clients train
    sub-models: ``make(model, cfg, spec, fractions)``, the width spec and each client's budget) or "speedup"
    (Chayti et al.'s collaborative runs); ``needs``: the config fields of the method's own settings, which a stage
    gives only when its ``methods`` lists the method (``experiments.curves.missing_settings``); ``section``: the
    model of its own settings section, the config field ``needs[0]`` (every curve stage's config gets that field,
    optional: ``experiments.curves.MethodSettings``)."""
    name: str
    factory: Callable | None
    path: str
    family: Literal["curves", "hetero", "speedup"] = "curves"
    needs: tuple[str, ...] = ()
    #: whether the method's paper runs it (the PERM paper's claims compare PERM with these only); False: a
    #: baseline beyond the paper, compared with PERM in a ledger row of its own (``claim_perm_vs_<key>``)
    paper: bool = True
    section: type[Section] | None = None

    @property
    def algorithm(self) -> type:
        """The algorithm class, imported when asked: the record itself loads no torch. (By name: the static import
        walk behind DVC's deps, ``scripts/dvc_stages.py``, then does not count the algorithms among a plot
        stage's code; every compute stage imports them itself.)"""
        return resolve(self.path)

    def make(self, *args):
        """The method built by its factory: ``factory(algorithm, *args)``, ``args`` the model and the stage
        config (and for "hetero", the width spec and the budgets)."""
        return self.factory(self.algorithm, *args)


def _in(cls: str, module: str = "pflkit.algorithms") -> str:
    return f"{module}:{cls}"


# method key (params.yaml) -> Method: the one registry of every method a stage runs by key, and of Chayti et
# al.'s (charles_nn's grids are settings of one method, LocalUpdate). Their plot styles, keyed by the same keys,
# are the plot stages' (``plotting.STYLES``): a colour change re-runs no training.
METHODS: dict[str, Method] = {
    "local": Method("Local", _local, _in("Local")),
    "fedavg": Method("FedAvg", _fedavg, _in("FedAvg")),
    "localized_fedavg": Method("Localized FedAvg", _localized, _in("LocalizedFedAvg"),
                               needs=("finetune_steps", "finetune_lr")),
    "perm": Method("PERM", _perm, _in("PERM")),
    "perm_alpha": Method("PERM (alpha visits)", lambda cls, m, c: _perm(cls, m, c, "perm_alpha", "alpha"),
                         _in("PERM"), needs=("perm_alpha",)),
    "perm_torchfed": Method("PERM (TorchFed shuffle)", _perm_torchfed, _in("PERM"), needs=("perm_torchfed",),
                            section=TorchFedSection),
    "perfedavg_fo": Method("Per-FedAvg (FO)", _perfedavg("fo"), _in("PerFedAvg"), needs=("perfedavg",),
                           section=PerFedAvgSection),
    "perfedavg_hf": Method("Per-FedAvg (HF)", _perfedavg("hf"), _in("PerFedAvg"), needs=("perfedavg",),
                           section=PerFedAvgSection),
    "pfedme": Method("pFedMe", _pfedme, _in("PFedMe"), needs=("pfedme",), section=PFedMeSection),
    "ditto": Method("Ditto", _ditto, _in("Ditto"), needs=("ditto",), paper=False, section=DittoSection),
    "perm_hetero": Method("PERM-hetero", _perm_hetero("perm_hetero"), _in("PERMHetero"), "hetero"),
    "perm_hetero_paper": Method("PERM-hetero (paper D)", _perm_hetero("perm_hetero_paper"), _in("PERMHetero"),
                                "hetero"),
    "heterofl": Method("HeteroFL + FT", _partial("heterofl", "static"), _in("PartialFedAvg"), "hetero"),
    "fedrolex": Method("FedRolex + FT", _partial("fedrolex", "rolling"), _in("PartialFedAvg"), "hetero"),
    "small_fedavg": Method("Small-model FedAvg + FT", _partial("small_fedavg", "static", smallest=True),
                           _in("PartialFedAvg"), "hetero"),
    "alone": Method("Alone", None, _in("Alone", _COLLABORATIVE), "speedup"),
    "wga": Method("WGA", None, _in("WGA", _COLLABORATIVE), "speedup"),
    "bc": Method("BC", None, _in("BC", _COLLABORATIVE), "speedup"),
}

#: the method keys of PERM (Alg. 1 first) and its variants, each with its own section of the curve stages
PERM_VARIANTS = ("perm", "perm_alpha", "perm_torchfed")
