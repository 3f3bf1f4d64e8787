"""LocalUpdate (Charles & Konecny, Algs. 1-2), MAML, their Table 1 presets, and a closed-form quadratic path.

ClientUpdate(i, x): K(Theta) minibatch SGD steps (batch B, lr gamma) on f_i(v) + alpha/2 |v - x|^2
from v_1 = x, returning sum_k theta_k g_k. ServerUpdate: sample M clients, average their outputs into
q_t, x_{t+1} = ServerOpt(x_t, q_t). On quadratics E[ClientUpdate] = grad f~_i (Theorem 1).

- ``LocalUpdate`` / ``MAML``: any engine model (FunctionalModel or ``data.quadratic.QuadraticModel``),
  composed from the round's parts (``algorithms.round``): ``sample_clients`` -> ``client_update``
  (``engine.local_sgd`` with Theta weights and a proximal term) -> ``aggregate`` -> ``ServerOpt``.
- ``ServerOpt`` (``algorithms.server_opt``): gd, heavy_ball, nesterov and adam (= FedAdam), state as tensors.
- Presets (Table 1, ServerOpt = GD unless given): ``minibatch_sgd``, ``lookahead``, ``fedsgd``,
  ``fedavg`` (= Reptile), ``fedprox`` (= MetaMinibatchProx), ``fomaml``, ``maml``.
- ``QuadraticLocalUpdate``: the same algorithm on ``QuadraticClients`` as batched float64 matrix
  algebra (clients A [M, d, d]); exact (full-batch) or with the engine's minibatch draws.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor
from torch.func import grad, vmap

from ..data.draws import ClientDraws, LaneDraws
from ..data.federated import FederatedDataset
from ..data.quadratic_clients import QuadraticClients
from ..engine.local_sgd import expand_schedule
from ..engine.params import Params, broadcast, scale_like
from ..theory.surrogate import Theta, theta_1_to_K, theta_K
from ..checks import check_positive
from .base import BaseState
from .fedavg import FederatedRound
from .round import Pass, PassRound, client_update, sample_clients
from .server_opt import SERVER_KINDS, ServerOpt, momentum_step

__all__ = ["ServerOpt", "SERVER_KINDS", "LocalUpdate", "LocalUpdateGrid", "MAML", "QuadraticLocalUpdate",
           "Theta", "theta_K", "theta_1_to_K", "sample_clients", "minibatch_sgd", "lookahead",
           "fedsgd", "fedavg", "fedprox", "fomaml", "maml", "maml_theta"]

def _as_theta(theta) -> Theta:
    return theta if isinstance(theta, Theta) else Theta.of(theta)


def _check_common(alpha, gamma, batch_size, clients_per_round):
    check_positive("alpha", alpha, allow_zero=True)
    check_positive("gamma", gamma, allow_zero=True)
    if batch_size is not None:
        check_positive("batch_size", batch_size, integer=True)
    if clients_per_round is not None:
        check_positive("clients_per_round", clients_per_round, integer=True)


# ------------------------------------------------------------------------- LocalUpdate (engine)
class LocalUpdate(FederatedRound):
    """LocalUpdate(Theta, alpha, gamma, B, M, ServerOpt) for any engine model (Algs. 1-2): the one round
    (``FederatedRound``) whose clients send pseudo-gradients, averaged uniformly."""

    name = "LocalUpdate"
    sends = "pseudo_gradients"
    client_step = "updates"
    client_steps = FederatedRound.client_steps + ("updates",)

    def __init__(self, model, *, theta, gamma: float, alpha: float = 0.0, batch_size: int,
                 clients_per_round: int | None = None, server_opt: ServerOpt | None = None,
                 name: str | None = None):
        _check_common(alpha, gamma, batch_size, clients_per_round)
        self.model = model
        self.theta = _as_theta(theta)
        self.gamma, self.alpha = float(gamma), float(alpha)
        self.set_round(batch_size=batch_size, clients_per_round=clients_per_round, server_opt=server_opt)
        if name:
            self.name = name

    def client_updates(self, x: Params, data: FederatedDataset, clients: Tensor,
                       generator: torch.Generator) -> Params:
        """ClientUpdate (Alg. 2) for each listed client at once: sum_k theta_k g_k, stacked [M, ..]."""
        return client_update(self.model, broadcast(x, len(clients)), data, clients, theta=self.theta.weights,
                             gamma=self.gamma, alpha=self.alpha, batch_size=self.batch_size, generator=generator)

    def updates(self, x: Params, data: FederatedDataset, clients: Tensor, generator, extra) -> Params:
        return self.client_updates(x, data, clients, generator)

    def batch_schedule(self, clients: Tensor) -> Tensor:
        """The one ``sample_indices`` call of ``client_updates``: [K, M]."""
        return expand_schedule(clients, self.theta.K)


class MAML(LocalUpdate):
    """MAML with K inner minibatch GD steps (lr gamma) and the exact gradient through them.

    Client i sends grad_x f(X_K(x); S_out), X_K = K SGD steps on batches S_1..S_K, S_out a fresh
    batch; with full-batch steps on a quadratic this is grad f~_i(x; 0, gamma, Theta_{2K+1}) (Thm. 2).
    """

    name = "MAML"

    def __init__(self, model, *, inner_steps: int, gamma: float, batch_size: int,
                 clients_per_round: int | None = None, server_opt: ServerOpt | None = None,
                 name: str | None = None):
        check_positive("inner_steps", inner_steps, integer=True)
        super().__init__(model, theta=theta_K(1), gamma=gamma, alpha=0.0, batch_size=batch_size,
                         clients_per_round=clients_per_round, server_opt=server_opt, name=name)
        self.inner_steps = inner_steps
        self._meta_grad = vmap(grad(self.meta_loss))

    def meta_loss(self, x: Params, xs: Tensor, ys: Tensor, xo: Tensor, yo: Tensor) -> Tensor:
        """f(X_K(x); outer batch) for one client: xs [K, B, ..] inner batches, xo [B, ..] outer."""
        v = x
        for k in range(self.inner_steps):
            g = grad(self.model.loss)(v, xs[k], ys[k])
            v = {n: v[n] - self.gamma * g[n] for n in v}
        return self.model.loss(v, xo, yo)

    def client_updates(self, x: Params, data: FederatedDataset, clients: Tensor,
                       generator: torch.Generator) -> Params:
        K, m = self.inner_steps, len(clients)
        idx = data.sample_indices(clients.unsqueeze(0).expand(K + 1, m), self.batch_size, generator)
        idx = idx.transpose(0, 1)  # [M, K+1, B]
        xs, ys = data.x_train[idx], data.y_train[idx]
        return self._meta_grad(broadcast(x, m), xs[:, :K], ys[:, :K], xs[:, K], ys[:, K])

    def batch_schedule(self, clients: Tensor) -> Tensor:
        """The one ``sample_indices`` call of ``client_updates``: [K + 1, M] (K inner batches, one outer)."""
        return expand_schedule(clients, self.inner_steps + 1)


# ------------------------------------------------------------------------- a grid of settings at once
@dataclass
class GridState(BaseState):
    x: Params  # every setting's server model, stacked [G, ..]
    buf: Params  # the momentum buffers (zero for gd)
    alive: Tensor  # [G] bool: the settings still stepping (a dropped setting keeps its last iterate)


def setting_chunks(idx: Tensor, settings_chunk: int | None) -> list[Tensor]:
    """``idx`` in pieces of at most ``settings_chunk`` settings (None: one piece)."""
    return list(idx.split(settings_chunk)) if settings_chunk else [idx]


class LocalUpdateGrid(PassRound):
    """LocalUpdate(Theta_{1:K}, alpha, gamma, B, M, ServerOpt) for G settings at once (the Charles et al.
    grids): one round = M clients (one draw, shared by all settings) and one key, then for each distinct alpha
    (and ``settings_chunk`` settings at a time) one pass of ``updates`` over (settings x clients) stacked models
    returning sum_k g_k; q = the mean over clients; each setting's server step is ``momentum_step`` with its
    lr, momentum and Nesterov flag (gd, heavy-ball and Nesterov settings step together). Every setting's copy
    of the clients draws from the round's key what those clients draw alone (``data.draws.LaneDraws``: the
    settings of a round share their rows, common random numbers), so a setting's trajectory does not depend on
    which settings share its passes, how they are chunked or grouped by alpha, or when others diverge: each
    setting is a cell of its own (``pflkit.cells``; tests/unit/test_cells.py, exactly), and alone it is
    ``LocalUpdate`` draw for draw (tested)."""

    client_steps = PassRound.client_steps + ("updates",)
    federated = "a grid of settings is one batch in one process (run a setting on its own as LocalUpdate)"

    def __init__(self, model, *, gamma: Tensor, eta: Tensor, momentum: Tensor, nesterov: Tensor, alpha: list[float],
                 local_steps: int, batch_size: int, clients_per_round: int | None, settings_chunk: int | None = None):
        self.model = model
        self.gamma, self.eta, self.momentum, self.nesterov, self.alpha = gamma, eta, momentum, nesterov, list(alpha)
        self.local_steps, self.batch_size = local_steps, batch_size
        self.clients_per_round, self.settings_chunk = clients_per_round, settings_chunk
        self.theta = torch.ones(local_steps)  # Theta_{1:K}

    def init(self, data: FederatedDataset, seed: int) -> GridState:
        x = broadcast(self.model.init(seed), len(self.alpha))
        return GridState(data, torch.Generator().manual_seed(seed), seed, 0, x,
                         {k: torch.zeros_like(v) for k, v in x.items()}, torch.ones(len(self.alpha), dtype=torch.bool))

    def updates(self, start: Params, data: FederatedDataset, clients: Tensor, generator, extra) -> Params:
        """ClientUpdate with Theta_{1:K} of every listed (setting, client) model, at its setting's gamma."""
        return client_update(self.model, start, data, clients, theta=self.theta, gamma=extra["gamma"],
                             alpha=float(extra["alpha"][0]), batch_size=self.batch_size, generator=generator)

    def round_passes(self, s: GridState):
        data, x, dev = s.data, s.x, s.data.device
        m = min(self.clients_per_round or data.num_clients, data.num_clients)
        clients = sample_clients(data.num_clients, m, s.generator)
        key = ClientDraws.drawn_from(s.generator).key  # where LocalUpdate's one pass draws its key
        q = {k: torch.zeros_like(v) for k, v in x.items()}
        live = s.alive.nonzero().flatten().tolist()
        for a in sorted({self.alpha[g] for g in live}):
            for idx in setting_chunks(torch.tensor([g for g in live if self.alpha[g] == a]), self.settings_chunk):
                at, many = idx.to(dev), clients.repeat(len(idx))
                acc = yield Pass("updates", many, {k: v[at].repeat_interleave(m, 0) for k, v in x.items()},
                                 LaneDraws(key, len(idx), m), expand_schedule(many, self.local_steps),
                                 self.batch_size,
                                 extra={"gamma": self.gamma[at].repeat_interleave(m),
                                        "alpha": torch.full((len(many),), a, dtype=torch.float64)})
                for k in q:
                    q[k][at] = acc[k].reshape(len(idx), m, *acc[k].shape[1:]).mean(1)
        upd, new_buf = momentum_step(x, q, s.buf, self.eta, self.momentum, self.nesterov)
        alive = s.alive.to(dev)
        x = {k: torch.where(scale_like(alive, v), upd[k], v) for k, v in x.items()}
        buf = {k: torch.where(scale_like(alive, x[k]), new_buf[k], b) for k, b in s.buf.items()}
        return replace(s, round=s.round + 1, x=x, buf=buf)

    def personalize_pass(self, s: GridState) -> Pass:
        raise NotImplementedError("a grid is scored per setting (experiments.charles_nn.run_grid)")


