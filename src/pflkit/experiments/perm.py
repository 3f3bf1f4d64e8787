"""PERM paper (Deng et al.) experiments: configs and figure functions behind notebooks/perm/.

Every curve figure (Figs. 1, 2, 4) runs the shared curve machinery (``experiments.curves``: every method for
the same number of communication rounds, PERM's one shuffle step = one round, see ``pflkit.algorithms.perm``)
and evaluates each client's personalized model on its own test split. Per-method learning rates live in
``lr``; method-specific settings in their own sections (``curves.PermSection`` ...).
"""
from __future__ import annotations

import io as _io
import math
import time
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from types import SimpleNamespace
from typing import Callable, ClassVar

import numpy as np
import pandas as pd
import torch
from pydantic import Field, field_validator, model_validator

from .. import model_store
from ..algorithms import FedAvg
from ..algorithms.perm import mixing_weights
from ..checks import short_repr
from ..config import (Footprint, PositiveInt, Section, Seed, Seeds, StageConfig, federated_memory, image_features,
                      image_sources, model_bytes, names_from, network_footprint, one_of, raise_problems)
from ..data import prepared
from ..data.federated import FederatedDataset
from ..data.vision import federate, image_partition_problems
from ..engine import FunctionalModel, resolve_device
from ..engine.full_batch import FULL_BATCH_BYTES, ROW_BYTES_FACTOR
from ..io import atomic_path, slug
from ..model_store import models_dir_of
from ..models import MODELS, build, count_parameters, logistic, mlp
from ..paths import resolve
from ..progress import note
from ..report import StageResult
from . import curves
from .curves import (METHODS, PERM_VARIANTS, CurveStepSizes, MethodNames, MethodSettings, PermSection, RunConfig,
                     missing_lrs, run_curves)
from .curves import save_models  # noqa: F401  (the notebooks' ``experiment.save_models``: the shared one)
from .images import DatasetSection, dataset_record, image_federation, load_images

ModelName = one_of(MODELS)


class SyntheticData:
    """A stage on PERM's synthetic data: what its data stage prepares (``pflkit.data.prepared``)."""

    def synthetic_requests(self) -> list[dict]:
        """One request per seed: what ``data_perm_synthetic`` writes for this stage."""
        return [self.synthetic_request(seed) for seed in self.seeds]

    def synthetic_request(self, seed: int) -> dict:
        return {"num_clients": self.num_clients, "samples_per_client": self.samples_per_client, "dim": self.dim,
                "test_fraction": self.test_fraction, "seed": seed}

    def synthetic(self, seed: int) -> FederatedDataset:
        """The federation of ``seed``, from this stage's prepared folder when it holds it."""
        return prepared.perm_synthetic(**self.synthetic_request(seed), folder=prepared.synthetic_folder(self.stage))

    def footprint(self) -> Footprint:
        """One seed's federation generated in float64 and kept in float32 (N x n x (d + 1) values each) and an
        N x N float32 matrix (PERM's alpha, the pairwise weights), as data; a round's working set
        (``config.federated_memory``: K minibatches per client, N logistic models; or PERM's sampled gradient pass,
        M = ``perm.alpha_samples`` rows of every client, when that is larger)."""
        sizes = {"num_clients": self.num_clients, "samples_per_client": self.samples_per_client, "dim": self.dim}
        data = self.num_clients * self.samples_per_client * (self.dim + 1) * (8 + 4) + 4 * self.num_clients ** 2
        run = federated_memory(self.num_clients, getattr(self, "local_steps", 1), getattr(self, "batch_size", 1),
                               self.dim + 1, classes=2)
        samples, samples_key = self.alpha_sampling() if hasattr(self, "alpha_sampling") else (0, "")
        if samples:  # PERM's sampled gradient pass: M rows of every client gathered at once, between rounds
            run = max(run, replace(federated_memory(self.num_clients, 1, samples, self.dim + 1, classes=2),
                                   work_key=samples_key))
        return run + Footprint(data=data, data_key=max(sizes, key=sizes.get))


class PermFig1Config(SyntheticData, RunConfig):
    num_clients: int = Field(ge=2)
    samples_per_client: int = Field(ge=4)
    dim: int = Field(ge=1)
    test_fraction: float = Field(gt=0, lt=1)



def describe_claim(claim: dict | None, name: str = "PERM", where: str = "") -> str:
    """The verdict of one PERM claim in words; ``where`` names the data it ran on (``data_setting``)."""
    if claim is None:
        return f"no claim to check: {name}, or every other method, is not among the methods run"
    verdict = "holds" if claim["holds"] else "does NOT hold"
    return (f"claim '{name} has the best personalized accuracy' {verdict}{where}: {name} {claim['perm']:.3f} vs "
            f"best other ({claim['best_other']}) {claim['best_other_value']:.3f}, margin {claim['margin']:+.3f}")


