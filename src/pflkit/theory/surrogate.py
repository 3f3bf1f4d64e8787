"""Surrogate losses, condition numbers, rates and Pareto frontiers of LocalUpdate on quadratics.

Charles & Konecny, *Convergence and Accuracy Trade-Offs in Federated Learning and Meta-Learning*.
Clients f_i(x) = 1/2 |A_i^1/2 (x - c_i)|^2 with mu I <= A_i <= L I and |c_i| <= C (Assumptions 1-2).

- ``Theta``: the client's gradient weights (theta_1, ..., theta_K), eq. (4)-(5).
- ``distortion`` Q_i(alpha, gamma, Theta) = sum_k theta_k (I - gamma (A_i + alpha I))^{k-1}  (eq. 6).
- ``surrogate_loss`` / ``surrogate_grad``: f~_i(x) = 1/2 |(Q_i A_i)^1/2 (x - c_i)|^2 (eqs. 7-8);
  Theorem 1: E[ClientUpdate(i, x)] = grad f~_i(x); Theorem 2: MAML = grad f~_i(x; 0, gamma, Theta_{2K+1}).
- ``surrogate_minimizer`` x*(alpha, gamma, Theta) = E[Q_i A_i]^-1 E[Q_i A_i c_i]  (Lemma 11).
- ``kappa`` (eq. 9), ``phi``/``psi`` (eqs. 10, 12), ``kappa_bound_sum`` (11), ``kappa_bound_last`` (13).
- ``rate`` rho of Table 2 and ``tuned_server`` (the ServerOpt hyperparameters that attain it,
  Lessard et al. 2016, Prop. 1), ``suboptimality`` Delta (eq. 17), ``lemma5_bound`` (eq. 15).
- ``frontier`` (analytic, eqs. 11/13 + Table 2 + eq. 17) and ``simulated_maml_frontier`` (App. D.1).

All computations are float64 torch and batched (grids of K / gamma / alpha are tensor dimensions).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch
from torch import Tensor

from ..checks import is_number

if TYPE_CHECKING:  # pandas loads only where a table is built (a ClientApp process imports none)
    import pandas as pd

__all__ = [
    "Theta", "theta_K", "theta_1_to_K", "SERVER_OPTS", "distortion", "distortion_eigenvalues",
    "surrogate_grad", "surrogate_loss", "surrogate_minimizer", "kappa",
    "kappa_of_hessian", "phi", "psi", "kappa_bound_sum", "kappa_bound_last", "rate", "tuned_server",
    "suboptimality", "lemma5_bound", "corollary1_bound", "frontier", "simulated_maml_frontier",
    "random_spd", "one_shot_delta",
]

DTYPE = torch.float64
SERVER_OPTS = ("gd", "nesterov", "heavy_ball")  # Table 2 rows: no momentum, Nesterov, heavy-ball


# --------------------------------------------------------------------------------------- Theta
@dataclass(frozen=True)
class Theta:
    """Client gradient weights Theta = (theta_1, ..., theta_K), finite, non-negative, non-zero (eq. 4).

    ``kind`` is "last" for Theta_K = (0, ..., 0, 1), "sum" for Theta_{1:K} = (1, ..., 1) and "general"
    otherwise; the two named kinds have closed-form polynomials (usable for K up to 1e6 and beyond).
    """

    K: int
    kind: str = "general"
    values: tuple[float, ...] | None = None

    def __post_init__(self):
        if self.kind not in ("last", "sum", "general"):
            raise ValueError(f"Theta kind must be 'last', 'sum' or 'general', got {self.kind!r}")
        if not isinstance(self.K, (int, np.integer)) or isinstance(self.K, bool) or self.K < 1:
            raise ValueError(f"Theta K must be an integer >= 1, got {self.K!r}")
        if self.kind == "general":
            if self.values is None or len(self.values) != self.K:
                raise ValueError("a general Theta needs K values; use Theta.of(weights)")

    @classmethod
    def of(cls, weights: Sequence[float] | Tensor) -> "Theta":
        """Any finite non-negative weights with a positive entry; trailing zeros are dropped (K(Theta))."""
        w = torch.as_tensor(weights, dtype=DTYPE).flatten()
        if w.numel() == 0 or not bool(torch.isfinite(w).all()) or bool((w < 0).any()) or not bool((w > 0).any()):
            raise ValueError(f"theta must be finite, non-negative weights with at least one positive entry, "
                             f"got {w.tolist()}")
        K = int(torch.nonzero(w > 0).max()) + 1
        w = w[:K]
        if bool((w == 1).all()):
            return cls(K, "sum")
        if K == 1 or (bool((w[:-1] == 0).all()) and float(w[-1]) == 1.0):
            return cls(K, "last")
        return cls(K, "general", tuple(float(v) for v in w))

    @property
    def weights(self) -> Tensor:
        """theta as a float64 tensor [K]."""
        if self.kind == "sum":
            return torch.ones(self.K, dtype=DTYPE)
        if self.kind == "last":
            w = torch.zeros(self.K, dtype=DTYPE)
            w[-1] = 1.0
            return w
        return torch.tensor(self.values, dtype=DTYPE)

    @property
    def total(self) -> float:
        """w(Theta) = sum_k theta_k (eq. 4)."""
        return float(self.K) if self.kind == "sum" else (1.0 if self.kind == "last" else float(sum(self.values)))

    def poly(self, s: Tensor) -> Tensor:
        """sum_k theta_k (1 - s)^{k-1} elementwise, with s = gamma (lambda + alpha) (Lemma 9, eq. 29)."""
        s = torch.as_tensor(s, dtype=DTYPE)
        if self.kind == "last":
            return _pow1m(s, self.K - 1)
        if self.kind == "sum":
            # (1 - (1-s)^K) / s, and K at s = 0
            safe = torch.where(s == 0, torch.ones_like(s), s)
            return torch.where(s == 0, torch.full_like(s, float(self.K)),
                               _one_minus_pow(s, torch.tensor(float(self.K), dtype=DTYPE)) / safe)
        w = self.weights.to(s.device)
        powers = (1 - s).unsqueeze(-1) ** torch.arange(self.K, dtype=DTYPE, device=s.device)
        return powers @ w

    def __str__(self) -> str:
        return {"last": f"Theta_{self.K}", "sum": f"Theta_1:{self.K}"}.get(self.kind, f"Theta{self.values}")


def _pow1m(s: Tensor, n: int) -> Tensor:
    """(1 - s)^n, accurate for tiny s and huge n (via log1p) where 1 - s > 0."""
    below = s < 1
    safe = torch.where(below, s, torch.zeros_like(s))
    return torch.where(below, torch.exp(n * torch.log1p(-safe)), (1 - s) ** n)


def theta_K(K: int) -> Theta:
    """Theta_K = (0, ..., 0, 1): the client returns only its K-th gradient (FOMAML-style, eq. 5)."""
    return Theta(int(K), "last")


def theta_1_to_K(K: int) -> Theta:
    """Theta_{1:K} = (1, ..., 1): the client returns the sum of its K gradients (FedAvg-style, eq. 5)."""
    return Theta(int(K), "sum")


def _theta(theta) -> Theta:
    return theta if isinstance(theta, Theta) else Theta.of(theta)


def _one_minus_pow(s: Tensor, n: Tensor) -> Tensor:
    """1 - (1 - s)^n, accurate for tiny s and large n (expm1/log1p) when s < 1."""
    below = s < 1
    safe = torch.where(below, s, torch.zeros_like(s))
    return torch.where(below, -torch.expm1(n * torch.log1p(-safe)), 1 - (1 - s) ** n)


def _check_step(alpha: float, gamma: float):
    for name, value in (("alpha", alpha), ("gamma", gamma)):
        if not (is_number(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


# --------------------------------------------------------------------------- matrices (eqs. 6-8)
def distortion_eigenvalues(lam: Tensor, alpha: float, gamma: float, theta) -> Tensor:
    """Eigenvalues of Q_i for eigenvalues ``lam`` of A_i (Lemma 9, eq. 29)."""
    return _theta(theta).poly(gamma * (torch.as_tensor(lam, dtype=DTYPE) + alpha))


def distortion(A: Tensor, alpha: float, gamma: float, theta) -> Tensor:
    """Q_i(alpha, gamma, Theta) = sum_k theta_k (I - gamma (A_i + alpha I))^{k-1} (eq. 6); A [..., d, d]."""
    _check_step(alpha, gamma)
    A = torch.as_tensor(A, dtype=DTYPE)
    lam, U = torch.linalg.eigh(A)
    q = distortion_eigenvalues(lam, alpha, gamma, theta)
    return (U * q.unsqueeze(-2)) @ U.transpose(-1, -2)


def _weights(n: int, weights: Tensor | None, device) -> Tensor:
    if weights is None:
        return torch.full((n,), 1.0 / n, dtype=DTYPE, device=device)
    w = torch.as_tensor(weights, dtype=DTYPE, device=device)
    if w.shape != (n,) or bool((w < 0).any()) or not float(w.sum()) > 0:
        raise ValueError(f"weights must be {n} non-negative numbers with a positive sum")
    return w / w.sum()


def surrogate_grad(A: Tensor, c: Tensor, x: Tensor, alpha: float, gamma: float, theta) -> Tensor:
    """grad f~_i(x) = Q_i A_i (x - c_i) per client: A [N, d, d], c [N, d], x [d] or [N, d] -> [N, d]."""
    QA = distortion(A, alpha, gamma, theta) @ torch.as_tensor(A, dtype=DTYPE)
    return (QA @ (torch.as_tensor(x, dtype=DTYPE) - c).unsqueeze(-1)).squeeze(-1)


def surrogate_loss(A: Tensor, c: Tensor, x: Tensor, alpha: float, gamma: float, theta,
                   weights: Tensor | None = None) -> Tensor:
    """f~(x) = E_i 1/2 (x - c_i)^T Q_i A_i (x - c_i) (eqs. 7-8); x [d] or [R, d] -> scalar or [R]."""
    QA = distortion(A, alpha, gamma, theta) @ torch.as_tensor(A, dtype=DTYPE)
    x = torch.as_tensor(x, dtype=DTYPE)
    e = x.unsqueeze(-2) - c  # [..., N, d]
    per = 0.5 * torch.einsum("...nd,nde,...ne->...n", e, QA, e)
    return per @ _weights(len(A), weights, per.device)


def surrogate_minimizer(A: Tensor, c: Tensor, alpha: float, gamma: float, theta,
                        weights: Tensor | None = None) -> Tensor:
    """x*(alpha, gamma, Theta) = E[Q_i A_i]^-1 E[Q_i A_i c_i] (Lemma 11); with Theta_1 it is x*."""
    A = torch.as_tensor(A, dtype=DTYPE)
    c = torch.as_tensor(c, dtype=DTYPE)
    p = _weights(len(A), weights, A.device)
    QA = distortion(A, alpha, gamma, theta) @ A
    H = torch.einsum("n,nde->de", p, QA)
    b = torch.einsum("n,nde,ne->d", p, QA, c)
    return torch.linalg.solve(H, b)


# ------------------------------------------------------------------- condition numbers (9-13)
def kappa(A: Tensor, alpha: float, gamma: float, theta, weights: Tensor | None = None) -> Tensor:
    """kappa(alpha, gamma, Theta) = E_i[lmax(Q_i A_i)] / E_i[lmin(Q_i A_i)] (eq. 9), from the spectra of
    the A_i (Q_i A_i has eigenvalues q(lambda) lambda, Lemma 9)."""
    _check_step(alpha, gamma)
    lam = torch.linalg.eigvalsh(torch.as_tensor(A, dtype=DTYPE))  # [N, d]
    qa = distortion_eigenvalues(lam, alpha, gamma, theta) * lam
    p = _weights(lam.shape[0], weights, lam.device)
    return (qa.max(-1).values @ p) / (qa.min(-1).values @ p)


def kappa_of_hessian(A: Tensor, alpha: float, gamma: float, theta, weights: Tensor | None = None) -> Tensor:
    """cond(E_i[Q_i A_i]) = cond of the surrogate's Hessian (<= kappa by Lemma 2)."""
    A = torch.as_tensor(A, dtype=DTYPE)
    p = _weights(len(A), weights, A.device)
    H = torch.einsum("n,nde->de", p, distortion(A, alpha, gamma, theta) @ A)
    ev = torch.linalg.eigvalsh(H)
    return ev[-1] / ev[0]


