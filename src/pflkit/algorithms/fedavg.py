"""The one federated round (:class:`FederatedRound`), and three of its configurations: Alone (local
training), FedAvg / Local SGD (PERM Alg. 3) and localized FedAvg."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from ..data.federated import FederatedDataset
from ..engine.functional import FunctionalModel
from ..engine.local_sgd import expand_schedule, local_sgd
from ..engine.params import Params, broadcast, take
from ..checks import check_positive
from .base import BaseState, check_batch_size, eval_generator
from .round import (WEIGHTINGS, Outputs, Pass, Passes, PassRound, aggregate, check_aggregator, client_weights,
                    local_round, mask_extra, sample_clients, takes_every_client)
from .server_opt import ServerOpt


@dataclass
class LocalState(BaseState):
    params: Params  # [N, ..]


class Local(PassRound):
    """Every client trains its own model on its own data; no communication ("Alone")."""

    name = "Local"
    client_steps = PassRound.client_steps + ("own_steps",)
    federated = "Alone trains every client by itself: there is no server model to federate"

    def __init__(self, model: FunctionalModel, *, local_steps: int, lr: float, batch_size: int):
        self.model = model
        self.local_steps = check_positive("local_steps", local_steps, integer=True)
        self.lr = check_positive("lr", lr)
        self.batch_size = check_batch_size(batch_size)

    def init(self, data: FederatedDataset, seed: int) -> LocalState:
        w0 = self.model.init(seed)
        return LocalState(data, torch.Generator().manual_seed(seed), seed, 0,
                          broadcast(w0, data.num_clients))

    def own_steps(self, params: Params, data: FederatedDataset, clients: Tensor, generator, extra) -> Params:
        """K SGD steps of every client's own model on its own data."""
        params, _ = local_sgd(self.model, params, data, clients, steps=self.local_steps, lr=self.lr,
                              batch_size=self.batch_size, generator=generator)
        return params

    def round_passes(self, s: LocalState):
        clients = torch.arange(s.data.num_clients)
        params = yield Pass("own_steps", clients, s.params, s.generator, expand_schedule(clients, self.local_steps),
                            self.batch_size)
        return replace(s, round=s.round + 1, params=params)

    def personalize_pass(self, s: LocalState) -> Pass:
        return Pass("given", torch.arange(s.data.num_clients), s.params, eval_generator(s))


@dataclass
class FedAvgState(BaseState):
    w: Params  # the global (server) model, no leading dim
    server: dict  # the server optimizer's state (``ServerOpt.init``: a step count and tensors)


class FederatedRound(PassRound):
    """The one round: participants -> ``client_pass`` (the method's own client step; with sub-models, on the
    participants' masks) -> ``aggregate`` -> server step through ``server_opt``.

    ``clients_per_round`` clients take part in a round (None: all). ``weighting='uniform'`` averages with
    1/M (PERM's Alg. 3); ``'samples'`` weights by n_j (McMahan et al.). The clients send models
    (``sends = 'models'``: the server steps towards their average, ``ServerOpt.step_to``; plain GD at
    lr 1 is FedAvg's averaging) or pseudo-gradients (``'pseudo_gradients'``: LocalUpdate's q, the server
    steps with their average, ``ServerOpt.step``). (A projection of the server model onto an l2 ball,
    Alg. 3's optional W, is the server optimizer's ``radius``.) ``aggregator`` (``round.AGGREGATORS``): how the
    outputs are combined, their mean or (robust to a few bad clients, unweighted) their coordinate-wise median
    or trimmed mean (``trim_fraction`` cut from each tail), as Flower's FedMedian / FedTrimmedAvg.

    Partial training (HeteroFL, FedRolex: ``perm_hetero.PartialFedAvg``, PERM-hetero's warm-up) is this round
    with sub-models: a method with ``partial_training`` supplies each round's masks M_j^t (``round_masks``,
    stacked [N, ..] over all clients), every participant starts from and trains its sub-model M_j (.) w (the
    masks travel as the pass's per-model values, ``round.mask_extra``), and the aggregator is ``round.MASKED``
    (every coordinate averaged over the participants covering it). Personalized model: the server model for
    every client, unless the method says otherwise (``personalize_pass``)."""

    sends = "models"
    #: the client step a round asks its participants for
    client_step = "local_models"
    aggregator, trim_fraction = "mean", 0.2
    tolerates_missing = True  # a participant that does not answer is left out of the round's average
    #: whether the clients train sub-models (``round_masks``; the aggregator is then ``round.MASKED``)
    partial_training = False

    def set_round(self, *, batch_size, clients_per_round, weighting: str = "uniform",
                  server_opt: ServerOpt | None = None, aggregator: str = "mean", trim_fraction: float = 0.2):
        """Check and set the round's settings."""
        self.batch_size = check_batch_size(batch_size)
        self.clients_per_round = None if clients_per_round is None else \
            check_positive("clients_per_round", clients_per_round, integer=True)
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
        self.weighting = weighting
        if server_opt is not None and not isinstance(server_opt, ServerOpt):
            raise ValueError(f"server_opt must be a ServerOpt (gd, heavy_ball, nesterov, adam), got {server_opt!r}")
        self.server_opt = server_opt or ServerOpt("gd", 1.0)
        self.aggregator = check_aggregator(aggregator, trim_fraction, weighting, masked=self.partial_training)
        self.trim_fraction = float(trim_fraction)

    def init(self, data: FederatedDataset, seed: int, x0: Params | None = None) -> FedAvgState:
        w = self.model.init(seed) if x0 is None else {k: v.clone() for k, v in x0.items()}
        return FedAvgState(data, torch.Generator().manual_seed(seed), seed, 0, w, self.server_opt.init(w))

    def participants(self, s: FedAvgState) -> Tensor:
        return sample_clients(s.data.num_clients, self.clients_per_round, s.generator)

    def batch_schedule(self, clients: Tensor) -> Tensor:
        """The clients whose minibatches the client step draws, one row per draw: [local_steps, M]."""
        return expand_schedule(clients, self.local_steps)

    def round_masks(self, s: FedAvgState) -> Params | None:
        """M_j^t, stacked [N, ..] over all clients: the sub-models the clients train this round (a method with
        ``partial_training`` supplies them; None: every client trains the whole model)."""
        return None

    def client_pass(self, s: FedAvgState, clients: Tensor) -> Pass:
        """The round's client step (``client_step``) on the participants, every one from the server model (with
        partial training, ``round_passes`` adds the participants' masks to its per-model values)."""
        return Pass(self.client_step, clients, s.w, s.generator, self.batch_schedule(clients), self.batch_size,
                    shared=True)

    def round_passes(self, s: FedAvgState):
        clients = self.participants(s)
        masks = self.round_masks(s) if self.partial_training else None
        if masks is not None and not takes_every_client(s.data.num_clients, self.clients_per_round):
            masks = take(masks, clients)
        p = self.client_pass(s, clients)
        p.extra.update(mask_extra(masks))  # the participants' sub-models M_j (none without partial training)
        out = yield p
        if isinstance(out, Outputs):  # some participants did not answer: the round goes on without them
            clients = clients[out.answered]
            masks = None if masks is None else take(masks, out.answered)
        avg = aggregate(out, client_weights(s.data, clients, self.weighting), aggregator=self.aggregator,
                        trim_fraction=self.trim_fraction, masks=masks, base=s.w)
        step = self.server_opt.step_to if self.sends == "models" else self.server_opt.step
        w, server = step(s.w, avg, s.server)
        return (yield from self.after_passes(s, replace(s, round=s.round + 1, w=w, server=server), clients))

    def after_passes(self, before: FedAvgState, after: FedAvgState, clients: Tensor) -> Passes:
        """Passes after the server step, on the round's participants that answered (``before``: the state the
        round started from, ``after``: the state after the server step); returns the round's new state. None
        by default; Ditto's personal models are trained here."""
        return after
        yield

    def personalize_pass(self, s: FedAvgState) -> Pass:
        return Pass("global_model", torch.arange(s.data.num_clients), s.w, eval_generator(s), shared=True)


