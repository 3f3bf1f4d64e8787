"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar 2020): FedAvg on the MAML objective, FO and HF variants.

Client i's objective is the one-step-adapted loss (Fallah et al., eq. (3))

    F_i(w) = f_i(w - alpha grad f_i(w)).

Local step t on client i (``local_steps`` = tau per round, Alg. 1), with three independent minibatches
D_t, D'_t, D''_t of ``batch_size`` samples from the client's training split:

    temp = w - alpha g(w; D_t)
    FO:  w <- w - beta g(temp; D'_t)                                  (first-order, eq. (9) with the
                                                                       Hessian term dropped)
    HF:  w <- w - beta (g(temp; D'_t) - alpha d_t),  d_t ~= H(w; D''_t) g(temp; D'_t)

The server averages the participating clients' models (uniformly or by sample count, as FedAvg).
The HF variant's Hessian-vector product d_t is, with ``hvp="finite_difference"`` (the paper's
Hessian-free estimate, Sec. 5 of Fallah et al.),

    d_t = (g(w + delta u; D''_t) - g(w - delta u; D''_t)) / (2 delta),   u = g(temp; D'_t),

and with ``hvp="exact"`` the exact product H(w; D''_t) u by forward-over-reverse differentiation
(``torch.func.jvp`` of ``torch.func.grad``).

Personalized model (what Per-FedAvg is scored on): ONE SGD step of size alpha from the global model
on a minibatch of the client's *training* data, drawn with ``eval_generator`` (Fallah et al.'s
personalization, w_i = w - alpha grad f_i(w)). The official pFedMe repository instead adapts on test
batches (two steps) before scoring on the same test set; we never touch test data here.

Randomness per round, in this order, from the state's generator: the participants (as FedAvg), then
one ``sample_indices`` call of shape [tau, 2 or 3, M, B] (FO draws D, D'; HF draws D, D', D'').
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.func import grad, jvp, vmap

from ..data.federated import FederatedDataset
from ..engine.functional import FunctionalModel
from ..engine.params import Params, broadcast
from ..checks import check_positive
from .base import eval_generator
from .fedavg import FedAvg, FedAvgState
from .round import Pass

VARIANTS = ("fo", "hf")
HVP_KINDS = ("finite_difference", "exact")