def phi(lam, alpha, gamma, K) -> Tensor:
    """phi(lambda) = sum_{k=1..K} (1 - gamma (lambda + alpha))^{k-1} lambda (eq. 10, closed form 33);
    all arguments broadcast."""
    lam = torch.as_tensor(lam, dtype=DTYPE)
    s = torch.as_tensor(gamma, dtype=DTYPE) * (lam + torch.as_tensor(alpha, dtype=DTYPE))
    K = torch.as_tensor(K, dtype=DTYPE)
    safe = torch.where(s == 0, torch.ones_like(s), s)
    geo = torch.where(s == 0, K * torch.ones_like(s), _one_minus_pow(s, K) / safe)
    return geo * lam


def psi(lam, alpha, gamma, K) -> Tensor:
    """psi(lambda) = (1 - gamma (lambda + alpha))^{K-1} lambda (eq. 12); all arguments broadcast."""
    lam = torch.as_tensor(lam, dtype=DTYPE)
    s = torch.as_tensor(gamma, dtype=DTYPE) * (lam + torch.as_tensor(alpha, dtype=DTYPE))
    K = torch.as_tensor(K, dtype=DTYPE)
    below = s < 1
    safe = torch.where(below, s, torch.zeros_like(s))
    return torch.where(below, torch.exp((K - 1) * torch.log1p(-safe)), (1 - s) ** (K - 1)) * lam