# ------------------------------------------------------------------------------- Table 1 presets
def minibatch_sgd(model, *, lr: float, batch_size: int, server_opt: ServerOpt | None = None) -> LocalUpdate:
    """Mini-batch SGD: Theta_1, alpha = 0, gamma = 0 (with |P| = 1: one client holds all data)."""
    return LocalUpdate(model, theta=theta_K(1), gamma=0.0, batch_size=batch_size,
                       server_opt=server_opt or ServerOpt("gd", lr), name="Mini-batch SGD")


def lookahead(model, *, steps: int, fast_lr: float, slow_step: float, batch_size: int) -> LocalUpdate:
    """Lookahead (Zhang et al.) on one client: K fast SGD steps, then x <- x + a (x_K - x), i.e.
    Theta_{1:K}, gamma = fast_lr and server GD with lr a * gamma."""
    return LocalUpdate(model, theta=theta_1_to_K(steps), gamma=fast_lr, batch_size=batch_size,
                       server_opt=ServerOpt("gd", slow_step * fast_lr), name="Lookahead")


def fedsgd(model, *, steps: int, lr: float, batch_size: int, clients_per_round: int | None = None,
           server_opt: ServerOpt | None = None) -> LocalUpdate:
    """FedSGD: Theta_{1:K}, alpha = 0, gamma = 0 (K minibatch gradients at the broadcast point)."""
    return LocalUpdate(model, theta=theta_1_to_K(steps), gamma=0.0, batch_size=batch_size,
                       clients_per_round=clients_per_round, server_opt=server_opt or ServerOpt("gd", lr),
                       name="FedSGD")


