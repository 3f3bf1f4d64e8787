"""PERM (Deng et al.): mixing weights alpha_i (eq. 2), model shuffling (Alg. 1), two-stage PERM
(Alg. 3 + 1) and single-loop PERM (Alg. 2).

**Mixing weights.** For client i and a global model w,

    g_i(a) = sum_j a_j ||grad f_i(w) - grad f_j(w)||^2 + lambda sum_j a_j^2 / n_j,   a in the simplex.

All N problems are solved at once, either exactly (``water_filling``: a_j = max(0, (tau - D_ij) n_j /
(2 lambda)) with tau fixing the sum to 1) or by ``T_alpha`` steps of projected gradient descent
(``projected_gd``, Euclidean projection onto the simplex, sort-based).

**Shuffling and rounds.** An epoch draws a permutation sigma. In shuffle step j = 0..N-1, model i
sits on client sigma((i + j) mod N) and takes K SGD steps with step eta * alpha_i(client) * N. Every
client therefore hosts exactly one model per step, and every model visits every client once per
epoch: the (step, model) -> client table is a Latin square. **One shuffle step is one communication
round** (each client receives one model, does K local steps and sends it back, exactly the work of a
FedAvg round), so an epoch is N rounds and every method in a figure is plotted per round.

**Single loop (Alg. 2).** Every ``update_every`` rounds (default N = once per epoch), the global model
takes ``global_steps`` minibatch SGD steps (M samples per client, lr gamma) and the alphas take
``alpha_steps`` projected-GD steps on g_i(w, .), warm-started from their current values.
``warmup_rounds`` of plain FedAvg may come first (the CIFAR-10 figure uses 10). **Two stage** is the
same class with ``alpha_init='estimate'`` after the FedAvg warm-up (Alg. 3) and ``update_every=None``.

**Visits (option ``visit``).** ``'shuffle'`` (default) is Alg. 1 as written: every model visits every
client once per epoch with step eta * alpha_i(client) * N, so with a sparse alpha most visits are no-op
steps and a few are steps of up to eta * max_j alpha_ij * N, which caps the usable eta. ``'alpha'`` is
a variant the paper's objective permits (an unbiased stochastic version of the same weighted ERM,
Phi(alpha_i, v) = sum_j alpha_ij f_j(v)): each round, model i visits ONE client drawn with probability
alpha_ij and takes the K steps there with the plain step eta. The same local steps per round and the
same expected step mass per client per epoch as Alg. 1, but every step is non-zero and of size eta; a
client may host several models in a round (or none), so the per-round communication pattern is not
the Latin square of Alg. 1. ``benchmarks/results/perm_investigation.md`` compares the two.
``'interpolate'`` is the rule of ``fedshuffle`` in MLOPTPSU/TorchFed (branch ``config``, by a PERM co-author;
docs/papers.md compares it with Alg. 1 point by point): the Latin square of Alg. 1 from ONE permutation, rolled
by one each round and never redrawn; model i takes K plain SGD steps eta on its host c, giving u_i, and is then
moved towards that local result by its weight, v_i <- v_i + a_ic (u_i - v_i) with a_ic = alpha_ic clipped to
[0, 1] (a negative weight: the visit leaves v_i where it is). A visit's update is the local one scaled by
a_ic, never larger; personalization starts from the initial model, as in the source (the warm-up serves
alpha only). With ``alpha_init='correlation'`` alpha is the source's estimate (``gradient_correlation``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from ..data.federated import FederatedDataset
from ..engine.full_batch import full_gradients, full_gradients_at
from ..engine.functional import FunctionalModel
from ..engine.local_sgd import expand_schedule, local_sgd
from ..engine.params import Params, apply_masks, broadcast, flatten
from ..models.width import intersect
from ..checks import check_int, check_positive
from .base import BaseState, check_batch_size, eval_generator
from .fedavg import FedAvgState, FederatedRound
from .round import MASKED, Pass, PassRound, aggregate, local_round, mask_extra, masks_of, run_passes
from .server_opt import ServerOpt

ALPHA_SOLVERS = ("exact", "gd")
ALPHA_INITS = ("uniform", "estimate", "correlation")
VISITS = ("shuffle", "alpha", "interpolate")


# --------------------------------------------------------------------------- mixing weights
def discrepancies(grads: Tensor) -> Tensor:
    """D_ij = ||g_i - g_j||^2 for client gradients stacked as rows [N, P]."""
    g = grads.double()
    sq = (g * g).sum(1)
    d = sq[:, None] + sq[None, :] - 2.0 * g @ g.T
    d.fill_diagonal_(0.0)
    return d.clamp_min_(0.0)


def _check_alpha_problem(d: Tensor, n: Tensor, lam: float):
    if d.dim() != 2 or n.shape != (d.shape[1],):
        raise ValueError(f"need D [N, N'] and n [N'], got {tuple(d.shape)} and {tuple(n.shape)}")
    if not lam >= 0:
        raise ValueError(f"lambda must be >= 0, got {lam!r}")
    if (n <= 0).any():
        raise ValueError("every client needs n_j > 0 samples")


def objective(alpha: Tensor, d: Tensor, n: Tensor, lam: float) -> Tensor:
    """g_i(alpha_i) for every row i."""
    return (alpha * d).sum(1) + lam * (alpha ** 2 / n).sum(1)


def water_filling(d: Tensor, n: Tensor, lam: float) -> Tensor:
    """Exact minimizer of g_i over the simplex for every row of D (needs lambda > 0).

    KKT: a_j = max(0, (tau - D_ij) c_j) with c_j = n_j / (2 lambda) and sum_j a_j = 1. With D's row
    sorted ascending, the support is the first k entries for the largest k whose
    tau_k = (1 + sum_{j<=k} c_j D_j) / sum_{j<=k} c_j exceeds D_(k).
    """
    d, n = d.double(), n.double().to(d.device)
    _check_alpha_problem(d, n, lam)
    if not lam > 0:
        raise ValueError(f"water_filling needs lambda > 0 (lambda = 0 is a linear program), got {lam!r}")
    c = n / (2.0 * lam)
    order = d.argsort(1)
    ds, cs = d.gather(1, order), c[order]
    tau = (1.0 + (cs * ds).cumsum(1)) / cs.cumsum(1)
    valid = tau > ds  # true on a prefix
    k = valid.sum(1, keepdim=True).clamp_min(1) - 1
    t = tau.gather(1, k)
    return ((t - d).clamp_min(0.0) * c).to(torch.float64)


def project_simplex(v: Tensor) -> Tensor:
    """Euclidean projection of every row onto the probability simplex (sort-based, Duchi et al. 2008).

    On the CPU numpy sorts the rows (10x faster than torch.sort on PERM's [N, N]; a sort's output does not
    depend on its algorithm, so the projection is the same bit for bit: tests/unit/test_perm.py)."""
    if v.device.type == "cpu":
        u = torch.from_numpy(-np.sort(-v.detach().numpy(), axis=1))
    else:
        u, _ = v.sort(1, descending=True)
    css = u.cumsum(1) - 1.0
    ks = torch.arange(1, v.shape[1] + 1, device=v.device, dtype=v.dtype)
    cond = u - css / ks > 0
    rho = cond.sum(1, keepdim=True) - 1
    theta = css.gather(1, rho) / (rho + 1).to(v.dtype)
    return (v - theta).clamp_min(0.0)


def projected_gd(d: Tensor, n: Tensor, lam: float, steps: int, init: Tensor | None = None,
                 step_size: float | None = None) -> Tensor:
    """``steps`` projected gradient steps on every g_i, from ``init`` (default uniform).

    Default step: 1/L with L = 2 lambda / min_j n_j the smoothness of g_i (for lambda = 0, the step is
    1 / max D, which moves mass towards the smallest discrepancies)."""
    d, n = d.double(), n.double().to(d.device)
    _check_alpha_problem(d, n, lam)
    if steps < 0:
        raise ValueError(f"alpha_steps must be >= 0, got {steps!r}")
    a = torch.full_like(d, 1.0 / d.shape[1]) if init is None else init.double().clone()
    if step_size is None:
        step_size = float(n.min()) / (2.0 * lam) if lam > 0 else 1.0 / max(float(d.max()), 1e-12)
    for _ in range(steps):
        a = project_simplex(a - step_size * (d + 2.0 * lam * a / n))
    return a


def local_gradients(model: FunctionalModel, w: Params, data: FederatedDataset, samples: int | None,
                    generator: torch.Generator) -> Params:
    """grad f_j(w) for every client j, stacked [N, ..]: exact (``samples=None``, no draw: one flat pass,
    ``engine.full_gradients_at``) or from ``samples`` rows per client (one ``sample_indices`` call, shape [N])."""
    if samples is None:
        return full_gradients_at(model, w, data)
    idx = data.sample_indices(torch.arange(data.num_clients), samples, generator)
    grads, _ = model.batched_grad(broadcast(w, data.num_clients), data.x_train[idx], data.y_train[idx])
    return grads


def client_gradients(model: FunctionalModel, w: Params, data: FederatedDataset, samples: int | None,
                     generator: torch.Generator) -> Tensor:
    """grad f_j(w) for every client j as rows [N, P]: exact (``samples=None``) or from M samples."""
    return flatten(local_gradients(model, w, data, samples, generator))


def solve_alpha(d: Tensor, n: Tensor, lam: float, costs: Tensor | None = None, *, solver: str = "exact",
                steps: int = 100, init: Tensor | None = None) -> Tensor:
    """argmin over the simplex of sum_j a_j (D_ij + c_j) + lambda sum_j a_j^2 / n_j for every row i
    (``costs`` c_j: PERM-hetero's capacity term; None: none, PERM's eq. (2))."""
    if solver not in ALPHA_SOLVERS:
        raise ValueError(f"alpha solver must be one of {ALPHA_SOLVERS}, got {solver!r}")
    total = d.double() if costs is None else d.double() + costs.double().to(d.device)[None, :]
    if solver == "exact":
        return water_filling(total, n, lam)
    return projected_gd(total, n, lam, steps, init)


def alpha_from_gradients(grads: Tensor, n: Tensor, lam: float, *, solver: str = "exact", steps: int = 100,
                         init: Tensor | None = None) -> Tensor:
    """alpha [N, N] from the clients' gradients at the global model (rows [N, P]) and sizes n [N]:
    the server's part of the alpha update (a federated engine gathers the gradients)."""
    d = discrepancies(grads)
    return solve_alpha(d, n.to(d.device), lam, solver=solver, steps=steps, init=init)