def kappa_bound_sum(mu, L, alpha, gamma, K) -> Tensor:
    """Lemma 3, eq. (11): kappa(alpha, gamma, Theta_{1:K}) <= phi(L) / phi(mu); needs gamma < 1/(L+alpha)."""
    return phi(L, alpha, gamma, K) / phi(mu, alpha, gamma, K)


def kappa_bound_last(mu, L, alpha, gamma, K) -> Tensor:
    """Lemma 4, eq. (13): kappa(alpha, gamma, Theta_K) <= ((1-gamma(L+alpha))/(1-gamma(mu+alpha)))^{K-1} L/mu;
    needs gamma < 1/(K L + alpha)."""
    return psi(L, alpha, gamma, K) / psi(mu, alpha, gamma, K)


# ------------------------------------------------------------------------ rates and accuracy
def rate(kappa_value, server_opt: str = "gd") -> Tensor:
    """rho of Table 2: (k-1)/(k+1) (gd), 1 - 2/sqrt(3k+1) (nesterov), (sqrt k - 1)/(sqrt k + 1) (heavy_ball)."""
    k = torch.as_tensor(kappa_value, dtype=DTYPE)
    # tanh forms: (k-1)/(k+1) = tanh(log(k)/2), (sqrt k-1)/(sqrt k+1) = tanh(log(k)/4); exact at k = inf
    if server_opt == "gd":
        return torch.tanh(torch.log(k) / 2)
    if server_opt == "nesterov":
        return 1 - 2 / torch.sqrt(3 * k + 1)
    if server_opt == "heavy_ball":
        return torch.tanh(torch.log(k) / 4)
    raise ValueError(f"server_opt must be one of {SERVER_OPTS}, got {server_opt!r}")