def fedavg(model, *, steps: int, gamma: float, batch_size: int, lr: float | None = None,
           clients_per_round: int | None = None, server_opt: ServerOpt | None = None) -> LocalUpdate:
    """FedAvg / Reptile: Theta_{1:K}, alpha = 0, gamma > 0; with server lr = gamma it is model averaging."""
    return LocalUpdate(model, theta=theta_1_to_K(steps), gamma=gamma, batch_size=batch_size,
                       clients_per_round=clients_per_round,
                       server_opt=server_opt or ServerOpt("gd", gamma if lr is None else lr), name="FedAvg")


def fedprox(model, *, steps: int, gamma: float, alpha: float, batch_size: int, lr: float | None = None,
            clients_per_round: int | None = None, server_opt: ServerOpt | None = None) -> LocalUpdate:
    """FedProx / MetaMinibatchProx: Theta_{1:K}, alpha > 0, gamma > 0."""
    check_positive("alpha", alpha)
    return LocalUpdate(model, theta=theta_1_to_K(steps), gamma=gamma, alpha=alpha, batch_size=batch_size,
                       clients_per_round=clients_per_round,
                       server_opt=server_opt or ServerOpt("gd", gamma if lr is None else lr), name="FedProx")


def fomaml(model, *, steps: int, gamma: float, lr: float, batch_size: int,
           clients_per_round: int | None = None, server_opt: ServerOpt | None = None) -> LocalUpdate:
    """FOMAML: Theta_K, alpha = 0 (the gradient at the point reached after K-1 local steps)."""
    return LocalUpdate(model, theta=theta_K(steps), gamma=gamma, batch_size=batch_size,
                       clients_per_round=clients_per_round, server_opt=server_opt or ServerOpt("gd", lr),
                       name="FOMAML")