def mixing_weights(model: FunctionalModel, w: Params, data: FederatedDataset, lam: float, *,
                   solver: str = "exact", steps: int = 100, samples: int | None = None,
                   generator: torch.Generator | None = None, init: Tensor | None = None,
                   grads: Tensor | None = None) -> Tensor:
    """alpha [N, N] (row i = client i's weights over all clients) at the global model w (``grads``: the
    client gradient rows [N, P] at w when the caller has them, ``client_gradients`` otherwise)."""
    if solver not in ALPHA_SOLVERS:
        raise ValueError(f"alpha solver must be one of {ALPHA_SOLVERS}, got {solver!r}")
    if grads is None:
        gen = generator if generator is not None else torch.Generator().manual_seed(0)
        grads = client_gradients(model, w, data, samples, gen)
    return alpha_from_gradients(grads, data.train_sizes, lam, solver=solver, steps=steps, init=init)


def gradient_correlation(grads: Params) -> Tensor:
    """alpha [N, N] as ``fedshuffle``'s ``calc_clients_coefficient_centered`` estimates it: for every parameter
    tensor, the Pearson correlation between the clients' gradient rows ([N, D], each row centred and divided by
    its sample standard deviation + 1e-8, then X X^T / (D - 1)), averaged over the tensors. A tensor is left out
    when client 0's self-correlation is below 0.99 (its gradient is constant there, as the source skips it) or
    when it has fewer than 2 entries (no sample deviation). The result is symmetric, in [-1, 1], not a mixing
    vector: its rows need not sum to 1."""
    total, count = None, 0
    for g in grads.values():
        x = g.detach().double().flatten(1)
        if x.shape[1] < 2:
            continue
        x = (x - x.mean(1, keepdim=True)) / (x.std(1, keepdim=True) + 1e-8)
        corr = x @ x.T / (x.shape[1] - 1)
        if not float(corr[0, 0]) >= 0.99:
            continue
        total, count = (corr if total is None else total + corr), count + 1
    if total is None:
        raise ValueError("gradient_correlation: no parameter tensor with a non-constant gradient of client 0")
    return total / count