def tuned_server(server_opt: str, mu_tilde: float, L_tilde: float) -> dict:
    """Server step size (and momentum) that attain Table 2's rho on a quadratic whose Hessian has
    spectrum in [mu~, L~] (Lessard et al. 2016, Prop. 1): gd lr = 2/(L+mu); nesterov lr = 4/(3L+mu),
    beta = (sqrt(3k+1)-2)/(sqrt(3k+1)+2); heavy_ball lr = 4/(sqrt L + sqrt mu)^2,
    beta = ((sqrt k - 1)/(sqrt k + 1))^2."""
    if not (0 < mu_tilde <= L_tilde):
        raise ValueError(f"need 0 < mu_tilde <= L_tilde, got mu_tilde={mu_tilde!r}, L_tilde={L_tilde!r}")
    k = L_tilde / mu_tilde
    if server_opt == "gd":
        return {"kind": "gd", "lr": 2.0 / (L_tilde + mu_tilde), "momentum": 0.0}
    if server_opt == "nesterov":
        s = math.sqrt(3 * k + 1)
        return {"kind": "nesterov", "lr": 4.0 / (3 * L_tilde + mu_tilde), "momentum": (s - 2) / (s + 2)}
    if server_opt == "heavy_ball":
        r = (math.sqrt(k) - 1) / (math.sqrt(k) + 1)
        return {"kind": "heavy_ball", "lr": 4.0 / (math.sqrt(L_tilde) + math.sqrt(mu_tilde)) ** 2,
                "momentum": r * r}
    raise ValueError(f"server_opt must be one of {SERVER_OPTS}, got {server_opt!r}")


