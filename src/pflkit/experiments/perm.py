"""PERM paper (Deng et al.) experiments: configs and figure functions behind notebooks/perm/.

Every curve figure (Figs. 1, 2, 4) runs the same loop: build the federation for a seed, run every
method for the same number of communication rounds (PERM: one shuffle step = one round, see
``pflkit.algorithms.perm``), and evaluate each client's personalized model on its own test split.
Per-method learning rates live in ``lr``; method-specific settings in their own sections.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..algorithms import FedAvg, Local, LocalizedFedAvg
from ..algorithms.perm import ALPHA_INITS, ALPHA_SOLVERS, PERM
from ..config import StageConfig, register
from ..data.federated import FederatedDataset
from ..data.synthetic import perm_synthetic
from ..engine import FunctionalModel, resolve_device
from ..models import logistic
from ..report import environment, table_records
from ..runner import final_table, run_methods


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PermSection(Section):
    """PERM's own settings (see pflkit.algorithms.perm.PERM)."""
    lam: float = Field(300.0, ge=0)
    alpha_solver: str = "gd"
    alpha_steps: int = Field(50, ge=1)
    alpha_samples: int | None = Field(None, ge=1)
    global_lr: float = Field(0.5, gt=0)
    global_steps: int = Field(1, ge=0)
    warmup_rounds: int = Field(0, ge=0)
    alpha_init: str = "uniform"
    update_every: int | str | None = 5

    @field_validator("alpha_solver")
    @classmethod
    def _solver(cls, v):
        if v not in ALPHA_SOLVERS:
            raise ValueError(f"must be one of {ALPHA_SOLVERS}, got {v!r}")
        return v

    @field_validator("alpha_init")
    @classmethod
    def _init(cls, v):
        if v not in ALPHA_INITS:
            raise ValueError(f"must be one of {ALPHA_INITS}, got {v!r}")
        return v

    @field_validator("update_every")
    @classmethod
    def _every(cls, v):
        if v is None or v == "epoch" or (isinstance(v, int) and v >= 1):
            return v
        raise ValueError(f"must be an integer >= 1, 'epoch' or null, got {v!r}")


def _local(m, c):
    return Local(m, local_steps=c.local_steps, lr=c.lr["local"], batch_size=c.batch_size)


def _fedavg(m, c):
    return FedAvg(m, local_steps=c.local_steps, lr=c.lr["fedavg"], batch_size=c.batch_size)


def _localized(m, c):
    return LocalizedFedAvg(m, local_steps=c.local_steps, lr=c.lr["localized_fedavg"], batch_size=c.batch_size,
                           finetune_steps=c.finetune_steps, finetune_lr=c.finetune_lr)


def _perm(m, c):
    p = c.perm
    return PERM(m, local_steps=c.local_steps, lr=c.lr["perm"], batch_size=c.batch_size, lam=p.lam,
                alpha_solver=p.alpha_solver, alpha_steps=p.alpha_steps, alpha_samples=p.alpha_samples,
                global_lr=p.global_lr, global_steps=p.global_steps, warmup_rounds=p.warmup_rounds,
                warmup_lr=c.lr.get("fedavg"), alpha_init=p.alpha_init, update_every=p.update_every)


# method key (params.yaml) -> (display name, factory(model, cfg))
METHODS: dict[str, tuple[str, Callable]] = {
    "local": ("Local", _local),
    "fedavg": ("FedAvg", _fedavg),
    "localized_fedavg": ("Localized FedAvg", _localized),
    "perm": ("PERM", _perm),
}


class RunConfig(StageConfig):
    """Fields shared by the PERM curve figures."""
    rounds: int = Field(ge=1)
    local_steps: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    lr: dict[str, float]
    finetune_steps: int = Field(ge=1)
    finetune_lr: float = Field(gt=0)
    methods: list[str]
    seeds: list[int] = Field(min_length=1)
    eval_every: int = Field(ge=1)
    perm: PermSection = PermSection()

    @field_validator("methods")
    @classmethod
    def _methods(cls, v):
        bad = [m for m in v if m not in METHODS]
        if bad or not v:
            raise ValueError(f"methods must be a non-empty list from {sorted(METHODS)}; unknown: {bad}")
        return v

    @field_validator("lr")
    @classmethod
    def _lr(cls, v):
        bad = {k: x for k, x in v.items() if k not in METHODS or not x > 0}
        if bad:
            raise ValueError(f"lr maps method names {sorted(METHODS)} to values > 0; bad entries: {bad}")
        return v

    @model_validator(mode="after")
    def _lr_for_each_method(self):
        missing = [m for m in self.methods if m not in self.lr]
        if missing:
            raise ValueError(f"lr has no value for methods {missing}")
        return self


@register("perm_fig1")
class PermFig1Config(RunConfig):
    num_clients: int = Field(ge=2)
    samples_per_client: int = Field(ge=4)
    dim: int = Field(ge=1)
    test_fraction: float = Field(gt=0, lt=1)


@dataclass
class CurvesResult:
    history: pd.DataFrame  # tidy: round, method, seed, metric, value
    table: pd.DataFrame  # final-round mean/std per method
    data_label: str
    scale: str
    metrics: dict  # -> metrics.json (numbers + which dataset ran)
    run_info: dict  # -> run.json (config, data summary, environment)