def interpolation_weights(alpha: Tensor, clients: Tensor) -> Tensor:
    """visit='interpolate': model i's weight a_i = alpha_i(c_i) on its host c_i, clipped to [0, 1], [N] float32."""
    n = len(clients)
    return alpha[torch.arange(n), clients.to(alpha.device)].clamp(0.0, 1.0).float()


def interpolate_visits(v: Params, local: Params, weights: Tensor) -> Params:
    """v_i + a_i (u_i - v_i) for every model i: the visiting models ``v`` moved towards their local results
    ``local`` by ``weights`` a [N] (in [0, 1]: never further than the local result)."""
    out = {}
    for k, p in v.items():
        a = weights.to(p.device, p.dtype).reshape(-1, *([1] * (p.dim() - 1)))
        out[k] = p + a * (local[k] - p)
    return out


# --------------------------------------------------------------------------- shuffling
def shuffle_clients(sigma: Tensor, step: int) -> Tensor:
    """Client of every model at shuffle step ``step``: model i -> sigma((i + step) mod N)."""
    n = len(sigma)
    return sigma[(torch.arange(n) + step) % n]


def shuffle_step_sizes(alpha: Tensor, clients: Tensor, lr: float, device=None) -> Tensor:
    """The step of model i on its client c_i in a shuffle round: eta * alpha_i(c_i) * N, [N] float32."""
    n = len(clients)
    return lr * n * alpha[torch.arange(n), clients.to(alpha.device)].float().to(device or alpha.device)