def data_setting(metrics: dict) -> str:
    """" on <dataset>" (with "the substitute for <paper's dataset>" when one stood in), from metrics.json."""
    if "dataset" not in metrics:
        return ""
    if metrics.get("is_substitute"):
        return f" on {metrics['dataset']} (the substitute for {metrics.get('paper_dataset')})"
    return f" on {metrics['dataset']}"


def describe_final(metrics: dict, metric: str = "accuracy") -> str:
    """A curve stage's results (metrics.json) in words: methods ranked by final personalized
    ``metric`` (mean +- sd over seeds), then the claim's verdict."""
    final = metrics.get("final", {})
    ranked = sorted(final.items(), key=lambda kv: -kv[1].get(f"{metric}_mean", float("-inf")))
    parts = [f"{name} {row[f'{metric}_mean']:.3f}"
             + (f" +- {row[f'{metric}_std']:.3f}" if f"{metric}_std" in row else "")
             for name, row in ranked if f"{metric}_mean" in row]
    where = data_setting(metrics)
    variants = "".join("\n" + describe_claim(metrics[f"claim_{key}_best"], METHODS[key].name, where)
                       for key in PERM_VARIANTS[1:] if f"claim_{key}_best" in metrics)  # each variant's own verdict
    return (f"final personalized {metric}: " + " > ".join(parts) + "\n"
            + describe_claim(metrics.get("claim_perm_best"), where=where) + variants + describe_alpha_effects(metrics))


def describe_alpha_effects(metrics: dict) -> str:
    """The "why" of the PERM verdicts, from ``perm_alpha_effects`` in metrics.json (empty when absent)."""
    zero, step, own = (metrics.get(k, {}) for k in ("alpha_zero_fraction", "largest_step", "alpha_own_group_mass"))
    lines = []
    for name in (METHODS["perm"].name, METHODS["perm_alpha"].name):
        if name not in zero:
            continue
        how = ("under Alg. 1's shuffle a visit to client j moves model i by eta * alpha_ij * N: "
               f"{zero[name]:.0%} of alpha is 0 (visits that leave the model where it is) and the largest step is "
               f"{step[name]:.3g}" if name == METHODS["perm"].name else
               f"visits drawn with probability alpha_ij, every step eta = {step[name]:.3g} "
               f"({zero[name]:.0%} of alpha is 0: clients never visited)")
        lines.append(f"why ({name}): {how}"
                     + (f"; alpha's mass on the client's own label group {own[name]:.2f}" if name in own else ""))
    return "".join("\n" + line for line in lines)



def saved_final(cfg: RunConfig, folder=None) -> pd.DataFrame:
    """The final table of a curve stage's saved runs, re-evaluated from the saved states alone
    (``curves.saved_final`` on what the stage trains on): its recorded numbers, exactly."""
    factory, data_for_seed, _, _ = curve_setup(cfg)
    return curves.saved_final(cfg, factory, data_for_seed, folder)


def own_group_mass(alpha, groups):
    """Share of each client's mixing vector alpha_i [N, N] on clients with its own group id [N] (group,
    majority label)."""
    same = (groups[:, None] == groups[None, :]).to(alpha)
    return (alpha * same).sum(1)


def fig1(cfg: PermFig1Config, show_progress: bool = True, checkpoint: bool = True) -> StageResult:
    """Personalized accuracy/loss vs rounds on PERM's synthetic two-group data (Fig. 1).

    With PERM among the methods, metrics["perm_alpha"] holds, per seed, the share of PERM's final
    alpha_i inside client i's own group (mean, min) and the share of label 1 in each group: where
    both groups label nearly everything 1, their gradients agree and alpha rightly mixes across."""
    factory, data_for_seed, _, scale = curve_setup(cfg)
    result = run_curves(cfg, factory, data_for_seed, scale, show_progress, checkpoint=checkpoint)
    per_seed = {}
    for (method, seed), state in sorted(result.states.items()):
        if method != "PERM" or getattr(state, "alpha", None) is None:
            continue
        groups = state.data.groups.cpu()
        own = own_group_mass(state.alpha.cpu(), groups)
        counts = state.data.label_counts().double()  # [N, 2] training labels per client
        share = {str(g): round(float(counts[groups == g, 1].sum() / counts[groups == g].sum()), 4)
                 for g in groups.unique().tolist()}
        per_seed[str(seed)] = {"own_group_mass_mean": round(float(own.mean()), 4),
                               "own_group_mass_min": round(float(own.min()), 4),
                               "label1_share_by_group": share}
    if per_seed:
        result.metrics["perm_alpha"] = per_seed
    return result


