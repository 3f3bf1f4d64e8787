"""The one federated round, and the parts it is composed of, written once:

    participants (``sample_clients``) -> client step (a :class:`Pass`: the algorithm's own client code on
    the clients, stacked) -> ``aggregate`` -> server step (``ServerOpt``; plain GD at lr 1 is FedAvg)

:class:`FederatedRound` is that round. FedAvg, localized FedAvg, Per-FedAvg, pFedMe, LocalUpdate (MAML,
FedProx, Reptile, FOMAML, FedAdam) and partial-training FedAvg (with masks) are configurations of it: a client
step and its settings. PERM and PERM-hetero write their rounds as passes too: their warm-up is this round,
their global step a ``ServerOpt`` step; alpha and the shuffle are their own.

**A round is a generator of passes.** ``round_passes(state)`` yields one :class:`Pass` at a time (which
client step, on which clients, from which models, with which draws) and receives the stacked outputs;
it returns the new state. In one process :func:`run_passes` runs each pass for all its clients at once
(``round``); a federated engine (``pflkit.flower``) sends each client its slice of the same pass and
runs the same client step there, so both run the same round body. Evaluation is a pass too
(``personalize_pass``: the client step that makes the personalized models).

Partial training (sub-models of one server model, ``models.width``) is the same round with masks: each
round's sub-models go to the clients as per-model values (``mask_extra``) and the aggregate is ``MASKED``.
"""
from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..checks import is_real
from ..data.draws import ClientDraws, as_draws
from ..data.federated import FederatedDataset
from ..engine.local_sgd import local_sgd
from ..engine.params import Params, apply_masks, broadcast, mean

WEIGHTINGS = ("uniform", "samples")
#: how the server combines the participants' outputs: their (weighted) mean, or, robust to a few bad clients,
#: the coordinate-wise median and trimmed mean as Flower's FedMedian and FedTrimmedAvg define them (unweighted)
AGGREGATORS = ("mean", "median", "trimmed_mean")
#: the partial-training aggregate (HeteroFL / FedRolex): every coordinate averaged over the participants whose
#: sub-model covers it; the aggregator of a round with sub-model masks, and of no other
MASKED = "masked"


def takes_every_client(num_clients: int, clients_per_round: int | None) -> bool:
    """Whether every client takes part in each round (``clients_per_round`` None or >= the number of clients)."""
    return clients_per_round is None or clients_per_round >= num_clients


def sample_clients(num_clients: int, clients_per_round: int | None, generator: torch.Generator) -> Tensor:
    """The round's participants: ``clients_per_round`` clients drawn without replacement, sorted
    (all of them, and no draw, when every client takes part: ``takes_every_client``)."""
    if takes_every_client(num_clients, clients_per_round):
        return torch.arange(num_clients)
    return torch.randperm(num_clients, generator=generator)[:clients_per_round].sort().values


