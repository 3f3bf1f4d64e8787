"""Ditto (Li, Hu, Beirami, Smith, ICML 2021, Alg. 1): a global FedAvg model and a proximal personal model per
client, batched over clients.

Round t, on the participants S_t, both from the round's global model w^t:

    global update (FedAvg):  K local SGD steps from w^t on f_k; the server averages them into w^{t+1};
    personal update:         v_k <- v_k - eta_p (grad f_k(v_k; batch) + lambda (v_k - w^t)),  ``personal_steps``
                             times; the other clients' v_k stay.

Client k's personalized model is v_k, initialised to the initial global model w^0.
``lam`` = 0 is training alone on the participants' rounds; a large ``lam`` keeps v_k at the global model.

The round is :class:`~.fedavg.FederatedRound` (participants, FedAvg's client step, aggregate, ``ServerOpt``) with
one more pass on the same participants (``FederatedRound.after_passes``), so it runs on a federated engine
as it runs here. Randomness per round, in this order, from the state's generator: the participants, the
global pass's key, the personal pass's key.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from ..checks import check_positive
from ..data.federated import FederatedDataset
from ..engine.local_sgd import expand_schedule, local_sgd
from ..engine.params import Params, broadcast, take
from .base import eval_generator
from .fedavg import FedAvg, FedAvgState
from .round import Outputs, Pass, prefixed, unprefixed


@dataclass
class DittoState(FedAvgState):
    v: Params  # every client's personal model, stacked [N, ..]


class Ditto(FedAvg):
    """Ditto: FedAvg (``lr``, ``local_steps``, participants and weighting as :class:`FedAvg`) plus, on each
    participant, ``personal_steps`` SGD steps at ``personal_lr`` on f_k + lam/2 |v_k - w^t|^2."""

    name = "Ditto"
    client_steps = FedAvg.client_steps + ("personal_update",)

    def __init__(self, model, *, lr: float, local_steps: int, batch_size: int | None, lam: float,
                 personal_lr: float, personal_steps: int, clients_per_round: int | None, weighting: str):
        super().__init__(model, local_steps=local_steps, lr=lr, batch_size=batch_size,
                         clients_per_round=clients_per_round, weighting=weighting)
        self.lam = float(check_positive("lam", lam, allow_zero=True))  # 0: no pull towards the global model
        self.personal_lr = check_positive("personal_lr", personal_lr)
        self.personal_steps = check_positive("personal_steps", personal_steps, integer=True)

    def init(self, data: FederatedDataset, seed: int, x0: Params | None = None) -> DittoState:
        s = super().init(data, seed, x0)
        return DittoState(s.data, s.generator, s.seed, s.round, s.w, s.server, broadcast(s.w, data.num_clients))

    def personal_update(self, v: Params, data: FederatedDataset, clients: Tensor, generator, extra) -> Params:
        """The participants' personal models [M, ..] after ``personal_steps`` proximal SGD steps towards the
        round's global model (``extra``'s ``anchor.*``, [M, ..])."""
        anchor = unprefixed("anchor", extra)
        out, _ = local_sgd(self.model, v, data, clients, steps=self.personal_steps, lr=self.personal_lr,
                           batch_size=self.batch_size, generator=generator, prox=self.lam,
                           anchor=anchor if self.lam else None)
        return out

    def after_passes(self, before: DittoState, after: DittoState, clients: Tensor):
        """The personal pass on the round's participants, anchored at the round's global model w^t."""
        anchor = prefixed("anchor", broadcast(before.w, len(clients)))
        out = yield Pass("personal_update", clients, take(before.v, clients), after.generator,
                         expand_schedule(clients, self.personal_steps), self.batch_size, extra=anchor)
        if isinstance(out, Outputs):  # some participants did not answer: theirs stay
            clients = clients[out.answered]
        v = {k: t.index_copy(0, clients.to(t.device), out[k]) for k, t in before.v.items()}
        return replace(after, v=v)

    def personalize_pass(self, s: DittoState) -> Pass:
        return Pass("given", torch.arange(s.data.num_clients), s.v, eval_generator(s))
