"""The server optimizer of a round: x_{t+1} = ServerOpt(x_t, q_t) for a pseudo-gradient q_t.

Its state is plain tensors (checkpointable like every algorithm state) and its rules are torch.optim's
(SGD with momentum / Nesterov, Adam) written once, on stacked parameters:

- gd: x - lr q
- heavy_ball: buf = beta buf + q; x - lr buf (Polyak)
- nesterov: buf = beta buf + q; x - lr (q + beta buf) (torch's Nesterov SGD: x_{t+1} = y_t - lr q(y_t),
  y_{t+1} = x_{t+1} + beta (x_{t+1} - x_t) with the gradient taken at the stored point)
- adam: torch.optim.Adam's update (FedAdam)

and, with ``radius``, the new x projected onto the l2 ball of that radius (PERM's Alg. 3's optional W).

:func:`momentum_step` takes per-model hyperparameters (tensors of shape [G] against parameters stacked
[G, ..]), so a grid of G server settings steps in one call (``experiments.charles_nn.run_grid``);
:class:`ServerOpt` is one setting applied to one model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..engine.params import Params, scale_like
from ..theory.surrogate import SERVER_OPTS, tuned_server
from ..checks import check_positive

SERVER_KINDS = ("gd", "heavy_ball", "nesterov", "adam")
MOMENTUM_KINDS = SERVER_OPTS  # the kinds :func:`momentum_step` covers: Table 2's (the surrogate's closed forms)
#: how the Charles figures and tables name the momentum kinds
SERVER_LABELS = {"gd": "no momentum", "nesterov": "Nesterov", "heavy_ball": "heavy-ball"}


def project_ball(w: Params, radius: float) -> Params:
    """w projected onto the l2 ball of ``radius`` (all its tensors as one vector)."""
    norm = torch.sqrt(sum((v ** 2).sum() for v in w.values()))
    return {k: v * (radius / norm) for k, v in w.items()} if norm > radius else w


def momentum_step(x: Params, q: Params, buf: Params, lr: Tensor | float, momentum: Tensor | float,
                  nesterov: Tensor | bool) -> tuple[Params, Params]:
    """One gd / heavy-ball / Nesterov step for every model: returns (new x, new buffer).

    buf' = beta buf + q; x' = x - lr (q + beta buf') with Nesterov, x - lr buf' otherwise (beta = 0: gd).
    ``lr``, ``momentum``, ``nesterov``: scalars, or [G] tensors when x is stacked [G, ..]."""
    out_x, out_buf = {}, {}
    for k, v in x.items():
        beta = scale_like(torch.as_tensor(momentum, dtype=v.dtype, device=v.device), v)
        eta = scale_like(torch.as_tensor(lr, dtype=v.dtype, device=v.device), v)
        nes = scale_like(torch.as_tensor(nesterov, device=v.device), v)
        b = beta * buf[k] + q[k].to(v.dtype)
        step = torch.where(nes, q[k].to(v.dtype) + beta * b, b)
        out_x[k], out_buf[k] = v - eta * step, b
    return out_x, out_buf


def adam_step(x: Params, q: Params, m: Params, v: Params, step: int, lr: float,
              betas: tuple[float, float], eps: float) -> tuple[Params, Params, Params]:
    """torch.optim.Adam's update (no weight decay, no amsgrad) at step number ``step`` (1, 2, ..)."""
    b1, b2 = betas
    c1, c2 = 1 - b1 ** step, math.sqrt(1 - b2 ** step)
    new_x, new_m, new_v = {}, {}, {}
    for k in x:
        g = q[k].to(x[k].dtype)
        new_m[k] = torch.lerp(m[k], g, 1 - b1)
        new_v[k] = v[k] * b2 + (1 - b2) * g * g
        new_x[k] = x[k] - (lr / c1) * new_m[k] / (new_v[k].sqrt() / c2 + eps)
    return new_x, new_m, new_v


@dataclass(frozen=True)
class ServerOpt:
    """One server optimizer setting; ``init`` gives its state (tensors), ``step`` applies q. ``radius`` (None:
    off): every step's new x is projected onto the l2 ball of that radius (``project_ball``).

    ``ServerOpt.tuned`` gives Table 2's (Charles & Konecny) settings for a Hessian spectrum [mu~, L~]."""

    kind: str = "gd"
    lr: float = 1.0
    momentum: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    radius: float | None = None

    def __post_init__(self):
        if self.kind not in SERVER_KINDS:
            raise ValueError(f"ServerOpt kind must be one of {SERVER_KINDS}, got {self.kind!r}")
        check_positive("lr", self.lr)
        if self.kind in ("heavy_ball", "nesterov") and not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1) for {self.kind}, got {self.momentum!r}")
        if self.kind in ("gd", "adam") and self.momentum:
            raise ValueError(f"{self.kind} has no momentum (use heavy_ball or nesterov), "
                             f"got momentum={self.momentum!r}")
        object.__setattr__(self, "lr", float(self.lr))
        object.__setattr__(self, "momentum", float(self.momentum))
        if self.radius is not None:
            object.__setattr__(self, "radius", float(check_positive("radius", self.radius)))

    @classmethod
    def tuned(cls, kind: str, mu_tilde: float, L_tilde: float) -> "ServerOpt":
        """The step size / momentum attaining Table 2's rho for Hessian spectrum in [mu~, L~]."""
        h = tuned_server(kind, mu_tilde, L_tilde)
        return cls(h["kind"], h["lr"], h["momentum"])

    def init(self, x: Params) -> dict:
        """The optimizer state for server parameters x: a step count and zero buffers/moments."""
        zeros = lambda: {k: torch.zeros_like(v) for k, v in x.items()}  # noqa: E731
        if self.kind == "adam":
            return {"step": 0, "m": zeros(), "v": zeros()}
        return {"step": 0, "buf": zeros()}

    def step(self, x: Params, q: Params, state: dict) -> tuple[Params, dict]:
        """Apply pseudo-gradient q: (new x, new state). Inputs are not modified."""
        t = state["step"] + 1
        if self.kind == "adam":
            x, m, v = adam_step(x, q, state["m"], state["v"], t, self.lr, self.betas, self.eps)
            return self._within(x), {"step": t, "m": m, "v": v}
        x, buf = momentum_step(x, q, state["buf"], self.lr, self.momentum, self.kind == "nesterov")
        return self._within(x), {"step": t, "buf": buf}

    def step_to(self, x: Params, target: Params, state: dict) -> tuple[Params, dict]:
        """The step towards a target model (the clients' average model): pseudo-gradient x - target.
        gd takes it as (1 - lr) x + lr target (pFedMe's server mixing; at lr 1 the target itself, which is
        model averaging exactly, without the rounding of x - (x - target))."""
        if self.kind != "gd":
            return self.step(x, {k: x[k] - target[k] for k in x}, state)
        new = target if self.lr == 1 else {k: (1 - self.lr) * x[k] + self.lr * target[k] for k in target}
        return self._within(new), {**state, "step": state["step"] + 1}

    def _within(self, x: Params) -> Params:
        return x if self.radius is None else project_ball(x, self.radius)

    def __repr__(self) -> str:
        extra = f", momentum={self.momentum:g}" if self.kind in ("heavy_ball", "nesterov") else ""
        extra += "" if self.radius is None else f", radius={self.radius:g}"
        return f"ServerOpt({self.kind}, lr={self.lr:g}{extra})"