# --------------------------------------------------------------------------- Fig. 6: alpha heat maps
class PermFig6Config(StageConfig):
    dataset: DatasetSection
    num_clients: int = Field(ge=2)
    schemes: dict[str, dict] = Field(min_length=1)  # panel name -> partition (scheme + kwargs), checked below
    test_fraction: float = Field(gt=0, lt=1)
    hidden: list[PositiveInt] = Field(min_length=1)
    fedavg_rounds: int = Field(ge=1)
    local_steps: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    lr: float = Field(gt=0)
    lam: float = Field(gt=0)
    seed: Seed

    def footprint(self) -> Footprint:
        return federated_memory(self.num_clients, self.local_steps, self.batch_size, image_features(self.dataset.name),
                                tuple(self.hidden))

    @model_validator(mode="after")
    def _schemes_fit_data(self):
        raise_problems([p for panel, spec in self.schemes.items()
                        for p in image_partition_problems(self.dataset, spec, self.num_clients,
                                                          key=f"schemes.{panel}", allow_natural=False)])
        return self


def alpha_summary(alpha, data: FederatedDataset) -> dict:
    """Mass on clients sharing the majority label, effective support 1/sum a^2, self weight."""
    mass = own_group_mass(alpha, data.label_counts().argmax(1).to(alpha.device))
    return {"same_label_mass_mean": float(mass.mean()), "same_label_mass_min": float(mass.min()),
            "effective_support_mean": float((1.0 / (alpha ** 2).sum(1)).mean()),
            "self_weight_mean": float(torch.diagonal(alpha).mean())}


@dataclass
class AlphaPanel:
    alpha: "object"  # [N, N] float64 tensor
    order: "object"  # client order for display (sorted by majority label)
    labels: "object"  # majority label per client
    summary: dict
    w: "object" = None  # the FedAvg model alpha was computed at (Params)


def _fig6_setup(cfg: PermFig6Config):
    """(model, federation of a panel): what every Fig. 6 panel trains on and computes alpha with."""

    device = resolve_device(cfg.device)
    img = load_images(cfg.dataset)
    model = FunctionalModel(lambda: mlp(img.shape, img.num_classes, hidden=tuple(cfg.hidden)), device)

    def federation(panel: str) -> FederatedDataset:
        spec = dict(cfg.schemes[panel])
        return federate(img, cfg.num_clients, spec.pop("scheme"), seed=cfg.seed, test_fraction=cfg.test_fraction,
                        **spec).to(device)
    return img, model, federation


def fig6(cfg: PermFig6Config) -> StageResult:
    """Two-stage PERM's alpha (Alg. 3): FedAvg for R rounds, then alpha at w^R, per partition."""

    img, model, federation = _fig6_setup(cfg)
    panels = {}
    for panel in cfg.schemes:
        data = federation(panel)
        fed = FedAvg(model, local_steps=cfg.local_steps, lr=cfg.lr, batch_size=cfg.batch_size)
        state = fed.init(data, cfg.seed)
        for _ in range(cfg.fedavg_rounds):
            state = fed.round(state)
        alpha = mixing_weights(model, state.w, data, cfg.lam, solver="exact").cpu()
        labels = data.label_counts().argmax(1)
        panels[panel] = AlphaPanel(alpha, labels.argsort(stable=True), labels, alpha_summary(alpha, data), state.w)
        note(f"{cfg.stage}: panel {panel!r} done ({len(panels)}/{len(cfg.schemes)})")
    record = dataset_record(img)
    table = pd.DataFrame({name: p.summary for name, p in panels.items()}).T
    return StageResult(table, record, img.label, f"N={cfg.num_clients}, {cfg.fedavg_rounds} FedAvg rounds",
                       extra={"panels": panels})


def fig6_frames(result: StageResult) -> "pd.DataFrame":
    """Every panel's alpha in display order (``matrix_frame``), for the heat-map figure."""
    return pd.concat([matrix_frame(p.order, alpha=p.alpha).assign(panel=name)
                      for name, p in result.panels.items()], ignore_index=True)


def save_fig6_models(cfg: PermFig6Config, result: StageResult, folder=None) -> list:
    """Each panel's FedAvg model w^R and the alpha computed at it (``pflkit.model_store``)."""
    return model_store.save_stage_tensors(
        cfg, {panel: ({"w": p.w, "alpha": p.alpha}, p.summary) for panel, p in result.panels.items()}, folder)


def saved_fig6(cfg: PermFig6Config, folder=None) -> pd.DataFrame:
    """The Fig. 6 table recomputed from the saved FedAvg models alone: alpha at each saved w^R on its
    panel's federation, summarized as the stage summarizes it."""
    folder = model_store.models_dir(cfg, folder)
    _, model, federation = _fig6_setup(cfg)
    rows = {}
    for panel in cfg.schemes:
        data = federation(panel)
        w = model_store.tensors(folder / f"{slug(panel)}.pt")["w"]
        alpha = mixing_weights(model, {k: v.to(data.device) for k, v in w.items()}, data, cfg.lam,
                               solver="exact").cpu()
        rows[panel] = alpha_summary(alpha, data)
    return pd.DataFrame(rows).T