def maml(model, *, inner_steps: int, gamma: float, lr: float, batch_size: int,
         clients_per_round: int | None = None, server_opt: ServerOpt | None = None) -> MAML:
    """MAML with K inner steps; on quadratics with exact steps it equals LocalUpdate(Theta_{2K+1})."""
    return MAML(model, inner_steps=inner_steps, gamma=gamma, batch_size=batch_size,
                clients_per_round=clients_per_round, server_opt=server_opt or ServerOpt("gd", lr))


def maml_theta(inner_steps: int) -> Theta:
    """Theta_{2K+1}: the LocalUpdate weights MAML with K inner GD steps equals on quadratics (Thm. 2)."""
    return theta_K(2 * inner_steps + 1)


# --------------------------------------------------------------------- closed-form quadratic path
class QuadraticLocalUpdate:
    """LocalUpdate on ``QuadraticClients`` as batched float64 matrix algebra.

    ``batch_size=None``: exact ClientUpdate (gradients A_i (v - c_i), B covering the data);
    otherwise minibatches of examples (B_z, c_z) drawn by the engine's sampler in the same order as
    ``LocalUpdate`` (clients, then [K, M, B] indices), so both paths see identical draws.
    """

    def __init__(self, *, theta, gamma: float, alpha: float = 0.0, batch_size: int | None = None,
                 clients_per_round: int | None = None, server_opt: ServerOpt | None = None):
        _check_common(alpha, gamma, batch_size, clients_per_round)
        self.theta = _as_theta(theta)
        self.gamma, self.alpha = float(gamma), float(alpha)
        self.batch_size, self.clients_per_round = batch_size, clients_per_round
        self.server_opt = server_opt or ServerOpt("gd", 1.0)

    def client_updates(self, qc: QuadraticClients, clients: Tensor, x: Tensor,
                       generator: torch.Generator | None = None) -> Tensor:
        """ClientUpdate for clients [M] (repeats allowed: independent runs) at x [d] or [M, d] -> [M, d]."""
        K, m = self.theta.K, len(clients)
        w = self.theta.weights.to(qc.device)
        x = torch.as_tensor(x, dtype=torch.float64, device=qc.device).expand(m, qc.dim)
        cl = torch.as_tensor(clients, device=qc.device)
        if self.batch_size is None:
            A, c = qc.A[cl], qc.c[cl]
        else:
            if generator is None:
                raise ValueError("a minibatch ClientUpdate needs a generator")
            idx = qc.sample_indices(torch.as_tensor(clients).cpu().unsqueeze(0).expand(K, m),
                                    self.batch_size, generator)  # [K, M, B]
        v, acc = x.clone(), torch.zeros_like(x)
        for k in range(K):
            if self.batch_size is None:
                g = (A @ (v - c).unsqueeze(-1)).squeeze(-1)
            else:
                B, cz = qc.Bz[idx[k]], qc.cz[idx[k]]  # [M, B, d, d], [M, B, d]
                g = (B @ (v.unsqueeze(1) - cz).unsqueeze(-1)).squeeze(-1).mean(1)
            if self.alpha:
                g = g + self.alpha * (v - x)
            acc = acc + w[k] * g
            v = v - self.gamma * g
        return acc

    def run(self, qc: QuadraticClients, x0: Tensor, rounds: int, seed: int = 0) -> Tensor:
        """Iterates x_0 .. x_T of LocalUpdate: [rounds + 1, d] float64."""
        check_positive("rounds", rounds, integer=True, allow_zero=True)
        gen = torch.Generator().manual_seed(seed)
        x = {"x": torch.as_tensor(x0, dtype=torch.float64, device=qc.device).clone()}
        state = self.server_opt.init(x)
        out = [x["x"]]
        for _ in range(rounds):
            clients = sample_clients(qc.num_clients, self.clients_per_round, gen)
            q = self.client_updates(qc, clients, x["x"], gen).mean(0)
            x, state = self.server_opt.step(x, {"x": q}, state)
            out.append(x["x"])
        return torch.stack(out)