class PerFedAvg(FedAvg):
    """Per-FedAvg, batched over clients.

    ``alpha``: adaptation (inner) step, also the personalization step (>= 0; 0 reduces to FedAvg
    with lr ``beta``); ``beta``: meta (outer) step; ``local_steps``: tau; ``variant``: ``"fo"`` or
    ``"hf"``; ``hvp`` / ``delta``: the HF Hessian-vector product (see module docstring).
    Official-code defaults (alpha / beta): MNIST logistic .03/.003, MNIST MLP .02/.001, Synthetic
    logistic .02/.002, Synthetic MLP .01/.001 (batch 20, tau = 20).
    """

    client_steps = FedAvg.client_steps + ("adapted",)

    def __init__(self, model: FunctionalModel, *, alpha: float, beta: float, local_steps: int,
                 batch_size: int, variant: str = "fo", hvp: str = "finite_difference",
                 delta: float = 1e-3, clients_per_round: int | None = None, weighting: str = "uniform"):
        # the FedAvg checks (local_steps, batch_size, clients_per_round, weighting); beta is the lr
        if batch_size is None:
            raise ValueError("batch_size must be an integer > 0 (Per-FedAvg draws minibatches D, D', D''), "
                             "got None")
        check_positive("beta", beta)
        super().__init__(model, local_steps=local_steps, lr=beta, batch_size=batch_size,
                         clients_per_round=clients_per_round, weighting=weighting)
        self.alpha = check_positive("alpha", alpha, allow_zero=True)
        self.beta = beta
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if hvp not in HVP_KINDS:
            raise ValueError(f"hvp must be one of {HVP_KINDS}, got {hvp!r}")
        self.variant, self.hvp = variant, hvp
        self.delta = check_positive("delta", delta)
        self.name = f"Per-FedAvg ({variant.upper()})"
        self._batched_hvp = vmap(self._hvp_one)

    # ------------------------------------------------------------------ pieces
    def _hvp_one(self, params: Params, x: Tensor, y: Tensor, u: Params) -> Params:
        """Exact H(params; x, y) u for one model (forward-over-reverse)."""
        return jvp(lambda p: grad(self.model.loss)(p, x, y), (params,), (u,))[1]

    def hessian_vector_product(self, params: Params, x: Tensor, y: Tensor, u: Params) -> Params:
        """d = H(params_i; x_i, y_i) u_i for N stacked models (params, u [N, ..], x [N, B, ..]);
        finite-difference or exact according to ``hvp``."""
        if self.hvp == "exact":
            return self._batched_hvp(params, x, y, u)
        d = self.delta
        plus, _ = self.model.batched_grad({k: p + d * u[k] for k, p in params.items()}, x, y)
        minus, _ = self.model.batched_grad({k: p - d * u[k] for k, p in params.items()}, x, y)
        return {k: (plus[k] - minus[k]) / (2 * d) for k in params}

    def client_updates(self, w: Params, data: FederatedDataset, clients: Tensor,
                       generator: torch.Generator) -> Params:
        """tau Per-FedAvg local steps from w on every listed client at once -> [M, ..]."""
        m = len(clients)
        idx = data.sample_indices(self.batch_schedule(clients), self.batch_size, generator)
        v = broadcast(w, m)  # our own copy: updated in place below
        temp = {k: torch.empty_like(p) for k, p in v.items()}
        grads = {k: torch.empty_like(p) for k, p in v.items()}  # g, then step (batched_grad's out)
        # in place (the gradients are buffers of ours), the same operations in the same order as
        # v - alpha g, step - alpha d and v - beta step: the same float results without M x P-sized
        # temporaries per operation
        for t in range(self.local_steps):
            x, y = data.x_train[idx[t]], data.y_train[idx[t]]  # [parts, M, B, ..]
            g, _ = self.model.batched_grad(v, x[0], y[0], out=grads)
            with torch.no_grad():
                for k, p in v.items():
                    torch.sub(p, g[k].mul_(self.alpha), out=temp[k])
            step, _ = self.model.batched_grad(temp, x[1], y[1], out=grads)  # g is spent: its buffers
            with torch.no_grad():
                if self.variant == "hf" and self.alpha:
                    d = self.hessian_vector_product(v, x[2], y[2], step)
                    for k in step:
                        step[k].sub_(d[k].mul_(self.alpha))
                for k, p in v.items():
                    p.sub_(step[k].mul_(self.beta))
        return v

    def batch_schedule(self, clients: Tensor) -> Tensor:
        """The one ``sample_indices`` call of ``client_updates``: [tau, 2 or 3, M] (D, D'(, D''))."""
        m, parts = len(clients), 3 if self.variant == "hf" else 2
        return clients.view(1, 1, m).expand(self.local_steps, parts, m)

    # ------------------------------------------------------------------ the one round with Per-FedAvg's client step
    def local_models(self, w: Params, data: FederatedDataset, clients: Tensor, generator, extra) -> Params:
        return self.client_updates(w, data, clients, generator)

    def adapted(self, w: Params, data: FederatedDataset, clients: Tensor, generator, extra) -> Params:
        """w - alpha g(w; D_i) for every listed client i, D_i one training minibatch."""
        idx = data.sample_indices(clients.unsqueeze(0), self.batch_size, generator)[0]
        v = broadcast(w, len(clients))
        g, _ = self.model.batched_grad(v, data.x_train[idx], data.y_train[idx])
        return {k: p - self.alpha * g[k] for k, p in v.items()}

    def personalize_pass(self, s: FedAvgState) -> Pass:
        """w - alpha g(w; D_i) for every client i, D_i a training minibatch from eval_generator."""
        clients = torch.arange(s.data.num_clients)
        return Pass("adapted", clients, s.w, eval_generator(s), clients.unsqueeze(0), self.batch_size, shared=True)