def suboptimality(kappa_value, kappa0) -> Tensor:
    """Delta = (sqrt(kappa0) - sqrt(kappa)) / (sqrt(kappa0) + sqrt(kappa)) (eq. 17), kappa0 = L/mu."""
    k = torch.as_tensor(kappa_value, dtype=DTYPE)
    k0 = torch.as_tensor(kappa0, dtype=DTYPE)
    return torch.tanh((torch.log(k0) - torch.log(k)) / 4)  # = (sqrt k0 - sqrt k)/(sqrt k0 + sqrt k)


def one_shot_delta(mu: float, L: float) -> float:
    """Delta where the FedAvg frontier meets the Delta axis (K -> inf, alpha = 0: kappa -> 1)."""
    return float(suboptimality(1.0, L / mu))


def lemma5_bound(A: Tensor, alpha: float, gamma: float, theta, C: float) -> Tensor:
    """Lemma 5, eq. (15): |x*(alpha,gamma,Theta) - x*| <= 8 C (sqrt b - sqrt a)/(sqrt b + sqrt a),
    b = max_i lmax(Q_i), a = min_i lmin(Q_i)."""
    lam = torch.linalg.eigvalsh(torch.as_tensor(A, dtype=DTYPE))
    q = distortion_eigenvalues(lam, alpha, gamma, theta)
    b, a = q.max(), q.min()
    return 8 * C * (torch.sqrt(b) - torch.sqrt(a)) / (torch.sqrt(b) + torch.sqrt(a))


def corollary1_bound(T: int, rho: float, dist0: float, C: float, kappa_value: float, kappa0: float) -> float:
    """Corollary 1: |x_T - x*| <= rho^T |x_0 - x*(alpha,gamma,Theta)| + 8 C Delta."""
    return float(rho) ** T * float(dist0) + 8 * C * float(suboptimality(kappa_value, kappa0))


# ------------------------------------------------------------------------------- frontiers
def frontier(mu: float, L: float, *, alpha, gamma, K, theta: str = "sum",
             server_opt: str | Sequence[str] = "gd") -> pd.DataFrame:
    """Analytic Pareto frontier (rho, Delta) from the kappa bounds (11) (theta='sum', Theta_{1:K}) or
    (13) (theta='last', Theta_K), Table 2 and eq. (17). ``alpha``, ``gamma`` and ``K`` broadcast
    (any of them may be a grid). Points outside the lemma's step-size condition are dropped
    (gamma < 1/(L+alpha) for sum, gamma < 1/(K L + alpha) for last).

    Returns columns: server_opt, theta, alpha, gamma, K, kappa, rho, delta.
    """
    if not 0 < mu <= L:
        raise ValueError(f"need 0 < mu <= L, got mu={mu!r}, L={L!r}")
    a, g, k = torch.broadcast_tensors(*(torch.as_tensor(v, dtype=DTYPE).flatten() if np.ndim(v)
                                        else torch.as_tensor(v, dtype=DTYPE) for v in (alpha, gamma, K)))
    a, g, k = a.reshape(-1), g.reshape(-1), k.reshape(-1)
    if bool((k < 1).any()) or bool((g < 0).any()) or bool((a < 0).any()):
        raise ValueError("K must be >= 1, gamma >= 0 and alpha >= 0 everywhere")
    if theta == "sum":
        ok = g < 1 / (L + a)
        kap = kappa_bound_sum(mu, L, a, g, k)
    elif theta == "last":
        ok = g < 1 / (k * L + a)
        kap = kappa_bound_last(mu, L, a, g, k)
    else:
        raise ValueError(f"theta must be 'sum' (Theta_1:K) or 'last' (Theta_K), got {theta!r}")
    import pandas as pd

    opts = [server_opt] if isinstance(server_opt, str) else list(server_opt)
    frames = []
    for opt in opts:
        frames.append(pd.DataFrame({
            "server_opt": opt, "theta": theta, "alpha": a[ok].numpy(), "gamma": g[ok].numpy(),
            "K": k[ok].numpy(), "kappa": kap[ok].numpy(), "rho": rate(kap[ok], opt).numpy(),
            "delta": suboptimality(kap[ok], L / mu).numpy()}))
    return pd.concat(frames, ignore_index=True)


