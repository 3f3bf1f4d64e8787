"""PERM paper (Deng et al.) experiments: configs and figure functions behind notebooks/perm/."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import pandas as pd
from pydantic import Field, field_validator, model_validator

from ..algorithms import FedAvg, Local, LocalizedFedAvg
from ..config import StageConfig, register
from ..data.synthetic import perm_synthetic
from ..engine import FunctionalModel, resolve_device
from ..models import logistic
from ..report import environment, table_records
from ..runner import final_table, run_methods

# method key (params.yaml) -> (display name, factory(model, cfg, lr))
METHODS: dict[str, tuple[str, Callable]] = {
    "local": ("Local", lambda m, c, lr: Local(m, local_steps=c.local_steps, lr=lr, batch_size=c.batch_size)),
    "fedavg": ("FedAvg", lambda m, c, lr: FedAvg(m, local_steps=c.local_steps, lr=lr, batch_size=c.batch_size)),
    "localized_fedavg": ("Localized FedAvg", lambda m, c, lr: LocalizedFedAvg(
        m, local_steps=c.local_steps, lr=lr, batch_size=c.batch_size,
        finetune_steps=c.finetune_steps, finetune_lr=c.finetune_lr)),
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


def fig1(cfg: PermFig1Config, show_progress: bool = True) -> CurvesResult:
    """Personalized accuracy/loss vs rounds on PERM's synthetic two-group data (Fig. 1)."""
    device = resolve_device(cfg.device)
    model = FunctionalModel(lambda: logistic((cfg.dim,), 2), device)

    def data_for_seed(seed: int):
        return perm_synthetic(cfg.num_clients, cfg.samples_per_client, cfg.dim, cfg.test_fraction,
                              seed=seed).to(device)

    methods = {METHODS[k][0]: (lambda k=k: METHODS[k][1](model, cfg, cfg.lr[k])) for k in cfg.methods}
    start = time.perf_counter()
    history = run_methods(methods, data_for_seed, cfg.seeds, cfg.rounds, cfg.eval_every, show_progress)
    elapsed = time.perf_counter() - start
    table = final_table(history, ("accuracy", "accuracy_weighted", "loss"))
    data = data_for_seed(cfg.seeds[0])
    scale = f"N={cfg.num_clients}, {cfg.samples_per_client} samples/client, d={cfg.dim}, " \
            f"{cfg.rounds} rounds, {len(cfg.seeds)} seeds"
    metrics = {"dataset": data.name, "paper_dataset": data.paper_dataset or data.name,
               "is_substitute": data.is_substitute, "final": table_records(table),
               "runtime_s": round(elapsed, 2)}
    run_info = {"stage": cfg.stage, "scale": scale, "data": data.summary(), "device": str(device),
                "environment": environment(), "config": cfg.model_dump()}
    return CurvesResult(history, table, data.label, scale, metrics, run_info)