def client_weights(data: FederatedDataset, clients: Tensor, weighting: str) -> Tensor | None:
    """Aggregation weights of the participants: None (uniform, 1/M as PERM's Alg. 3) or their
    training-set sizes n_j (``'samples'``, McMahan et al.)."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    return data.train_sizes[clients].float() if weighting == "samples" else None


def local_round(model, w: Params, data: FederatedDataset, clients: Tensor, *, steps: int, lr: float | Tensor,
                batch_size: int | None, generator: torch.Generator, masks: Params | None = None) -> Params:
    """FedAvg's client side: broadcast w to ``clients`` (their sub-models m_j (.) w with ``masks``
    stacked [M, ..]), K (masked) SGD steps each; returns the local models stacked [M, ..]."""
    start = broadcast(w, len(clients))
    if masks is not None:
        start = apply_masks(start, masks)
    local, _ = local_sgd(model, start, data, clients, steps=steps, lr=lr, batch_size=batch_size,
                         generator=generator, masks=masks)
    return local


def check_aggregator(aggregator: str, trim_fraction: float = 0.2, weighting: str = "uniform",
                     masked: bool = False) -> str:
    """``aggregator`` if it is one of ``AGGREGATORS`` (with ``masked``, a round of sub-models: ``MASKED``, the only
    aggregate of sub-models) and fits the other settings (``trim_fraction`` in [0, 0.5), as Flower's
    FedTrimmedAvg's ``beta``; the robust and the masked aggregates are unweighted: ``weighting`` 'uniform')."""
    allowed = (MASKED,) if masked else AGGREGATORS
    if aggregator not in allowed:
        raise ValueError(f"aggregator must be one of {allowed}, got {aggregator!r}")
    if not is_real(trim_fraction) or not 0 <= trim_fraction < 0.5:
        raise ValueError(f"trim_fraction must be a number in [0, 0.5) (the share cut from each tail), "
                         f"got {trim_fraction!r}")
    if aggregator != "mean" and weighting != "uniform":
        raise ValueError(f"aggregator {aggregator!r} is unweighted (as Flower's FedMedian / FedTrimmedAvg): "
                         f"weighting must be 'uniform' with it, got {weighting!r}")
    return aggregator


def robust_mean(local: Params, aggregator: str, trim_fraction: float = 0.2) -> Params:
    """Every coordinate over the participants' outputs (stacked [M, ..]): their median (``'median'``, the mean of
    the two middle values when M is even, as ``numpy.median``, which Flower's FedMedian takes), or their mean
    after cutting ``int(trim_fraction * M)`` of the smallest and as many of the largest values
    (``'trimmed_mean'``, Flower's FedTrimmedAvg's ``trim_mean``). A share below one half of the participants
    moves neither beyond the range of the others' values."""
    check_aggregator(aggregator, trim_fraction)
    out = {}
    for k, v in local.items():
        m = v.shape[0]
        s = v.sort(0).values
        if aggregator == "median":
            out[k] = s[m // 2] if m % 2 else (s[m // 2 - 1] + s[m // 2]) / 2
        elif aggregator == "trimmed_mean":
            cut = int(trim_fraction * m)
            out[k] = s[cut:m - cut].mean(0)
        else:
            raise ValueError(f"robust_mean takes 'median' or 'trimmed_mean', got {aggregator!r}")
    return out


def aggregate(local: Params, weights: Tensor | None = None, *, masks: Params | None = None,
              base: Params | None = None, aggregator: str = "mean", trim_fraction: float = 0.2) -> Params:
    """The server's average of the participants' outputs (stacked [M, ..]), weights normalised.

    ``aggregator`` (``AGGREGATORS``): ``'mean'`` that average; ``'median'`` / ``'trimmed_mean'`` the robust,
    unweighted coordinate-wise statistics of :func:`robust_mean` instead (no ``weights``, no ``masks``).

    ``MASKED`` (or the mean given ``masks``; partial training: each output covers its sub-model only): every
    coordinate is averaged over the participants whose mask covers it, w_c = sum_j M_jc u_jc / sum_j M_jc, and
    a coordinate nobody covers keeps its value in ``base``."""
    if aggregator == MASKED and masks is None:
        raise ValueError(f"aggregator {MASKED!r} averages sub-models: it takes masks (and base)")
    if aggregator not in ("mean", MASKED):
        check_aggregator(aggregator, trim_fraction)
        if weights is not None or masks is not None:
            raise ValueError(f"aggregator {aggregator!r} takes no weights and no masks (it is unweighted and "
                             "covers every coordinate)")
        return robust_mean(local, aggregator, trim_fraction)
    if masks is not None:
        if weights is not None or base is None:
            raise ValueError("a masked aggregate takes base (the values of uncovered coordinates), "
                             "and no weights")
        out = {}
        for k, p in base.items():
            count = masks[k].sum(0)
            out[k] = torch.where(count > 0, (local[k] * masks[k]).sum(0) / count.clamp_min(1), p)
        return out
    return mean(local, weights)


def client_update(model, start: Params, data: FederatedDataset, clients: Tensor, *, theta: Tensor,
                  gamma: float | Tensor, alpha: float, batch_size: int | None,
                  generator: torch.Generator) -> Params:
    """LocalUpdate's ClientUpdate (Charles & Konecny, Alg. 2) for models ``start`` stacked [M, ..] on
    ``clients`` [M]: K = len(theta) SGD steps with lr gamma on f_i(v) + alpha/2 |v - start|^2, returning
    sum_k theta_k g_k per model. ``gamma`` may be one value per model ([M])."""
    m = len(clients)
    _, _, q = local_sgd(model, start, data, clients, steps=len(theta), lr=gamma, batch_size=batch_size,
                        generator=generator, prox=alpha, anchor=start if alpha else None,
                        # [K, M] explicitly: a [K] vector is read as per-model when K == M
                        grad_weights=theta.float().unsqueeze(1).expand(len(theta), m))
    return q


# --------------------------------------------------------------------------- a round as passes
@dataclass
class Pass:
    """One exchange of a round: every model of ``models`` goes to its client in ``clients``, runs the
    algorithm's client step ``step`` there and comes back.

    ``step``: the name of one of the algorithm's ``client_steps``, a method
    ``step(models, data, clients, draws, extra) -> Params`` (outputs stacked [M, ..] in the order of
    ``clients``); ``clients`` [M] (a client may host several models); ``models``: stacked [M, ..], or with
    ``shared`` one model every client starts from; ``extra``: per-model tensors [M, ..] (e.g. step sizes);
    ``draws``: the pass's per-client random streams (``data.draws.ClientDraws``; given the run's generator,
    one key is drawn from it here), from which every client draws its own minibatch rows and dropout
    masks, so a federated client needs only the key. ``schedule`` (client axis last) and ``batch_size``
    say what the step draws: None, nothing (no key is drawn and the streams refuse to be read)."""

    step: str
    clients: Tensor
    models: Params
    draws: ClientDraws | torch.Generator
    schedule: Tensor | None = None
    batch_size: int | None = None
    shared: bool = False
    extra: dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self):  # a key from the run's stream only for a pass that draws
        draws = self.schedule is not None and self.batch_size is not None
        self.draws = as_draws(self.draws) if draws else ClientDraws(ClientDraws.NONE)


Passes = Generator[Pass, Params, object]


class Outputs(dict):
    """A pass's outputs when some of its clients did not answer (a federated engine tolerating failures):
    the answered models' outputs stacked [A, ..] and ``answered`` [A], their positions in the pass. Only a
    method that declares ``tolerates_missing`` is sent one; it goes on with the clients that answered."""

    def __init__(self, outputs: Params, answered: Tensor):
        super().__init__(outputs)
        self.answered = answered


def prefixed(prefix: str, models: Params) -> dict[str, Tensor]:
    """Stacked per-model tensors [M, ..] (masks, an anchor model) as a pass's per-model values, each name under
    ``prefix`` (``unprefixed`` reads them back in the step)."""
    return {f"{prefix}.{k}": t for k, t in models.items()}


def unprefixed(prefix: str, extra: dict[str, Tensor]) -> Params:
    """The per-model values a pass carries under ``prefix`` (``prefixed``'s), by their own names."""
    head = prefix + "."
    return {k[len(head):]: t for k, t in extra.items() if k.startswith(head)}


def mask_extra(masks: Params | None) -> dict[str, Tensor]:
    """Sub-model masks [M, ..] as a pass's per-model values (``masks_of`` reads them back in the step)."""
    return {} if masks is None else prefixed("mask", masks)


def masks_of(extra: dict[str, Tensor]) -> Params | None:
    return unprefixed("mask", extra) or None


def run_step(algorithm, p: Pass, data: FederatedDataset) -> Params:
    """The pass's client step for all its clients at once (in this process, on the whole federation)."""
    if p.step not in algorithm.client_steps:
        raise ValueError(f"{type(algorithm).__name__} has client steps {algorithm.client_steps}, got {p.step!r}")
    return getattr(algorithm, p.step)(p.models, data, p.clients, p.draws, p.extra)


def drive(passes: Passes, exchange, replies=None):
    """Run a generator of passes to its end, ``exchange`` carrying each pass to the clients and back (or,
    given ``replies`` to the pass it stands at, going on from there); returns the generator's value."""
    try:
        p = next(passes) if replies is None else passes.send(replies)
        while True:
            p = passes.send(exchange(p))
    except StopIteration as stop:
        return stop.value


def run_passes(algorithm, passes: Passes, data: FederatedDataset):
    """Run a round's passes in this process, each for all its clients at once; returns the round's value."""
    return drive(passes, lambda p: run_step(algorithm, p, data))


class PassRound:
    """What a method whose round is written as passes gets: ``round`` and ``personalized`` run in this
    process, and the two client steps that hand models over unchanged."""

    #: the methods a client may be asked to run (a federated client refuses any other name)
    client_steps: tuple[str, ...] = ("given", "global_model")
    #: whether a federated engine (``pflkit.flower``) can run the method (otherwise: why it cannot)
    federated: bool | str = True
    #: whether a round can go on without some clients' outputs (``Outputs``: the answered ones only)
    tolerates_missing: bool = False

    def initial_state(self, data: FederatedDataset, seed: int):
        """The state before ``start_passes`` (for most methods, ``init``'s)."""
        return self.init(data, seed)

    def round(self, s):
        return run_passes(self, self.round_passes(s), s.data)

    def personalized(self, s) -> Params:
        return run_step(self, self.personalize_pass(s), s.data)

    def start_passes(self, s) -> Passes:
        """Passes before round 1, updating ``s`` (none by default)."""
        return s
        yield

    def given(self, models: Params, data, clients, generator, extra) -> Params:
        """The personalized models the server holds, unchanged."""
        return models

    def global_model(self, w: Params, data, clients: Tensor, generator, extra) -> Params:
        """The one global model as every listed client's model."""
        return broadcast(w, len(clients))
