"""PERM with heterogeneous client models (Sec. 3.3): stage ``perm_hetero``.

Claim under test (the paper states it without an experiment): PERM lets every client train a
personalized model sized to its own compute/memory budget. Clients get width budgets r (e.g.
{1, 1/2, 1/4, 1/8} of an MLP, equally many clients each, assigned by a fixed seeded permutation);
the data is label-skewed. Methods, all with the same rounds and K local steps per round:

* ``perm_hetero``: PERM-hetero (``pflkit.algorithms.perm_hetero.PERMHetero``) with the perm
  section's ``discrepancy``; ``perm_hetero_paper``: the same with Sec. 3.3's discrepancy as written
  (``discrepancy='paper'``), shown for comparison (the claim is checked on ``perm_hetero``);
* ``heterofl``: partial-training FedAvg with static extraction (HeteroFL), then each client's
  static width-r slice fine-tuned locally;
* ``fedrolex``: the same with rolling extraction (FedRolex), fine-tuned locally;
* ``small_fedavg``: FedAvg of the smallest budget's model for everyone, fine-tuned locally.

Outputs: personalized test accuracy per budget group (final round, mean/sd over seeds), the
curves, and per-client cost per round (parameters held, peak memory, FLOPs, communication) from the
formulas of the ``pflkit.algorithms.perm_hetero`` docstring (``cost_table``).
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd
import torch
from pydantic import Field, field_validator, model_validator

from .. import model_store
from ..algorithms.perm_hetero import DISCREPANCIES
from ..config import (Footprint, PositiveInt, Section, Seed, Seeds, StageConfig, federated_memory, image_features,
                      names_from, one_of, raise_problems)
from ..data.vision import image_partition_problems
from ..engine import FunctionalModel, resolve_device
from ..eval import evaluate, majority_baseline
from ..models.width import EXTRACTIONS, masks_for, mlp_spec, num_parameters
from ..report import StageResult, environment
from ..runner import run_methods
from .curves import (HETERO_METHODS, METHODS, PERM_HETERO_DISCREPANCY, HeteroStepSizes, PermSection, missing_lrs,
                     perm_hetero_section)
from .curves import save_models  # noqa: F401  (the notebook's ``experiment.save_models``: the shared one)
from .images import DatasetSection, dataset_record, image_federation, load_images

MethodNames = names_from(HETERO_METHODS)
Extraction = one_of(EXTRACTIONS)
Discrepancy = one_of(DISCREPANCIES)


class PermHeteroSection(PermSection):
    """PERM's settings plus the global model's extraction and the complexity constant kappa."""
    extraction: Extraction
    complexity: float = Field(ge=0)
    discrepancy: Discrepancy  # paper: Sec. 3.3's D as written; shared: on the common slice


class ClaimSection(Section):
    tolerance: float = Field(ge=0)  # PERM-hetero may trail the best baseline by this much per group


class PermHeteroConfig(StageConfig):
    dataset: DatasetSection
    num_clients: int = Field(ge=2)
    partition: dict  # {scheme: iid | classes | dirichlet, ...options}, checked below
    pool_size: int | None = Field(ge=2)
    test_fraction: float = Field(gt=0, lt=1)
    hidden: list[PositiveInt] = Field(min_length=1)
    budgets: list[float] = Field(min_length=1)
    budget_seed: Seed
    rounds: int = Field(ge=1)
    local_steps: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    lr: HeteroStepSizes
    finetune_steps: int = Field(ge=0)
    finetune_lr: float = Field(gt=0)
    methods: MethodNames
    seeds: Seeds
    eval_every: int = Field(ge=1)
    perm: PermHeteroSection
    claim: ClaimSection

    def footprint(self) -> Footprint:
        return federated_memory(self.num_clients, self.local_steps, self.batch_size, image_features(self.dataset.name),
                                tuple(self.hidden))

    @field_validator("budgets")
    @classmethod
    def _budgets(cls, v):
        bad = [r for r in v if not 0 < r <= 1]
        if bad:
            raise ValueError(f"every budget must be a width fraction in (0, 1]; bad: {bad}")
        return v

    @model_validator(mode="after")
    def _cross_checks(self):
        problems = missing_lrs(self.lr, self.methods)
        if self.num_clients < len(self.budgets):
            problems.append(("num_clients", f"{self.num_clients} is fewer than the {len(self.budgets)} budgets; "
                                            f"allowed: num_clients >= {len(self.budgets)}"))
        problems += image_partition_problems(self.dataset, self.partition, self.num_clients, self.pool_size,
                                             allow_natural=False)
        raise_problems(problems)
        return self


def client_budgets(cfg: PermHeteroConfig) -> list[float]:
    """Width fraction per client: budgets dealt round-robin over a seeded permutation of clients
    (equal group sizes up to one; independent of the data split)."""
    order = np.random.default_rng(cfg.budget_seed).permutation(cfg.num_clients)
    out = [0.0] * cfg.num_clients
    for rank, client in enumerate(order):
        out[int(client)] = float(cfg.budgets[rank % len(cfg.budgets)])
    return out


def cost_table(cfg: PermHeteroConfig, spec, fractions: list[float], mean_train_size: float) -> pd.DataFrame:
    """Per client per round, by method and budget group (mean over the group's clients):

    * params: coordinates of the model the client trains (its sub-model; PERM-hetero: the slice
      min(r_i, r_j) of each visiting model, averaged over an epoch);
    * peak_memory_mb: 8 P_max bytes (fp32 weights + gradients of the largest model it ever trains);
    * train_mflops: 6 P B K per local-training round (2 P B forward + 4 P B backward per step) plus,
      for PERM-hetero, the amortized global step + alpha gradients, (global_steps P_j + A_j) 6 S
      every ``update_every`` rounds (S = alpha_samples or the mean train size; A_j = P_j, or for
      the 'shared' discrepancy the sum of P_r over the widths r <= r_j), and its warm-up rounds at
      6 P_j B K; the baselines' one-off fine-tuning (6 P B steps) is amortized over the rounds;
    * comm_mb: 8 P bytes (sub-model down + update up) per round, same amortization.
    FLOPs ~ 2 P per sample forward holds for MLPs (every weight is one multiply-add per sample)."""
    f = torch.tensor(fractions, dtype=torch.float64)
    own = num_parameters(masks_for(spec, fractions)).double()
    smallest = float(num_parameters(masks_for(spec, [min(cfg.budgets)]))[0])
    size_of = {r: float(num_parameters(masks_for(spec, [r]))[0]) for r in set(fractions)}
    pair = torch.tensor([[size_of[min(a, b)] for a in fractions] for b in fractions], dtype=torch.float64)
    bk = cfg.batch_size * cfg.local_steps
    rows = []
    for key in cfg.methods:
        if key in PERM_HETERO_DISCREPANCY:
            p = perm_hetero_section(key, cfg)
            n = cfg.num_clients
            period = n if p.update_every == "epoch" else p.update_every
            shuffle = pair.mean(1)  # host j: mean over visiting models i of P(min(r_i, r_j))
            warm = min(p.warmup_rounds, cfg.rounds)
            rest = cfg.rounds - warm
            updates = 0 if period is None else rest // period
            samples = p.alpha_samples or mean_train_size
            if p.discrepancy == "shared":  # client j computes alpha gradients at every width <= r_j
                alpha_p = torch.tensor([sum(size_of[r] for r in size_of if r <= rj) for rj in fractions],
                                       dtype=torch.float64)
            else:
                alpha_p = own
            flops = (warm * 6 * own * bk + rest * 6 * shuffle * bk
                     + updates * (p.global_steps * own + alpha_p) * 6 * samples) / cfg.rounds
            comm = (warm * 8 * own + rest * 8 * shuffle + updates * (p.global_steps * own + alpha_p) * 8) / cfg.rounds
            params, peak = shuffle, own
        else:
            held = torch.full_like(own, smallest) if key == "small_fedavg" else own
            ft = cfg.finetune_steps * cfg.batch_size * 6 * held / cfg.rounds  # one fine-tuning, amortized
            flops, comm, params, peak = 6 * held * bk + ft, 8 * held, held, held
        for r in sorted(set(fractions), reverse=True):
            sel = f == r
            rows.append({"method": METHODS[key].name, "budget": r, "params": float(params[sel].mean()),
                         "peak_memory_mb": float(8 * peak[sel].max() / 1e6),
                         "train_mflops_per_round": float(flops[sel].mean() / 1e6),
                         "comm_mb_per_round": float(comm[sel].mean() / 1e6),
                         "budget_params": float(own[sel].max())})
    return pd.DataFrame(rows)


def _setup(cfg: PermHeteroConfig):
    """(image data, width spec, model, client budgets, method factories, federation of a seed)."""
    device = resolve_device(cfg.device)
    img = load_images(cfg.dataset)
    spec = mlp_spec(img.shape, img.num_classes, hidden=tuple(cfg.hidden))
    model = FunctionalModel(spec.factory(), device)
    fractions = client_budgets(cfg)
    methods = {METHODS[k].name: (lambda k=k: METHODS[k].make(model, cfg, spec, fractions)) for k in cfg.methods}
    datasets = {}

    def data_for_seed(seed):
        if seed not in datasets:
            datasets[seed] = image_federation(cfg, img, seed).to(device)
        return datasets[seed]
    return img, spec, model, fractions, methods, data_for_seed


def _client_rows(methods: dict, model, fractions: list[float], states: dict) -> list[dict]:
    """Per method, seed and client: the personalized test accuracy and the trained parameter count."""
    rows = []
    for (name, seed), state in states.items():
        key = next(k for k in HETERO_METHODS if METHODS[k].name == name)
        algo = methods[name]()
        personal = algo.personalized(state)
        acc = evaluate(model, personal, state.data).accuracy
        nonzero = sum((p != 0).reshape(len(fractions), -1).sum(1) for p in personal.values()).cpu()
        for j, r in enumerate(fractions):
            rows.append({"method": name, "seed": seed, "client": j, "budget": r, "accuracy": float(acc[j]),
                         "trained_params": int(nonzero[j]), "key": key})
    return rows


def group_table(clients: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per method, budget and seed: the mean client accuracy; the group table: its mean and sd over seeds per
    budget group)."""
    per_seed = clients.groupby(["method", "budget", "seed"], as_index=False)["accuracy"].mean()
    groups = per_seed.groupby(["method", "budget"])["accuracy"].agg(["mean", "std"]).unstack("budget")
    groups.columns = [f"r={b:g} acc_{stat}" for stat, b in groups.columns]
    groups = groups[sorted(groups.columns, key=lambda c: (-float(c.split()[0][2:]), c))]
    return per_seed, groups


def hetero_experiment(cfg: PermHeteroConfig, show_progress: bool = True) -> StageResult:
    img, spec, model, fractions, methods, data_for_seed = _setup(cfg)
    device = model.device
    start = time.perf_counter()
    states: dict = {}
    history = run_methods(methods, data_for_seed, cfg.seeds, cfg.rounds, cfg.eval_every, show_progress, keep=states)
    elapsed = time.perf_counter() - start
    rows = _client_rows(methods, model, fractions, states)
    for seed in cfg.seeds:
        acc = majority_baseline(data_for_seed(seed)).accuracy
        rows += [{"method": "Majority class", "seed": seed, "client": j, "budget": r, "accuracy": float(acc[j]),
                  "trained_params": 0, "key": "majority"} for j, r in enumerate(fractions)]
    clients = pd.DataFrame(rows)
    per_seed, groups = group_table(clients)
    data = data_for_seed(cfg.seeds[0])
    costs = cost_table(cfg, spec, fractions, float(data.train_sizes.double().mean()))
    claim = check_claim(cfg, per_seed, clients, costs)
    scale = (f"N={cfg.num_clients}, {cfg.partition.get('scheme')} split, MLP {cfg.hidden} x r, "
             f"r in {sorted(set(cfg.budgets), reverse=True)}, {cfg.rounds} rounds, K={cfg.local_steps}, "
             f"{len(cfg.seeds)} seeds")
    record = dataset_record(img)
    metrics = {**record, "groups": {m: {c: float(v) for c, v in row.items() if pd.notna(v)}
                                    for m, row in groups.iterrows()},
               "claim": claim, "runtime_s": round(elapsed, 2)}
    run_info = {"stage": cfg.stage, "scale": scale, "data": data.summary(), "device": str(device),
                "fractions": fractions, "environment": environment(), "config": cfg.model_dump()}
    label = data.label
    return StageResult(groups, metrics, label, scale, run_info,
                       frames={"history": history, "groups": groups, "clients": clients, "costs": costs},
                       extra={"claim": claim, "states": states})


def saved_groups(cfg: PermHeteroConfig, folder=None) -> pd.DataFrame:
    """The per-budget-group accuracy table of the trained methods, from the saved states alone."""
    folder = model_store.models_dir(cfg, folder)
    _, _, model, fractions, methods, data_for_seed = _setup(cfg)
    saved = model_store.saved_runs(folder)
    states = {(name, seed): model_store.restore(methods[name](), data_for_seed(seed), saved[(name, seed)])
              for seed in cfg.seeds for name in methods}
    return group_table(pd.DataFrame(_client_rows(methods, model, fractions, states)))[1]


def check_claim(cfg: PermHeteroConfig, per_seed: pd.DataFrame, clients: pd.DataFrame, costs: pd.DataFrame) -> dict:
    """(1) every client's trained model fits its budget: nonzero parameters <= its sub-model size;
    (2) per budget group, PERM-hetero's mean accuracy >= the best baseline's - tolerance."""
    budget_of = {r: float(costs[costs["budget"] == r]["budget_params"].max()) for r in cfg.budgets}
    fits = bool((clients["trained_params"] <= clients["budget"].map(budget_of)).all())
    out = {"every_model_fits_its_budget": fits, "tolerance": cfg.claim.tolerance, "groups": {}}
    if "perm_hetero" not in cfg.methods:
        return out
    means = per_seed.groupby(["method", "budget"])["accuracy"].mean()
    baselines = [METHODS[k].name for k in cfg.methods if k not in PERM_HETERO_DISCREPANCY]
    holds = fits
    for r in sorted(set(cfg.budgets), reverse=True):
        ours = float(means[(METHODS["perm_hetero"].name, r)])
        best_name, best = max(((b, float(means[(b, r)])) for b in baselines), key=lambda t: t[1],
                              default=(None, float("nan")))
        ok = best_name is None or ours >= best - cfg.claim.tolerance
        holds = holds and ok
        out["groups"][f"r={r:g}"] = {"perm_hetero": ours, "best_baseline": best_name, "best_baseline_accuracy": best,
                                     "margin": ours - best if best_name else None, "holds": bool(ok)}
    out["holds"] = bool(holds)
    return out


def claim_table(claim: dict) -> pd.DataFrame:
    """One row per budget group: PERM-hetero, the best baseline, the margin, whether it holds."""
    rows = [{"group": g, "perm_hetero": c["perm_hetero"], "best_baseline": c["best_baseline"],
             "best_baseline_accuracy": c["best_baseline_accuracy"], "margin": c["margin"], "holds": c["holds"]}
            for g, c in claim.get("groups", {}).items()]
    return pd.DataFrame(rows).set_index("group") if rows else pd.DataFrame()


def describe_measured(metrics: dict) -> str:
    """The verdict of a run in words (from its metrics.json): final accuracy per method and budget
    group (mean over seeds), then the claim per group and overall."""
    groups = pd.DataFrame(metrics.get("groups", {})).T
    means = groups[[c for c in groups.columns if c.endswith(" acc_mean")]]
    means = means.rename(columns=lambda c: c[:-len(" acc_mean")])
    claim = metrics.get("claim", {})
    return "\n".join([
        "final personalized accuracy (mean over seeds) per budget group r:", means.round(3).to_string(),
        "claim per group (PERM-hetero >= best baseline - tolerance):", claim_table(claim).round(3).to_string(),
        f"every model fits its budget: {claim.get('every_model_fits_its_budget')}; claim holds: {claim.get('holds')}"])
