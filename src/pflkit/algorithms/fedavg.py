"""Alone (local training), FedAvg / Local SGD (PERM Alg. 3) and localized FedAvg."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..data.federated import FederatedDataset
from ..engine.functional import FunctionalModel
from ..engine.local_sgd import expand_schedule, local_sgd
from ..engine.params import Params, broadcast
from .base import BaseState, check_batch_size, check_positive, eval_generator
from .round import WEIGHTINGS, aggregate, client_weights, local_round, sample_clients


@dataclass
class LocalState(BaseState):
    params: Params  # [N, ..]


class Local:
    """Every client trains its own model on its own data; no communication ("Alone")."""

    name = "Local"

    def __init__(self, model: FunctionalModel, *, local_steps: int, lr: float, batch_size: int):
        self.model = model
        self.local_steps = check_positive("local_steps", local_steps, integer=True)
        self.lr = check_positive("lr", lr)
        self.batch_size = check_batch_size(batch_size)

    def init(self, data: FederatedDataset, seed: int) -> LocalState:
        w0 = self.model.init(seed)
        return LocalState(data, torch.Generator().manual_seed(seed), seed, 0,
                          broadcast(w0, data.num_clients))

    def round(self, s: LocalState) -> LocalState:
        clients = torch.arange(s.data.num_clients)
        params, _ = local_sgd(self.model, s.params, s.data, clients, steps=self.local_steps, lr=self.lr,
                              batch_size=self.batch_size, generator=s.generator)
        return LocalState(s.data, s.generator, s.seed, s.round + 1, params)

    def personalized(self, s: LocalState) -> Params:
        return s.params


@dataclass
class FedAvgState(BaseState):
    w: Params  # the global model, no leading dim


class FedAvg:
    """Local SGD / FedAvg: broadcast w, K local SGD steps on each participating client, average.

    ``clients_per_round`` clients take part in a round (None: all). ``weighting='uniform'`` averages
    with 1/M as in PERM's Alg. 3; ``'samples'`` weights by n_j (McMahan et al.). ``radius`` projects w
    onto the l2 ball W after each round (Alg. 3's optional projection; ``None`` = off). Its
    personalized model is the global model for every client.
    """

    name = "FedAvg"

    def __init__(self, model: FunctionalModel, *, local_steps: int, lr: float, batch_size: int | None,
                 clients_per_round: int | None = None, weighting: str = "uniform", radius: float | None = None):
        self.model = model
        self.local_steps = check_positive("local_steps", local_steps, integer=True)
        self.lr = check_positive("lr", lr)
        self.batch_size = check_batch_size(batch_size)
        self.clients_per_round = None if clients_per_round is None else \
            check_positive("clients_per_round", clients_per_round, integer=True)
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
        self.weighting = weighting
        self.radius = None if radius is None else check_positive("radius", radius)

    def init(self, data: FederatedDataset, seed: int) -> FedAvgState:
        return FedAvgState(data, torch.Generator().manual_seed(seed), seed, 0, self.model.init(seed))

    def participants(self, s: FedAvgState) -> torch.Tensor:
        return sample_clients(s.data.num_clients, self.clients_per_round, s.generator)

    def aggregate(self, s: FedAvgState, clients: torch.Tensor, local: Params) -> Params:
        return aggregate(local, client_weights(s.data, clients, self.weighting), self.radius)

    # -- the round, in three parts a federated engine calls apart (``pflkit.flower``): the participants
    # (drawn on the server), the client work (each client alone, on the minibatches of ``batch_schedule``)
    # and the server update
    def client_work(self, w: Params, data: FederatedDataset, clients: torch.Tensor,
                    generator: torch.Generator) -> Params:
        """The participants' local models [M, ..] from the global model w (``local_round``)."""
        return local_round(self.model, w, data, clients, steps=self.local_steps, lr=self.lr,
                           batch_size=self.batch_size, generator=generator)

    def batch_schedule(self, clients: torch.Tensor) -> torch.Tensor:
        """The one ``sample_indices`` call of ``client_work`` (client axis last): [K, M]."""
        return expand_schedule(clients, self.local_steps)

    def server_update(self, s: FedAvgState, clients: torch.Tensor, local: Params) -> Params:
        """The new global model from the participants' outputs."""
        return self.aggregate(s, clients, local)

    def round(self, s: FedAvgState) -> FedAvgState:
        clients = self.participants(s)
        local = self.client_work(s.w, s.data, clients, s.generator)
        return FedAvgState(s.data, s.generator, s.seed, s.round + 1, self.server_update(s, clients, local))

    def personal_schedule(self, n: int) -> torch.Tensor | None:
        """The ``sample_indices`` call of ``personalized`` for n clients (None: it draws nothing)."""
        return None

    def personalized(self, s: FedAvgState) -> Params:
        return broadcast(s.w, s.data.num_clients)


class LocalizedFedAvg(FedAvg):
    """FedAvg whose global model is fine-tuned on each client's *training* data for
    ``finetune_steps`` SGD steps (lr ``finetune_lr``) before evaluation."""

    name = "Localized FedAvg"

    def __init__(self, model: FunctionalModel, *, finetune_steps: int, finetune_lr: float, **kwargs):
        super().__init__(model, **kwargs)
        self.finetune_steps = check_positive("finetune_steps", finetune_steps, integer=True)
        self.finetune_lr = check_positive("finetune_lr", finetune_lr)

    def personal_schedule(self, n: int) -> torch.Tensor:
        return expand_schedule(torch.arange(n), self.finetune_steps)

    def personalized(self, s: FedAvgState) -> Params:
        n = s.data.num_clients
        tuned, _ = local_sgd(self.model, broadcast(s.w, n), s.data, torch.arange(n),
                             steps=self.finetune_steps, lr=self.finetune_lr,
                             batch_size=self.batch_size, generator=eval_generator(s))
        return tuned