# --------------------------------------------------------------------------- Theorem 1: alpha_hat -> alpha*
class PermAlphaConvergenceConfig(SyntheticData, StageConfig):
    num_clients: int = Field(ge=2)
    samples_per_client: int = Field(ge=4)
    dim: int = Field(ge=1)
    test_fraction: float = Field(gt=0, lt=1)
    lam: float = Field(gt=0)
    gd_lr: float = Field(gt=0)
    optimum_steps: int = Field(ge=1)
    checkpoints: list[PositiveInt] = Field(min_length=1)  # rounds R at which alpha_hat is compared
    seeds: Seeds


def alpha_convergence(cfg: PermAlphaConvergenceConfig) -> StageResult:
    """Theorem 1 numerically: alpha_hat = alpha(w^R) vs alpha* = alpha(w*) as w^R -> w*.

    w^R is R rounds of exact FedAvg with one local step (= full gradient descent on the average loss,
    so w^R -> w* linearly); w* is ``optimum_steps`` such steps. Errors: ||w^R - w*||_2, the mean over
    clients of ||alpha_hat_i - alpha*_i||_1, and the share of each alpha_hat_i's mass inside client
    i's own group. Frames: the per-checkpoint rows (``convergence``) and the per-client own-group shares at
    the last checkpoint (``shares``); ``extra["snapshots"]``: per seed, w^R at every checkpoint and w*."""
    device = resolve_device(cfg.device)
    model = FunctionalModel(lambda: logistic((cfg.dim,), 2), device)
    rows, shares, saved = [], [], {}
    for seed in cfg.seeds:
        data = cfg.synthetic(seed).to(device)
        gd = FedAvg(model, local_steps=1, lr=cfg.gd_lr, batch_size=None)
        state = gd.init(data, seed)
        snapshots = {0: state.w}
        for r in range(1, max(max(cfg.checkpoints), cfg.optimum_steps) + 1):
            state = gd.round(state)
            if r in cfg.checkpoints:
                snapshots[r] = state.w
        saved[seed] = (snapshots, state.w)
        seed_rows, seed_shares = _convergence_rows(cfg, model, data, seed, snapshots, state.w)
        rows += seed_rows
        shares += seed_shares
        note(f"{cfg.stage}: seed {seed} done ({cfg.seeds.index(seed) + 1}/{len(cfg.seeds)} seeds)")
    record = {"dataset": "perm-synthetic", "paper_dataset": "perm-synthetic", "is_substitute": False}
    convergence = pd.DataFrame(rows)
    scale = f"N={cfg.num_clients}, d={cfg.dim}, lambda={cfg.lam:g}, {len(cfg.seeds)} seeds"
    return StageResult(convergence_table(convergence), record, "perm-synthetic", scale,
                       frames={"convergence": convergence, "shares": pd.DataFrame(shares)},
                       extra={"snapshots": saved})


def convergence_table(convergence: pd.DataFrame) -> pd.DataFrame:
    """Theorem 1's table: the per-checkpoint errors and own-group masses, mean over seeds."""
    return convergence.groupby("R")[["w_error", "alpha_error_l1", "own_group_mass_mean", "own_group_mass_min"]].mean()


def _convergence_rows(cfg: PermAlphaConvergenceConfig, model, data: FederatedDataset, seed: int, snapshots: dict,
                      w_star) -> tuple[list[dict], list[dict]]:
    """One seed's rows (errors at each checkpoint R) and own-group shares at the last checkpoint."""

    alpha_star = mixing_weights(model, w_star, data, cfg.lam, solver="exact")
    rows, shares = [], []
    for r, w in sorted(snapshots.items()):
        alpha = mixing_weights(model, w, data, cfg.lam, solver="exact")
        dist = torch.sqrt(sum(((w[k] - w_star[k]) ** 2).sum() for k in w))
        own = own_group_mass(alpha, data.groups)
        rows.append({"seed": seed, "R": r, "w_error": float(dist),
                     "alpha_error_l1": float((alpha - alpha_star).abs().sum(1).mean()),
                     "own_group_mass_mean": float(own.mean()), "own_group_mass_min": float(own.min())})
        if r == max(cfg.checkpoints):
            shares += [{"seed": seed, "client": j, "group": int(data.groups[j]), "own_group_mass": float(own[j])}
                       for j in range(data.num_clients)]
    return rows, shares