class FedAvg(FederatedRound):
    """Local SGD / FedAvg: broadcast w, K local SGD steps on each participating client, average (see
    :class:`FederatedRound` for the participants, weighting and ``server_opt``: FedAvgM, FedAdam, a projection).
    Its personalized model is the global model for every client."""

    name = "FedAvg"
    client_steps = PassRound.client_steps + ("local_models",)

    def __init__(self, model: FunctionalModel, *, local_steps: int, lr: float, batch_size: int | None,
                 clients_per_round: int | None = None, weighting: str = "uniform",
                 server_opt: ServerOpt | None = None, aggregator: str = "mean", trim_fraction: float = 0.2):
        self.model = model
        self.local_steps = check_positive("local_steps", local_steps, integer=True)
        self.lr = check_positive("lr", lr)
        self.set_round(batch_size=batch_size, clients_per_round=clients_per_round, weighting=weighting,
                       server_opt=server_opt, aggregator=aggregator, trim_fraction=trim_fraction)

    def local_models(self, w: Params, data: FederatedDataset, clients: Tensor, generator, extra) -> Params:
        """The participants' local models [M, ..] from the global model w (``local_round``)."""
        return local_round(self.model, w, data, clients, steps=self.local_steps, lr=self.lr,
                           batch_size=self.batch_size, generator=generator)


class LocalizedFedAvg(FedAvg):
    """FedAvg whose global model is fine-tuned on each client's *training* data for
    ``finetune_steps`` SGD steps (lr ``finetune_lr``) before evaluation."""

    name = "Localized FedAvg"
    client_steps = FedAvg.client_steps + ("finetuned",)

    def __init__(self, model: FunctionalModel, *, finetune_steps: int, finetune_lr: float, **kwargs):
        super().__init__(model, **kwargs)
        self.finetune_steps = check_positive("finetune_steps", finetune_steps, integer=True)
        self.finetune_lr = check_positive("finetune_lr", finetune_lr)

    def finetuned(self, w: Params, data: FederatedDataset, clients: Tensor, generator, extra) -> Params:
        tuned, _ = local_sgd(self.model, broadcast(w, len(clients)), data, clients, steps=self.finetune_steps,
                             lr=self.finetune_lr, batch_size=self.batch_size, generator=generator)
        return tuned

    def personalize_pass(self, s: FedAvgState) -> Pass:
        clients = torch.arange(s.data.num_clients)
        return Pass("finetuned", clients, s.w, eval_generator(s), expand_schedule(clients, self.finetune_steps),
                    self.batch_size, shared=True)
