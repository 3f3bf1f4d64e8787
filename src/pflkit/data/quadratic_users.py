"""Noisy quadratic users (Chayti et al., Sec. 6): user 0 and N collaborators with shifted optima.

User i's objective is the noisy quadratic (diagonal curvature ``h``, per coordinate k)

    f_i(x) = 1/2 E sum_k h_k (x_k - xi_{i,k})^2,   xi_0 ~ N(0, sigma^2 I),  xi_i ~ N(zeta, sigma^2 I) (i >= 1),

so f_0* = 0 at x = 0, the loss f_0(x) - f_0* = 1/2 sum_k h_k x_k^2, and a stochastic gradient of user i
at x is g_i = h * (x - xi_i) with one fresh draw of xi_i per call. In the paper's 1-D model
(``dim=1``, ``curvature=1``) this is g_i = x - xi_i.

The constants of the paper's assumptions (A1-A5) for this problem:
L = max h (smoothness), mu = min h (PL), delta = 0 (equal Hessians), m = 0 and
zeta_A4^2 = ||grad f_avg - grad f_0||^2 = sum_k (h_k zeta_k)^2 (gradient similarity; constant in x),
sigma_A5^2 = sum_k h_k^2 sigma^2 (gradient variance).

``NoisyQuadraticUsers`` is a gradient oracle in the sense of :mod:`pflkit.algorithms.collaborative`:
``users(x, generator)`` maps points ``x [R, d]`` (one per independent run) to the stochastic gradients
of all users at those points, ``[R, N + 1, d]``, user 0 first.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..checks import check_int, is_real
from ..device import resolve_device

__all__ = ["NoisyQuadraticUsers"]


def _vector(name: str, value, dim: int, *, positive: bool) -> tuple[float, ...]:
    values = [value] * dim if is_real(value) else list(value)
    if len(values) != dim or not all(is_real(v) for v in values):
        raise ValueError(f"{name} must be a number or a sequence of {dim} numbers (dim={dim}), got {value!r}")
    if positive and any(not v > 0 for v in values):
        raise ValueError(f"{name} must be > 0 in every coordinate, got {value!r}")
    if any(v != v or abs(v) == float("inf") for v in values):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return tuple(float(v) for v in values)


@dataclass(frozen=True)
class NoisyQuadraticUsers:
    """User 0 plus ``n_collaborators`` noisy quadratic users (see the module docstring).

    ``zeta`` (collaborators' optimum, per coordinate or one number for all) and ``curvature`` (the
    diagonal h) may be scalars or length-``dim`` sequences. Tensors are made in ``dtype`` on ``device``.
    """

    n_collaborators: int = 10
    sigma: float = 1.0
    zeta: float | Sequence[float] = 1.0
    dim: int = 1
    curvature: float | Sequence[float] = 1.0
    dtype: torch.dtype = torch.float64
    device: str | torch.device = "cpu"
    _h: torch.Tensor = field(init=False, repr=False, compare=False)
    _means: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        n, dim = self.n_collaborators, self.dim
        check_int("n_collaborators", n, 1), check_int("dim", dim, 1)
        if not is_real(self.sigma) or not self.sigma >= 0:
            raise ValueError(f"sigma must be a number >= 0, got {self.sigma!r}")
        if self.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {self.dtype!r}")
        zeta = _vector("zeta", self.zeta, dim, positive=False)
        h = _vector("curvature", self.curvature, dim, positive=True)
        device = resolve_device(str(self.device)) if not isinstance(self.device, torch.device) else self.device
        object.__setattr__(self, "device", device)
        object.__setattr__(self, "_h", torch.tensor(h, dtype=self.dtype, device=device))
        means = torch.zeros(n + 1, dim, dtype=self.dtype, device=device)
        means[1:] = torch.tensor(zeta, dtype=self.dtype, device=device)
        object.__setattr__(self, "_means", means)

    # -- the random draw and the gradient oracle ---------------------------------------------------
    def sample(self, runs: int, generator: torch.Generator | None) -> torch.Tensor:
        """One draw of every user's xi for each run: ``[runs, N + 1, d]`` (the only random call)."""
        noise = torch.randn(runs, self.n_collaborators + 1, self.dim, generator=generator,
                            dtype=self.dtype, device=self.device)
        return self._means + self.sigma * noise

    def gradients(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """Stochastic gradients g_i = h (x - xi_i) of all users at user 0's points: ``[R, N + 1, d]``."""
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"x must have shape [runs, {self.dim}], got {tuple(x.shape)}")
        return self._h * (x[:, None, :] - self.sample(x.shape[0], generator))

    __call__ = gradients

    # -- exact quantities ----------------------------------------------------------------------------
    def loss(self, x: torch.Tensor) -> torch.Tensor:
        """f_0(x) - f_0* = 1/2 sum_k h_k x_k^2 for each run: ``[R]``."""
        return 0.5 * (self._h * x * x).sum(-1)

    def bias(self, x: torch.Tensor) -> torch.Tensor:
        """The true bias grad f_avg(x) - grad f_0(x) = -h * zeta (constant in x): ``[R, d]``."""
        return (-self._h * self._means[1]).expand_as(x)

    @property
    def curvatures(self) -> torch.Tensor:
        return self._h

    @property
    def mu(self) -> float:
        return float(self._h.min())

    @property
    def smoothness(self) -> float:
        return float(self._h.max())

    @property
    def zeta_sq(self) -> float:
        """zeta^2 of assumption A4: ||grad f_avg - grad f_0||^2."""
        return float(((self._h * self._means[1]) ** 2).sum())

    @property
    def sigma_sq(self) -> float:
        """sigma^2 of assumption A5: E||g_i - grad f_i||^2."""
        return float((self._h ** 2).sum()) * float(self.sigma) ** 2

    def start(self, x0, runs: int) -> torch.Tensor:
        """The common starting point ``x0`` (number or length-d sequence) for every run: ``[runs, d]``."""
        check_int("runs", runs, 1)
        point = torch.tensor(_vector("x0", x0, self.dim, positive=False), dtype=self.dtype, device=self.device)
        return point.expand(runs, self.dim).clone()