def save_convergence_models(cfg: PermAlphaConvergenceConfig, result: StageResult, folder=None) -> list:
    """Per seed, the FedAvg models w^R at every checkpoint R and w* (``pflkit.model_store``)."""
    return model_store.save_stage_tensors(
        cfg, {f"seed{seed}": ({f"R{r}": w for r, w in sorted(snapshots.items())} | {"optimum": w_star}, None)
              for seed, (snapshots, w_star) in result.snapshots.items()}, folder)


def saved_convergence(cfg: PermAlphaConvergenceConfig, folder=None) -> pd.DataFrame:
    """The Theorem 1 rows (``convergence``) recomputed from the saved models alone."""
    folder = model_store.models_dir(cfg, folder)
    device = resolve_device(cfg.device)
    model = FunctionalModel(lambda: logistic((cfg.dim,), 2), device)
    rows = []
    for seed in cfg.seeds:
        data = cfg.synthetic(seed).to(device)
        saved = {k: {n: t.to(device) for n, t in w.items()}
                 for k, w in model_store.tensors(folder / f"seed{seed}.pt").items()}
        snapshots = {int(k[1:]): w for k, w in saved.items() if k.startswith("R")}
        rows += _convergence_rows(cfg, model, data, seed, snapshots, saved["optimum"])[0]
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- Figs. 2 and 4: image curves
class ModelSection(Section):
    name: ModelName  # logistic | mlp | cnn
    hidden: list[PositiveInt] | None  # mlp hidden widths; cnn: [dense width]
    channels: list[PositiveInt] | None  # cnn conv channels

    def factory(self, shape, num_classes):
        kw = {}
        if self.name == "mlp" and self.hidden:
            kw["hidden"] = tuple(self.hidden)
        if self.name == "cnn":
            if self.channels:
                kw["channels"] = tuple(self.channels)
            if self.hidden:
                kw["hidden"] = self.hidden[0]
        return lambda: build(self.name, tuple(shape), num_classes, **kw)


class ImageCurvesConfig(RunConfig):
    dataset: DatasetSection
    num_clients: int = Field(ge=2)
    partition: dict  # used when the data has no natural split (or always, if not 'natural'); checked below
    pool_size: int | None = Field(ge=2)  # subsample the pooled data (None: all)
    test_fraction: float = Field(gt=0, lt=1)
    model: ModelSection
    #: G > 1: clients in G groups, group g's labels shifted by g (FederatedDataset.with_label_groups)
    label_groups: PositiveInt

    def footprint(self) -> Footprint:
        """For the dataset or its substitute, whichever counts more of those that may load (``config.image_sources``):
        the data as loaded (float32 train + test) and its federation (``pool_size`` samples, or all); a round's
        working set (``config.federated_memory`` with the model's parameter count from
        ``config.network_footprint``: every client's K minibatches, 4 copies of N models); each client's
        B-example batch through the model (``ROW_BYTES_FACTOR`` x its row bytes: activations and their
        gradients), or PERM's sampled alpha pass (M = ``perm.alpha_samples`` rows of every client) when larger;
        one full-batch pass (the evaluation, PERM's exact alpha and global step: at most
        ``engine.full_batch.FULL_BATCH_BYTES`` of rows); and the final state of every finished run, kept until
        the stage saves them (methods x seeds x N models).

        Checked against a measured peak (ru_maxrss above the canary's baseline process): perm_fig2's paper
        profile canary cut (N = 10, K = 20, CNN 32/64/512, all 70,000 substitute images) peaked 1,080 MiB
        above it; this says 1,448 MiB when the substitute loads, 2,684 MiB where CIFAR-10 may download
        (tests/unit/test_canary.py)."""
        best = Footprint()
        ds = self.dataset
        for shape, classes, samples in image_sources(ds.name, ds.substitute, ds.root, ds.allow_download):
            features = math.prod(shape)
            params, row, _ = network_footprint(self.model.factory(shape, classes), shape)
            pool = min(self.pool_size or samples, samples)
            run = federated_memory(self.num_clients, self.local_steps, self.batch_size, features, params=params)
            run += Footprint(work=self.num_clients * self.batch_size * ROW_BYTES_FACTOR * row,
                             work_key="batch_size" if self.batch_size > self.num_clients else "num_clients")
            m, m_key = self.alpha_sampling()
            if m:  # PERM's sampled gradient pass (between rounds): M rows of every client through the model
                alpha = federated_memory(self.num_clients, 1, m, features, params=params)
                run = max(run, replace(alpha + Footprint(work=self.num_clients * m * ROW_BYTES_FACTOR * row),
                                       work_key=m_key))
            states = model_bytes(params, len(self.methods) * len(self.seeds) * self.num_clients)
            best = max(best, run + Footprint(data=(samples + pool) * (features * 4 + 8), models=states,
                                             work=FULL_BATCH_BYTES, data_key="pool_size", models_key="methods"))
        return best

    @model_validator(mode="after")
    def _partition_fits_data(self):
        problems = image_partition_problems(self.dataset, self.partition, self.num_clients, self.pool_size)
        if self.label_groups > self.num_clients:
            problems.append(("label_groups", f"{self.label_groups} exceeds num_clients = {self.num_clients}; "
                                             f"allowed: 1..{self.num_clients}"))
        raise_problems(problems)
        return self


