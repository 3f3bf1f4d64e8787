"""pFedMe (Dinh, Tran, Nguyen 2020): personalized models via Moreau envelopes, batched over clients.

Client i's personalized model is the proximal point (Dinh et al., eq. (3))

    theta_i(w) = argmin_theta f_i(theta) + lambda/2 ||theta - w||^2.

Local round on client i (Alg. 1), starting from the broadcast global model w (w_local = theta = w):
for each of the R = ``local_steps`` local steps draw ONE minibatch D of ``batch_size`` training samples
and run K = ``inner_steps`` gradient steps on it (``personal_lr`` = the personal learning rate),

    theta <- theta - personal_lr (grad f_i(theta; D) + lambda (theta - w_local)),

then move the local model towards the approximate prox point (``lr`` = eta),

    w_local <- w_local - lr lambda (w_local - theta).

As in the official code, theta is warm-started: the inner solve of local step r starts from the
theta left by step r-1 (from w at the start of the round). The server mixes (eq. (7) / Alg. 1)

    w <- (1 - beta) w + beta mean_i w_local_i   (uniform, or weighted by n_i; beta = 1 is plain
                                                 averaging, the official code's tuned value is 2).

Personalized model (what pFedMe is scored on), as in the official code (``evaluate_personalized_model``
after every client's ``train``): the theta each client holds at the end of its local round (R x K steps as
above) started from the *current* global model -- the local round the next round runs, with that round's
own draws. The pass draws from a copy of the run's generator what the next round will draw from the
generator itself (the participants, then the pass's key), so evaluating never changes training. In process
(``PFedMe.personalized``) the evaluation leaves that local round in the state (``PFedMeState.ahead``) and the
next round (``PFedMe.round``) takes its local models from there instead of running the same local round again.
It is computed for every client, participating or not (the official code trains every client every round);
it is kept only when every client takes part in the next round (``clients_per_round`` None, the papers'
setting), otherwise that round computes its participants' local rounds itself, from the same per-client draws.

Randomness per round, in this order, from the state's generator: the participants (as FedAvg), then
the client pass's key (``ClientDraws``: client c's minibatch rows come from its own stream of that key).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch
from torch import Tensor

from ..data.draws import ClientDraws
from ..data.federated import FederatedDataset
from ..engine.functional import FunctionalModel
from ..engine.params import Params, broadcast
from ..checks import check_positive
from .fedavg import FedAvg, FedAvgState
from .round import Pass, drive, run_step, takes_every_client
from .server_opt import ServerOpt


@dataclass(frozen=True)
class LocalRound:
    """An evaluation's local round (``PFedMe.personalized``): the local models and thetas of ``clients`` from the
    global model ``w`` (the very tensors, at their ``versions``) with the pass key ``key``."""
    w: Params
    versions: dict
    clients: Tensor
    key: int
    local: Params
    theta: Params

    @classmethod
    def of(cls, p: Pass, local: Params, theta: Params) -> "LocalRound":
        return cls(dict(p.models), {k: t._version for k, t in p.models.items()}, p.clients.clone(), p.draws.key,
                   local, theta)

    def serves(self, p: Pass) -> bool:
        """Whether pass ``p`` is this local round: the same key and clients, from the same unmodified ``w``."""
        return (p.draws.key == self.key and p.models.keys() == self.w.keys()
                and all(self.w[k] is t and t._version == self.versions[k] for k, t in p.models.items())
                and torch.equal(p.clients, self.clients))


@dataclass
class PFedMeState(FedAvgState):
    #: the last evaluation's local round, for the round after it (``PFedMe.round``); not a field of ``__init__``,
    #: so ``dataclasses.replace`` (every new round's state) starts without it and checkpoints leave it out
    ahead: LocalRound | None = field(default=None, init=False, repr=False, compare=False)


class PFedMe(FedAvg):
    """pFedMe, batched over clients.

    ``lr``: eta, the local-model step; ``personal_lr``: the inner (theta) step; ``lam``: lambda, the
    prox strength; ``inner_steps``: K; ``local_steps``: R; ``beta``: server mixing (any > 0).
    Official-code settings (lr / personal_lr / beta / lambda, batch 20, R = 20, K = 5): MNIST
    logistic .01/.1/2/15, MNIST MLP .01/.05/2/30, Synthetic logistic .01/.01/2/20, Synthetic MLP
    .01/.01/2/30.
    """

    name = "pFedMe"
    client_steps = FedAvg.client_steps + ("personal_models",)

    def __init__(self, model: FunctionalModel, *, lr: float, personal_lr: float, lam: float,
                 local_steps: int, batch_size: int, inner_steps: int = 5, beta: float = 1.0,
                 clients_per_round: int | None = None, weighting: str = "uniform"):
        if batch_size is None:
            raise ValueError("batch_size must be an integer > 0 (pFedMe draws one minibatch per local "
                             "step), got None")
        self.beta = check_positive("beta", beta)
        super().__init__(model, local_steps=local_steps, lr=lr, batch_size=batch_size,
                         clients_per_round=clients_per_round, weighting=weighting, server_opt=ServerOpt("gd", beta))
        self.personal_lr = check_positive("personal_lr", personal_lr)
        self.lam = check_positive("lam", lam)
        self.inner_steps = check_positive("inner_steps", inner_steps, integer=True)

    def init(self, data: FederatedDataset, seed: int, x0: Params | None = None) -> PFedMeState:
        s = super().init(data, seed, x0)
        return PFedMeState(**{f.name: getattr(s, f.name) for f in fields(s)})

    def client_updates(self, w: Params, data: FederatedDataset, clients: Tensor,
                       generator: ClientDraws) -> tuple[Params, Params]:
        """One pFedMe local round from w on every listed client at once -> (w_local, theta), [M, ..]."""
        m, lam = len(clients), self.lam
        idx = data.sample_indices(self.batch_schedule(clients), self.batch_size, generator)  # [R, M, B]
        local, theta = broadcast(w, m), broadcast(w, m)  # our own copies: updated in place below
        tmp = {k: torch.empty_like(t) for k, t in theta.items()}
        grads = {k: torch.empty_like(t) for k, t in theta.items()}  # every step's gradient (batched_grad's out)
        # in place, one buffer per tensor, the same operations in the same order as the module docstring's
        # formulas (the same float results) without an M x P temporary per operation
        with torch.no_grad():
            for r in range(self.local_steps):
                x, y = data.x_train[idx[r]], data.y_train[idx[r]]
                for _ in range(self.inner_steps):
                    g, _ = self.model.batched_grad(theta, x, y, out=grads)
                    for k, t in theta.items():  # theta - personal_lr (g + lambda (theta - local))
                        t.sub_(torch.sub(t, local[k], out=tmp[k]).mul_(lam).add_(g[k]).mul_(self.personal_lr))
                for k, p in local.items():  # local - lr lambda (local - theta)
                    p.sub_(torch.sub(p, theta[k], out=tmp[k]).mul_(self.lr * lam))
        return local, theta

    def reuses_evaluation(self, num_clients: int) -> bool:
        """Whether the round after an evaluation reuses its local rounds (every client takes part), so that
        a run evaluating E times before its last round computes E fewer rounds' client steps."""
        return takes_every_client(num_clients, self.clients_per_round)

    # -- the one round (``FederatedRound``) with pFedMe's client step; the server mixing is ServerOpt gd at lr beta
    def local_models(self, w: Params, data: FederatedDataset, clients: Tensor, generator, extra) -> Params:
        return self.client_updates(w, data, clients, generator)[0]

    def personal_models(self, w: Params, data: FederatedDataset, clients: Tensor, generator, extra) -> Params:
        return self.client_updates(w, data, clients, generator)[1]

    def personalized(self, s: PFedMeState) -> Params:
        """The thetas of ``personalize_pass``; when the next round reuses them (``reuses_evaluation``), the
        local round is kept in ``s.ahead`` (and a second evaluation of ``s`` returns the kept thetas)."""
        p = self.personalize_pass(s)
        if s.ahead is not None and s.ahead.serves(p):
            return s.ahead.theta
        local, theta = self.client_updates(p.models, s.data, p.clients, p.draws)
        if self.reuses_evaluation(s.data.num_clients):
            s.ahead = LocalRound.of(p, local, theta)
        return theta

    def round(self, s: PFedMeState) -> PFedMeState:
        """The one round in this process, its client pass answered by ``s.ahead`` when that is its local round."""
        ahead = s.ahead

        def step(p: Pass) -> Params:
            if ahead is not None and p.step == "local_models" and ahead.serves(p):
                return ahead.local
            return run_step(self, p, s.data)

        return drive(self.round_passes(s), step)

    def personalize_pass(self, s: FedAvgState) -> Pass:
        """Every client's local round from the current global model, with the draws the next round makes: that
        round's own participants and client pass, made on a copy of the run's generator (which stays untouched)."""
        ahead = replace(s, generator=torch.Generator().set_state(s.generator.get_state()))
        draws = self.client_pass(ahead, self.participants(ahead)).draws
        clients = torch.arange(s.data.num_clients)
        return Pass("personal_models", clients, s.w, draws, self.batch_schedule(clients), self.batch_size, shared=True)