def run_curves(cfg: RunConfig, model_factory: Callable, data_for_seed: Callable[[int], FederatedDataset],
               scale: str, show_progress: bool = True) -> CurvesResult:
    """Every configured method x seed for cfg.rounds rounds; final table, metrics and run info."""
    device = resolve_device(cfg.device)
    model = FunctionalModel(model_factory, device)
    methods = {METHODS[k][0]: (lambda k=k: METHODS[k][1](model, cfg)) for k in cfg.methods}
    start = time.perf_counter()
    history = run_methods(methods, lambda s: data_for_seed(s).to(device), cfg.seeds, cfg.rounds, cfg.eval_every,
                          show_progress)
    elapsed = time.perf_counter() - start
    table = final_table(history, ("accuracy", "accuracy_weighted", "loss"))
    data = data_for_seed(cfg.seeds[0])
    metrics = {"dataset": data.name, "paper_dataset": data.paper_dataset or data.name,
               "is_substitute": data.is_substitute, "final": table_records(table),
               "runtime_s": round(elapsed, 2)}
    run_info = {"stage": cfg.stage, "scale": scale, "data": data.summary(), "device": str(device),
                "environment": environment(), "config": cfg.model_dump()}
    return CurvesResult(history, table, data.label, scale, metrics, run_info)


def fig1(cfg: PermFig1Config, show_progress: bool = True) -> CurvesResult:
    """Personalized accuracy/loss vs rounds on PERM's synthetic two-group data (Fig. 1)."""
    scale = (f"N={cfg.num_clients}, {cfg.samples_per_client} samples/client, d={cfg.dim}, "
             f"{cfg.rounds} rounds, {len(cfg.seeds)} seeds")
    return run_curves(cfg, lambda: logistic((cfg.dim,), 2),
                      lambda seed: perm_synthetic(cfg.num_clients, cfg.samples_per_client, cfg.dim,
                                                  cfg.test_fraction, seed=seed),
                      scale, show_progress)


# --------------------------------------------------------------------------- Fig. 6: alpha heat maps
class DatasetSection(Section):
    """Which image dataset a stage asks for, and the named offline substitute when it cannot be had."""
    name: str
    substitute: str | None = None
    allow_download: bool = True
    root: str = "data/raw"


@register("perm_fig6")
class PermFig6Config(StageConfig):
    dataset: DatasetSection
    num_clients: int = Field(ge=2)
    schemes: dict[str, dict] = Field(min_length=1)  # panel name -> partition (scheme + kwargs)
    test_fraction: float = Field(gt=0, lt=1)
    hidden: list[int] = Field(min_length=1)
    fedavg_rounds: int = Field(ge=1)
    local_steps: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    lr: float = Field(gt=0)
    lam: float = Field(gt=0)
    seed: int = 0

    @field_validator("schemes")
    @classmethod
    def _schemes(cls, v):
        from ..data.partition import PARTITIONS
        for panel, spec in v.items():
            if spec.get("scheme") not in PARTITIONS:
                raise ValueError(f"{panel}: scheme must be one of {PARTITIONS}, got {spec.get('scheme')!r}")
        return v


def load_images(ds: DatasetSection):
    from ..data.vision import load_dataset
    from ..paths import resolve
    return load_dataset(ds.name, root=resolve(ds.root), allow_download=ds.allow_download, substitute=ds.substitute)


def dataset_record(img) -> dict:
    """What actually ran, for metrics.json: never lets a substitute pass as the paper's data."""
    return {"dataset": img.name, "paper_dataset": img.paper_dataset, "is_substitute": img.is_substitute,
            "source": img.source}


def alpha_summary(alpha, data: FederatedDataset) -> dict:
    """Mass on clients sharing the majority label, effective support 1/sum a^2, self weight."""
    import torch
    label = data.label_counts().argmax(1).to(alpha.device)
    same = (label[:, None] == label[None, :]).to(alpha.dtype)
    mass = (alpha * same).sum(1)
    return {"same_label_mass_mean": float(mass.mean()), "same_label_mass_min": float(mass.min()),
            "effective_support_mean": float((1.0 / (alpha ** 2).sum(1)).mean()),
            "self_weight_mean": float(torch.diagonal(alpha).mean())}


@dataclass
class AlphaPanel:
    alpha: "object"  # [N, N] float64 tensor
    order: "object"  # client order for display (sorted by majority label)
    labels: "object"  # majority label per client
    summary: dict


def fig6(cfg: PermFig6Config) -> tuple[dict[str, AlphaPanel], dict]:
    """Two-stage PERM's alpha (Alg. 3): FedAvg for R rounds, then alpha at w^R, per partition."""
    from ..algorithms.perm import mixing_weights
    from ..data.vision import federate
    from ..models import mlp

    device = resolve_device(cfg.device)
    img = load_images(cfg.dataset)
    model = FunctionalModel(lambda: mlp(img.shape, img.num_classes, hidden=tuple(cfg.hidden)), device)
    panels = {}
    for panel, spec in cfg.schemes.items():
        spec = dict(spec)
        data = federate(img, cfg.num_clients, spec.pop("scheme"), seed=cfg.seed, test_fraction=cfg.test_fraction,
                        **spec).to(device)
        fed = FedAvg(model, local_steps=cfg.local_steps, lr=cfg.lr, batch_size=cfg.batch_size)
        state = fed.init(data, cfg.seed)
        for _ in range(cfg.fedavg_rounds):
            state = fed.round(state)
        alpha = mixing_weights(model, state.w, data, cfg.lam, solver="exact").cpu()
        labels = data.label_counts().argmax(1)
        panels[panel] = AlphaPanel(alpha, labels.argsort(stable=True), labels, alpha_summary(alpha, data))
    return panels, dataset_record(img)