class PermFig2Config(ImageCurvesConfig):
    pass


def alpha_folder(results_dir: str, stage: str) -> str:
    """perm_fig4's models folder for the run whose results go to ``results_dir`` (a perm_fig4 or perm_fig5
    run): models/perm_fig4 for the pipeline, build/<profile>/perm_fig4/models for a profile's run."""

    fig4 = results_dir if stage == "perm_fig4" else str(PurePosixPath(results_dir).parent / "perm_fig4")
    return models_dir_of(fig4, "perm_fig4")


def alpha_file_problem(value: str, results_dir: str, stage: str) -> str | None:
    """Why ``alpha_file`` is not allowed (None: it is): Fig. 4 writes it and Fig. 5 reads it, so it must be a
    relative ``.npz`` path inside perm_fig4's models folder (a DVC output), never elsewhere."""

    folder = PurePosixPath(alpha_folder(results_dir, stage))
    path = PurePosixPath(value)
    inside = (not path.is_absolute() and "\\" not in value and ".." not in path.parts
              and path.parts[:len(folder.parts)] == folder.parts and len(path.parts) > len(folder.parts)
              and path.suffix == ".npz")
    if inside:
        return None
    return (f"{short_repr(value)} is not allowed; allowed: a relative path <name>.npz inside {folder}/ "
            "(perm_fig4's models folder: a DVC output), without '..'")


class PermFig4Config(ImageCurvesConfig):
    alpha_file: str  # PERM's final alpha (first seed), read by Fig. 5; inside models/perm_fig4/ (alpha_folder)

    @model_validator(mode="after")
    def _alpha_file_inside_models(self):
        why = alpha_file_problem(self.alpha_file, self.results_dir, self.stage)
        raise_problems([("alpha_file", why)] if why else [])
        return self

    @model_validator(mode="after")
    def _perm_runs(self):
        if "perm" not in self.methods:
            raise_problems([("methods", f"must include 'perm': this stage saves PERM's alpha for Fig. 5 "
                                        f"(perm_fig5); got {self.methods}")])
        if self.perm.warmup_rounds >= self.rounds:
            raise_problems([("perm.warmup_rounds", f"{self.perm.warmup_rounds} leaves PERM no round past its warm-up "
                                                   f"(rounds = {self.rounds}), so it has no alpha to save for Fig. 5; "
                                                   f"allowed: 0..{self.rounds - 1}")])
        return self


def split_label(partition: dict) -> str:
    """The client split in words: "4 classes per client", "Dirichlet(0.3) split", or "<scheme> split"."""
    scheme = partition.get("scheme")
    if scheme == "classes" and "classes_per_client" in partition:
        return f"{partition['classes_per_client']} classes per client"
    if scheme == "dirichlet" and "beta" in partition:
        return f"Dirichlet({partition['beta']}) split"
    return f"{scheme} split"


def curve_setup(cfg: RunConfig) -> tuple[Callable, Callable[[int], FederatedDataset], dict | None, str]:
    """What a curve stage trains on: (model factory, federation of a seed, dataset record or None, scale)."""
    if isinstance(cfg, PermFig1Config):
        scale = (f"N={cfg.num_clients}, {cfg.samples_per_client} samples/client, d={cfg.dim}, "
                 f"{cfg.rounds} rounds, {len(cfg.seeds)} seeds")
        return (lambda: logistic((cfg.dim,), 2)), cfg.synthetic, None, scale
    img = load_images(cfg.dataset)
    factory = cfg.model.factory(img.shape, img.num_classes)
    if cfg.label_groups > img.num_classes:
        raise ValueError(f"label_groups: {cfg.label_groups} exceeds the {img.num_classes} classes of {img.label}; "
                         f"allowed: 1..{img.num_classes}")
    groups = f", {cfg.label_groups} label-shifted groups" if cfg.label_groups > 1 else ""
    scale = (f"N={cfg.num_clients}, {split_label(cfg.partition)}{groups}, {cfg.model.name} "
             f"({count_parameters(factory()):,} params), {cfg.rounds} rounds, K={cfg.local_steps}, "
             f"{len(cfg.seeds)} seeds")
    return factory, lambda seed: image_federation(cfg, img, seed).with_label_groups(cfg.label_groups), \
        dataset_record(img), scale