def shuffle_steps(model: FunctionalModel, v: Params, data: FederatedDataset, alpha: Tensor, sigma: Tensor,
                  step: int, *, local_steps: int, lr: float, batch_size: int | None,
                  generator: torch.Generator, masks: Params | None = None) -> Params:
    """One round of Alg. 1: every model moves to its client and takes K SGD steps of size eta*alpha_i(c)*N.

    With ``masks`` (model i's architecture m_i, stacked [N, ..]; PERM-hetero's visiting rule) model i
    on client c trains the slice m_i AND m_c, the part of it client c can hold."""
    clients = shuffle_clients(sigma, step)
    return _visit(model, v, data, clients, shuffle_step_sizes(alpha, clients, lr, data.device), local_steps,
                  batch_size, generator, masks)


def visiting_masks(masks: Params, clients: Tensor) -> Params:
    """The visiting rule: the slice of model i on client ``clients[i]`` is m_i AND m_c."""
    return intersect(masks, {k: m[clients.to(m.device)] for k, m in masks.items()})


def _visit(model, v, data, clients, lr, local_steps, batch_size, generator, masks) -> Params:
    """Model i takes ``local_steps`` SGD steps (size ``lr``: a number or [N]) on client ``clients[i]``."""
    v, _ = local_sgd(model, v, data, clients, steps=local_steps, lr=lr, batch_size=batch_size, generator=generator,
                     masks=None if masks is None else visiting_masks(masks, clients))
    return v