def random_spd(n: int, d: int, mu: float, L: float, generator: torch.Generator, device="cpu",
               return_eigenvalues: bool = False):
    """n random A = b1 B^T B + b2 I with B_ij ~ N(0, 1) and b1, b2 such that lmin(A) = mu and
    lmax(A) = L exactly (App. D.1). Returns [n, d, d] float64 (and A's eigenvalues [n, d], ascending,
    when ``return_eigenvalues``: they are b1 eig(B^T B) + b2)."""
    if d < 2 or not 0 < mu < L:
        raise ValueError(f"need d >= 2 and 0 < mu < L, got d={d!r}, mu={mu!r}, L={L!r}")
    B = torch.randn(n, d, d, generator=generator, dtype=DTYPE).to(device)
    G = B.transpose(-1, -2) @ B
    ev = torch.linalg.eigvalsh(G)
    smin, smax = ev[:, :1, None], ev[:, -1:, None]
    b1 = (L - mu) / (smax - smin)
    b2 = mu - b1 * smin
    A = b1 * G + b2 * torch.eye(d, dtype=DTYPE, device=device)
    A = 0.5 * (A + A.transpose(-1, -2))
    return (A, b1[..., 0] * ev + b2[..., 0]) if return_eigenvalues else A


def simulated_maml_frontier(mu: float, L: float, d: int, *, alpha: float, gamma: float, K,
                            generator: torch.Generator, server_opt: str | Sequence[str] = "gd",
                            device="cpu") -> pd.DataFrame:
    """Simulated Pareto frontier of Theta_K (MAML-style) beyond Lemma 4's range (Sec. 5, App. D.1).

    For every K a fresh random A (``random_spd``) is drawn; kappa = cond(Q(alpha, gamma, Theta_K) A)
    gives rho through Table 2, and Delta = (sqrt lmax(Q) - sqrt lmin(Q)) / (sqrt lmax(Q) + sqrt lmin(Q))
    (Lemma 5 with the extreme eigenvalues of Q itself). Columns: server_opt, d, alpha, gamma, K,
    kappa, rho, delta.
    """
    _check_step(float(alpha), float(gamma))
    if not gamma < 1 / (L + alpha):
        raise ValueError(f"gamma must be < 1/(L+alpha) = {1 / (L + alpha):.4g} so that Q is positive "
                         f"definite (Lemma 1), got {gamma!r}")
    Ks = torch.as_tensor(K, dtype=DTYPE).flatten()
    _, lam = random_spd(len(Ks), d, mu, L, generator, device, return_eigenvalues=True)  # lam [n, d]
    # log-space: for large K the eigenvalues (1 - gamma(lambda+alpha))^{K-1} of Q underflow
    logq = (Ks.to(lam.device)[:, None] - 1) * torch.log1p(-gamma * (lam + alpha))
    logqa = logq + torch.log(lam)
    log_kappa = (logqa.max(-1).values - logqa.min(-1).values).cpu()
    kap = torch.exp(log_kappa)
    delta = torch.tanh((logq.max(-1).values - logq.min(-1).values).cpu() / 4)  # Lemma 5 form with Q
    import pandas as pd

    opts = [server_opt] if isinstance(server_opt, str) else list(server_opt)
    return pd.concat([pd.DataFrame({
        "server_opt": opt, "d": d, "alpha": float(alpha), "gamma": float(gamma), "K": Ks.numpy(),
        "kappa": kap.numpy(), "rho": rate(kap, opt).numpy(), "delta": delta.numpy()}) for opt in opts],
        ignore_index=True)