def image_curves(cfg: ImageCurvesConfig, show_progress: bool = True, checkpoint: bool = True) -> StageResult:
    """Figs. 2 / 4: personalized accuracy and loss vs rounds on a partitioned image dataset."""
    factory, data_for_seed, record, scale = curve_setup(cfg)
    result = run_curves(cfg, factory, data_for_seed, scale, show_progress, record=record, checkpoint=checkpoint)
    result.metrics.update(perm_alpha_effects(result, cfg))
    return result


def perm_alpha_effects(result: StageResult, cfg: ImageCurvesConfig) -> dict:
    """What each PERM variant's final alpha does to its models (mean over seeds), for the verdict's "why":
    ``alpha_zero_fraction`` (share of alpha_ij exactly 0: under Alg. 1's shuffle those visits do not move
    model i), ``largest_step`` (Alg. 1: eta * max_ij alpha_ij * N, the largest step any visit takes; the
    alpha-visit variant always steps eta), and with label groups ``alpha_own_group_mass`` (alpha_i's mass on
    clients of i's own group; 1/G is what uniform alpha gives)."""
    keys = {METHODS[k].name: k for k in ("perm", "perm_alpha")}
    stats: dict[str, dict[str, list]] = {}
    for (method, _seed), state in sorted(result.states.items()):
        alpha = getattr(state, "alpha", None)
        if method not in keys or alpha is None:
            continue
        alpha = alpha.cpu().double()
        n, lr = alpha.shape[0], cfg.lr[keys[method]]
        row = stats.setdefault(method, {"alpha_zero_fraction": [], "largest_step": [], "alpha_own_group_mass": []})
        row["alpha_zero_fraction"].append(float((alpha == 0).double().mean()))
        row["largest_step"].append(lr * float(alpha.max()) * n if keys[method] == "perm" else lr)
        if state.data.groups is not None and cfg.label_groups > 1:
            row["alpha_own_group_mass"].append(float(own_group_mass(alpha, state.data.groups.double()).mean()))
    out: dict[str, dict] = {}
    for method, row in stats.items():
        for key, values in row.items():
            if values:
                out.setdefault(key, {})[method] = round(sum(values) / len(values), 4)
    return out


# --------------------------------------------------------------------------- fair tuning
FIGURES = {"perm_fig1": fig1, "perm_fig2": image_curves, "perm_fig4": image_curves}


def lr_sweep(cfg: RunConfig, grid: list[float], **kwargs) -> pd.DataFrame:
    """The lr sweep of a curve stage (``curves.lr_sweep`` with the stage's figure function): ``python -m pflkit
    tune <stage>``."""
    return curves.lr_sweep(FIGURES[cfg.stage], cfg, grid, **kwargs)



def save_alpha(result: StageResult, path, seed: int | None = None) -> None:
    """PERM's final alpha (and each client's label histogram) for the heat-map figure (Fig. 5)."""


    seed = result.run_info["config"]["seeds"][0] if seed is None else seed
    state = result.states[("PERM", seed)]
    if state.alpha is None:
        raise ValueError("PERM never left its warm-up: no alpha to save (rounds <= warmup_rounds)")
    buf = _io.BytesIO()
    np.savez(buf, alpha=state.alpha.cpu().numpy(), label_counts=state.data.label_counts().numpy(),
             seed=seed, dataset=result.data_label, scale=result.scale)
    with atomic_path(resolve(path)) as tmp:
        tmp.write_bytes(buf.getvalue())


def matrix_frame(order, **matrices) -> pd.DataFrame:
    """N x N matrices (alpha, label overlap, ...) in display ``order`` as a long table for a heat-map figure:
    one row per (i, j) display position with the clients shown there and one column per matrix."""
    order = np.asarray(order)
    n = len(order)
    i, j = np.divmod(np.arange(n * n), n)
    frame = {"i": i, "j": j, "client_i": order[i], "client_j": order[j]}
    for name, m in matrices.items():
        frame[name] = np.asarray(m, dtype=np.float64)[order][:, order].reshape(-1)
    return pd.DataFrame(frame)


def load_alpha(path) -> dict:
    """Read what ``save_alpha`` wrote (plain arrays; no pickle)."""

    with np.load(resolve(path), allow_pickle=False) as z:
        return {k: (z[k].item() if z[k].ndim == 0 else z[k]) for k in z.files}


class PermFig5Config(StageConfig):
    alpha_file: str  # what perm_fig4 wrote: inside its models folder (alpha_folder)

    @model_validator(mode="after")
    def _alpha_file_inside_models(self):
        why = alpha_file_problem(self.alpha_file, self.results_dir, self.stage)
        raise_problems([("alpha_file", why)] if why else [])
        return self


# --------------------------------------------------------------------------- Fig. 3: round time
Workloads = names_from(("synthetic-logistic", "mnist-mlp"))