def alpha_visit_clients(alpha: Tensor, generator: torch.Generator) -> Tensor:
    """visit='alpha': the client of every model this round, drawn with probabilities alpha_i (one draw per model)."""
    return torch.multinomial(alpha.double().cpu(), 1, generator=generator).squeeze(1)


def alpha_visit_steps(model: FunctionalModel, v: Params, data: FederatedDataset, alpha: Tensor, *,
                      local_steps: int, lr: float, batch_size: int | None, generator: torch.Generator,
                      masks: Params | None = None) -> Params:
    """One round of the visit='alpha' variant: model i moves to a client c ~ alpha_i and takes K SGD steps
    of size eta there (``masks``: the slice m_i AND m_c, as in ``shuffle_steps``)."""
    return _visit(model, v, data, alpha_visit_clients(alpha, generator), lr, local_steps, batch_size, generator,
                  masks)


# --------------------------------------------------------------------------- the algorithm
@dataclass
class PERMState(BaseState):
    w: Params  # global model
    v: Params | None  # personalized models [N, ..] (None during warm-up)
    alpha: Tensor | None  # [N, N]
    sigma: Tensor | None  # the current epoch's permutation
    shuffle_round: int  # rounds since personalization started
    grad_mean: Params | None = None  # the clients' mean exact gradient at w, kept by the last alpha update
    server: dict | None = None  # the global step's optimizer state (``ServerOpt.init``)


class PERM(PassRound):
    """Personalized ERM by model shuffling; see the module docstring for the round accounting.

    lr: eta of the shuffling steps (the model-i step on client j is eta * alpha_i(j) * N).
    global_lr / global_steps / alpha_samples: the single-loop global model update (gamma, steps, M).
    server_opt: the optimizer of that update (``ServerOpt``; default plain gd at global_lr, w <- w - gamma g;
    heavy_ball / nesterov / adam step with the clients' mean gradient g as their pseudo-gradient; given, its
    lr is gamma and global_lr must equal it).
    lam: lambda of eq. (2). alpha_solver: 'exact' (water-filling) or 'gd' (alpha_steps projected steps).
    warmup_rounds, warmup_lr: FedAvg rounds (K local steps each) before personalization starts.
    alpha_init: 'uniform' (Alg. 2) or 'estimate' (Alg. 3: alpha at the warm-up model).
    update_every: rounds between global-model + alpha updates (None: never, i.e. two-stage PERM;
    default: N, once per epoch).
    visit: 'shuffle' (Alg. 1 as written, default), 'alpha' (each round, model i visits a client drawn
    with probability alpha_ij and takes plain steps eta) or 'interpolate' (TorchFed's fedshuffle rule); see the
    module docstring. alpha_init 'correlation': the fedshuffle estimate (``gradient_correlation``), at the warm-up
    model and at every update.

    The round is written here once, as passes (``algorithms.round``), for PERM and PERM-hetero
    (``algorithms.perm_hetero.PERMHetero``), which supplies sub-model masks through ``personal_masks`` /
    ``round_masks`` and its own mixing weights (``alpha_passes``); PERM is the case without masks (every
    model full width). A warm-up round is the one round (``FederatedRound``, through :class:`WarmupRound`:
    with PERM-hetero's masks, partial training). Its client steps: the warm-up's local models, the visiting
    models' K steps, and the clients' gradients at the global model (for the global step and alpha).
    """

    name = "PERM"
    #: whether the global model's training uses sub-models (PERM-hetero: ``round_masks``)
    partial_training = False

    def __init__(self, model: FunctionalModel, *, local_steps: int, lr: float, batch_size: int | None,
                 lam: float, alpha_solver: str = "gd", alpha_steps: int = 20, alpha_samples: int | None = None,
                 global_lr: float = 0.1, global_steps: int = 1, warmup_rounds: int = 0,
                 warmup_lr: float | None = None, alpha_init: str = "uniform",
                 update_every: int | None | str = "epoch", visit: str = "shuffle",
                 server_opt: ServerOpt | None = None):
        self.model = model
        self.local_steps = check_positive("local_steps", local_steps, integer=True)
        self.lr = check_positive("lr", lr)
        self.batch_size = check_batch_size(batch_size)
        self.lam = check_positive("lam", lam, allow_zero=True)
        if alpha_solver not in ALPHA_SOLVERS:
            raise ValueError(f"alpha_solver must be one of {ALPHA_SOLVERS}, got {alpha_solver!r}")
        if alpha_solver == "exact" and lam == 0:
            raise ValueError("alpha_solver='exact' needs lam > 0; use 'gd' for lam = 0")
        self.alpha_solver = alpha_solver
        self.alpha_steps = check_positive("alpha_steps", alpha_steps, integer=True)
        self.alpha_samples = None if alpha_samples is None else \
            check_positive("alpha_samples", alpha_samples, integer=True)
        self.global_lr = check_positive("global_lr", global_lr)
        if server_opt is not None and not isinstance(server_opt, ServerOpt):
            raise ValueError(f"server_opt must be a ServerOpt (gd, heavy_ball, nesterov, adam), got {server_opt!r}")
        if server_opt is not None and server_opt.lr != self.global_lr:
            raise ValueError(f"server_opt's lr ({server_opt.lr:g}) is the global step's size gamma: global_lr must "
                             f"equal it, got global_lr={global_lr!r}")
        self.server_opt = ServerOpt("gd", self.global_lr) if server_opt is None else server_opt
        self.global_steps = check_positive("global_steps", global_steps, integer=True, allow_zero=True)
        self.warmup_rounds = check_positive("warmup_rounds", warmup_rounds, integer=True, allow_zero=True)
        self.warmup_lr = self.lr if warmup_lr is None else check_positive("warmup_lr", warmup_lr)
        if alpha_init not in ALPHA_INITS:
            raise ValueError(f"alpha_init must be one of {ALPHA_INITS}, got {alpha_init!r}")
        self.alpha_init = alpha_init
        if update_every is not None and update_every != "epoch":
            check_int("update_every", update_every, 1, "an integer >= 1, 'epoch' or None")
        self.update_every = update_every
        if visit not in VISITS:
            raise ValueError(f"visit must be one of {VISITS}, got {visit!r}")
        if (alpha_init == "correlation") != (visit == "interpolate"):
            raise ValueError("alpha_init='correlation' (weights in [-1, 1], not mixing vectors) goes with "
                             f"visit='interpolate' and only with it; got alpha_init={alpha_init!r}, visit={visit!r}")
        self.visit = visit

    # -- what PERM-hetero changes: sub-model masks and the mixing weights
    def personal_masks(self, data: FederatedDataset) -> Params | None:
        """m_i: the architecture of personalized model i (None: every model full width)."""
        return None

    def round_masks(self, s: PERMState) -> Params | None:
        """M_j^t: the sub-models of the global model's training this round (None: full width)."""
        return None

    def alpha_passes(self, s: PERMState, init: Tensor | None):
        """alpha at the current global model from the clients' gradients (one pass): exact, or ``alpha_steps``
        GD steps warm-started at ``init``. With exact gradients their mean is kept in the state for the next
        global step: w does not move between an alpha update and the next global step."""
        grads = yield self.gradient_pass(s, None)
        if self.alpha_samples is None:
            s.grad_mean = {k: g.mean(0) for k, g in grads.items()}
        if self.alpha_init == "correlation":
            return gradient_correlation(grads)
        return self.alpha_from_gradients(s, flatten(grads), init)

    def alpha_from_gradients(self, s: PERMState, grads: Tensor, init: Tensor | None) -> Tensor:
        """The alpha update from the clients' gradients at the global model (rows [N, P])."""
        return alpha_from_gradients(grads, s.data.train_sizes, self.lam, solver=self.alpha_solver,
                                    steps=self.alpha_steps, init=init)

    # -- the client steps
    client_steps = PassRound.client_steps + ("warmup_models", "visiting_steps", "gradients", "masked_gradients")

    def warmup_models(self, w: Params, data: FederatedDataset, clients: Tensor, generator, extra) -> Params:
        """A FedAvg warm-up round's local models (with masks: the clients' sub-models)."""
        return local_round(self.model, w, data, clients, steps=self.local_steps, lr=self.warmup_lr,
                           batch_size=self.batch_size, generator=generator, masks=masks_of(extra))

    def visiting_steps(self, v: Params, data: FederatedDataset, clients: Tensor, generator, extra) -> Params:
        """K SGD steps of every visiting model on its host client, at the step sizes ``extra['lr']`` (Alg. 1's
        eta alpha_i(c) N; without it the plain eta of alpha visits), on the slices ``extra``'s masks give."""
        v, _ = local_sgd(self.model, v, data, clients, steps=self.local_steps, lr=extra.get("lr", self.lr),
                         batch_size=self.batch_size, generator=generator, masks=masks_of(extra))
        return v

    def gradients(self, w: Params, data: FederatedDataset, clients: Tensor, generator, extra) -> Params:
        """grad f_j(w) of every client (``local_gradients``: exact, or from alpha_samples rows)."""
        return local_gradients(self.model, w, data, self.alpha_samples, generator)

    def masked_gradients(self, w: Params, data: FederatedDataset, clients: Tensor, generator, extra) -> Params:
        """grad f_j(M_j (.) w) of every client's sub-model M_j (``extra``'s masks)."""
        stacked = apply_masks(broadcast(w, len(clients)), masks_of(extra))
        if self.alpha_samples is None:
            grads, _ = full_gradients(self.model, stacked, data)
            return grads
        idx = data.sample_indices(clients, self.alpha_samples, generator)
        grads, _ = self.model.batched_grad(stacked, data.x_train[idx], data.y_train[idx])
        return grads

    def gradient_pass(self, s: PERMState, masks: Params | None) -> Pass:
        everyone = torch.arange(s.data.num_clients)
        schedule = None if self.alpha_samples is None else everyone
        return Pass("gradients" if masks is None else "masked_gradients", everyone, s.w, s.generator, schedule,
                    self.alpha_samples, shared=True, extra=mask_extra(masks))

    # -- the round
    def _period(self, n: int) -> int | None:
        return n if self.update_every == "epoch" else self.update_every

    def update_due(self, s: PERMState) -> bool:
        """Whether the round just taken (``s.shuffle_round`` counted) ends with the global step + alpha update."""
        period = self._period(s.data.num_clients)
        return period is not None and s.shuffle_round % period == 0

    def initial_state(self, data: FederatedDataset, seed: int) -> PERMState:
        """The state before personalization starts (global model only)."""
        w = self.model.init(seed)
        return PERMState(data, torch.Generator().manual_seed(seed), seed, 0, w, None, None, None, 0,
                         server=self.server_opt.init(w))

    def init(self, data: FederatedDataset, seed: int) -> PERMState:
        return run_passes(self, self.start_passes(self.initial_state(data, seed)), data)

    def start_passes(self, s: PERMState):
        if self.warmup_rounds == 0:
            yield from self.personalization_passes(s)
        return s

    def _broadcast_personal(self, s: PERMState, start: Params | None = None) -> Params:
        v = broadcast(s.w if start is None else start, s.data.num_clients)
        masks = self.personal_masks(s.data)
        return v if masks is None else apply_masks(v, masks)

    def personalization_passes(self, s: PERMState):
        """Personalization starts: v_i = w, alpha uniform or estimated at w."""
        n = s.data.num_clients
        s.v = self._broadcast_personal(s, self.model.init(s.seed) if self.visit == "interpolate" else None)
        if self.alpha_init == "uniform":
            s.alpha = torch.full((n, n), 1.0 / n, dtype=torch.float64, device=s.data.device)
        else:
            s.alpha = yield from self.alpha_passes(s, None)

    def warmup_passes(self, s: PERMState):
        """A FedAvg warm-up round: the one round (``WarmupRound``) on the global model; personalization starts
        after the last one."""
        warmup = WarmupRound(self)
        fedavg = yield from warmup.round_passes(FedAvgState(s.data, s.generator, s.seed, s.round, s.w,
                                                            warmup.server_opt.init(s.w)))
        s = replace(s, round=fedavg.round, w=fedavg.w, grad_mean=None)
        if s.round >= self.warmup_rounds:
            yield from self.personalization_passes(s)
        return s

    def round_passes(self, s: PERMState):
        if s.v is None:
            return (yield from self.warmup_passes(s))
        data, n = s.data, s.data.num_clients
        masks = self.round_masks(s)
        s = replace(s, round=s.round + 1)
        if self.visit == "alpha":
            clients, extra = alpha_visit_clients(s.alpha, s.generator), {}
        else:
            step = s.shuffle_round % n
            if step == 0 and (s.sigma is None or self.visit == "shuffle"):  # interpolate: one permutation, rolled
                s.sigma = torch.randperm(n, generator=s.generator)
            clients = shuffle_clients(s.sigma, step)
            extra = {} if self.visit == "interpolate" else \
                {"lr": shuffle_step_sizes(s.alpha, clients, self.lr, data.device)}
        personal = self.personal_masks(data)
        if personal is not None:  # the visiting rule: model i on client c trains m_i AND m_c
            extra.update(mask_extra(visiting_masks(personal, clients)))
        local = yield Pass("visiting_steps", clients, s.v, s.generator, expand_schedule(clients, self.local_steps),
                           self.batch_size, extra=extra)
        s.v = interpolate_visits(s.v, local, interpolation_weights(s.alpha, clients)) \
            if self.visit == "interpolate" else local
        s.shuffle_round += 1
        if self.update_due(s):
            yield from self.global_passes(s, masks)
            s.alpha = yield from self.alpha_passes(s, s.alpha)
        return s

    def global_passes(self, s: PERMState, masks: Params | None):
        """The single loop's global step(s) on ``s``: ``server_opt`` with the clients' mean gradient at w
        (plain gd: w <- w - gamma * that mean)."""
        for _ in range(self.global_steps):
            if masks is None and s.grad_mean is not None:  # kept by the alpha update at this w
                step = s.grad_mean
            else:
                grads = yield self.gradient_pass(s, masks)
                step = _mean_step(grads, masks, s.w)
            (s.w, s.server), s.grad_mean = self.server_opt.step(s.w, step, s.server), None

    def personalize_pass(self, s: PERMState) -> Pass:
        return Pass("given", torch.arange(s.data.num_clients), self.personalized_models(s), eval_generator(s))

    def personalized_models(self, s: PERMState) -> Params:
        return self._broadcast_personal(s) if s.v is None else s.v


def _mean_step(grads: Params, masks: Params | None, w: Params) -> Params:
    """The global step's direction from the clients' gradients [N, ..]: their mean (with masks: the
    coordinate-wise mean over the clients covering it)."""
    if masks is None:
        return {k: g.mean(0) for k, g in grads.items()}
    return aggregate(grads, masks=masks, base={k: torch.zeros_like(p) for k, p in w.items()}, aggregator=MASKED)


class WarmupRound(FederatedRound):
    """PERM's FedAvg warm-up round as the one round: every client takes PERM's warm-up client step
    (``PERM.warmup_models``: K SGD steps at warmup_lr) from the global model, averaged uniformly, the server
    step plain averaging; with PERM-hetero's round masks (``partial_training``), on sub-models with the masked
    aggregate. It only describes the round: its passes run on the PERM object."""

    client_step = "warmup_models"

    def __init__(self, perm: PERM):
        self.perm, self.local_steps = perm, perm.local_steps
        self.partial_training = perm.partial_training
        self.set_round(batch_size=perm.batch_size, clients_per_round=None,
                       aggregator=MASKED if perm.partial_training else "mean")

    def round_masks(self, s: FedAvgState) -> Params | None:
        return self.perm.round_masks(s)