class PermFig3Config(MethodSettings):
    """Wall-clock time of one communication round (K local steps) per method, fixed CPU threads."""

    #: the synthetic-logistic workload: PERM's Fig. 1 data at its paper size, seed 0
    samples_per_client: ClassVar[int] = 500
    dim: ClassVar[int] = 60
    test_fraction: ClassVar[float] = 0.2

    def synthetic_requests(self) -> list[dict]:
        return [self.synthetic_request(0)] if "synthetic-logistic" in self.workloads else []

    synthetic_request = SyntheticData.synthetic_request
    synthetic = SyntheticData.synthetic
    threads: int = Field(ge=1)  # a fixed count: 'auto' is not allowed for a timing
    workloads: Workloads
    dataset: DatasetSection  # the mnist-mlp workload's images
    num_clients: int = Field(ge=2)
    local_steps: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    methods: MethodNames
    repeats: int = Field(ge=1)
    #: the methods' step sizes and localized FedAvg's fine-tuning (a timing: any small step will do)
    lr: CurveStepSizes
    finetune_steps: int | None = Field(None, ge=1)
    finetune_lr: float | None = Field(None, gt=0)
    perm: PermSection

    @field_validator("threads", mode="before")
    @classmethod
    def _threads(cls, v):  # replaces StageConfig's (int or 'auto'): the field's own rule applies
        return v

    @model_validator(mode="after")
    def _lr_for_each_method(self):
        raise_problems(missing_lrs(self.lr, self.methods) + curves.missing_settings(self))
        return self

    def footprint(self) -> Footprint:
        """The synthetic workload's federation (N x 500 x 61 values, float64 and float32), MNIST as loaded and
        federated (float32 train + test, twice; ``config.image_sources``), a round of the largest workload
        (``federated_memory``; the MNIST MLP's 784 -> 200 -> 200 -> 10) and one full-batch pass (PERM's alpha
        and global step: at most ``engine.full_batch.FULL_BATCH_BYTES`` of rows). The paper profile's canary
        (both workloads, N = 50, K = 20) peaked 598 MiB above its baseline process; this says 500 MiB."""
        data = self.num_clients * self.samples_per_client * (self.dim + 1) * 12
        features, hidden = (784, (200, 200)) if "mnist-mlp" in self.workloads else (self.dim + 1, ())
        if "mnist-mlp" in self.workloads:
            ds = self.dataset
            data += sum(2 * samples * (math.prod(shape) * 4 + 8)
                        for shape, _, samples in image_sources(ds.name, ds.substitute, ds.root, ds.allow_download))
        run = federated_memory(self.num_clients, self.local_steps, self.batch_size, features, hidden)
        data_key = "workloads" if "mnist-mlp" in self.workloads else "samples_per_client"
        return replace(run, models_key="num_clients") + Footprint(  # its networks are fixed: no 'hidden' key
            data=data, work=FULL_BATCH_BYTES, data_key=data_key)


def fig3(cfg: PermFig3Config) -> StageResult:
    """Time ``repeats`` consecutive rounds of every method after one warm-up round; PERM's time
    includes its periodic global-model + alpha updates (every ``perm.update_every`` rounds), so the
    per-round mean is the amortized cost. Rows: workload, method, repeat, seconds."""

    device = resolve_device(cfg.device)
    previous = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    rows = []
    try:
        for workload in cfg.workloads:
            if workload == "synthetic-logistic":
                data = cfg.synthetic(0)
                factory = lambda: logistic((cfg.dim,), 2)  # noqa: E731
            else:
                img = load_images(cfg.dataset)
                data = federate(img, cfg.num_clients, "iid", seed=0)
                factory = lambda img=img: mlp(img.shape, img.num_classes)  # noqa: E731
            data = data.to(device)
            model = FunctionalModel(factory, device)
            # what the method factories read: every client trains each round, weighted alike
            settings = SimpleNamespace(lr=cfg.lr, local_steps=cfg.local_steps, batch_size=cfg.batch_size,
                                       finetune_steps=cfg.finetune_steps, finetune_lr=cfg.finetune_lr,
                                       perm=cfg.perm, perfedavg=cfg.perfedavg, pfedme=cfg.pfedme,
                                       clients_per_round=None, weighting="uniform")
            for key in cfg.methods:
                algo = METHODS[key].make(model, settings)
                state = algo.round(algo.init(data, 0))
                for rep in range(cfg.repeats):
                    start = time.perf_counter()
                    state = algo.round(state)
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    rows.append({"workload": workload, "method": METHODS[key].name, "repeat": rep,
                                 "seconds": time.perf_counter() - start})
                note(f"{cfg.stage}: {workload} {METHODS[key].name} timed")
    finally:
        torch.set_num_threads(previous)
    times = pd.DataFrame(rows)
    return StageResult(times, {}, ", ".join(cfg.workloads), f"K={cfg.local_steps}, {cfg.repeats} rounds timed",
                       frames={"times": times})
