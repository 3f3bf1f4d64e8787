"""Closed forms for personalized collaborative SGD (Chayti et al.): weights, speedups, loss floors, and
the exact expected loss of Alone / WGA / BC / bias oracle on the noisy quadratic.

Bound-level quantities (restored formulas, PAPERS.md "Chayti"), m = 0:

- cumulative bias (Sec. 4)      tau = mu T zeta^2 / (L sigma^2)
- WGA's rate factor (Thm. 1, mu-PL, up to constants)  F(a) = (1 - a)^2 + a^2 / N + a^2 tau
  (variance of the WGA pseudo-gradient, in units of sigma^2, plus the accumulated bias)
- WGA optimal weight             a* = argmin F = N / (N + 1 + N tau)
- speedup over Alone             S(N, tau) = F(0) / F(a*) = 1 / (1 - a*) = 1 + N / (1 + N tau)
- bias-oracle rate factor (Thm. 2)  F_o(a) = (1 - a)^2 s^2 + a^2 (s^2 + s_b^2) / N,
  optimal a* = N s^2 / (N s^2 + s^2 + s_b^2)
- variance reduction of a weight a with zeta = 0: (1 - a)^2 + a^2 / N
- loss floors: WGA a^2 zeta^2 / (2 mu) (the bias it cannot remove), BC ~ a^2 b sigma^2 / 2 (the EMA's
  own noise, Thm. 3: BC behaves as a bias oracle with s_b^2 ~ b sigma^2).

Exact (noisy quadratic of :mod:`pflkit.data.quadratic_users`, per coordinate with curvature h): the state
z_t = (x_t, c_t) is linear-Gaussian,
    x_{t+1} = (1 - eta h) x_t + eta a c_t + eta h ((1 - a) xi_0 + a xi_avg),
    c_{t+1} = (1 - b) c_t + b h (xi_0 - xi_avg),
with xi_0 ~ N(0, sigma^2), xi_avg ~ N(zeta, sigma^2 / N), so its mean and covariance follow a 2x2
recursion and E[f_0(x_t) - f_0*] = h (E[x_t]^2 + Var x_t) / 2 exactly (:func:`expected_loss`). Alone is
a = 0, WGA is b = 0 and c_0 = 0; the bias oracle replaces c_t by -h zeta + N(0, s_b^2 / N) noise.
"""
from __future__ import annotations

import numpy as np
from scipy.linalg import solve_discrete_lyapunov

from ..checks import check_int

__all__ = ["cumulative_bias", "wga_rate_factor", "wga_optimal_weight", "wga_speedup",
           "oracle_rate_factor", "oracle_optimal_weight", "variance_reduction",
           "wga_loss_floor", "bc_loss_floor", "expected_loss", "stationary_loss"]


def _check_nonneg(name, value):
    arr = np.asarray(value, dtype=float)
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    return arr


def _check_n(value):
    arr = np.asarray(value, dtype=float)
    if not np.all(np.isfinite(arr)) or np.any(arr < 1):
        raise ValueError(f"N (number of collaborators) must be >= 1, got {value!r}")
    return arr


def _check_weight(name, value):
    arr = np.asarray(value, dtype=float)
    if not np.all(np.isfinite(arr)) or np.any(arr < 0) or np.any(arr > 1):
        raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
    return arr


def cumulative_bias(mu, L, T, zeta, sigma):
    """tau = mu T zeta^2 / (L sigma^2) (Sec. 4); mu, L, sigma > 0."""
    mu, L, T, zeta, sigma = (_check_nonneg(n, v) for n, v in
                             (("mu", mu), ("L", L), ("T", T), ("zeta", zeta), ("sigma", sigma)))
    if np.any(mu <= 0) or np.any(L <= 0) or np.any(sigma <= 0):
        raise ValueError(f"mu, L and sigma must be > 0, got mu={mu!r}, L={L!r}, sigma={sigma!r}")
    return mu * T * zeta ** 2 / (L * sigma ** 2)


def wga_rate_factor(a, N, tau):
    """F(a) = (1 - a)^2 + a^2 / N + a^2 tau: WGA's mu-PL error term relative to Alone's (Thm. 1, m = 0)."""
    a, N, tau = _check_weight("a", a), _check_n(N), _check_nonneg("tau", tau)
    return (1 - a) ** 2 + a ** 2 / N + a ** 2 * tau


def wga_optimal_weight(N, tau):
    """a* = N / (N + 1 + N tau), the minimizer of :func:`wga_rate_factor`."""
    N, tau = _check_n(N), _check_nonneg("tau", tau)
    return N / (N + 1 + N * tau)


def wga_speedup(N, tau):
    """S(N, tau) = 1 + N / (1 + N tau) = F(0) / F(a*): WGA's speedup over training alone (Fig. 1)."""
    N, tau = _check_n(N), _check_nonneg("tau", tau)
    return 1 + N / (1 + N * tau)


def oracle_rate_factor(a, N, s, s_b):
    """F_o(a) = (1 - a)^2 s^2 + a^2 (s^2 + s_b^2) / N (Thm. 2): variance of BC's pseudo-gradient given a
    bias oracle with per-collaborator noise s_b."""
    a, N, s, s_b = _check_weight("a", a), _check_n(N), _check_nonneg("s", s), _check_nonneg("s_b", s_b)
    return (1 - a) ** 2 * s ** 2 + a ** 2 * (s ** 2 + s_b ** 2) / N


def oracle_optimal_weight(N, s, s_b):
    """a* = N s^2 / (N s^2 + s^2 + s_b^2) (Thm. 2), the minimizer of :func:`oracle_rate_factor`."""
    N, s, s_b = _check_n(N), _check_nonneg("s", s), _check_nonneg("s_b", s_b)
    if np.any(s <= 0):
        raise ValueError(f"s (gradient noise) must be > 0, got {s!r}")
    return N * s ** 2 / (N * s ** 2 + s ** 2 + s_b ** 2)


def variance_reduction(a, N):
    """(1 - a)^2 + a^2 / N: variance of the WGA pseudo-gradient relative to g_0's, with zeta = 0."""
    a, N = _check_weight("a", a), _check_n(N)
    return (1 - a) ** 2 + a ** 2 / N


def wga_loss_floor(a, zeta, mu=1.0):
    """a^2 zeta^2 / (2 mu): the loss WGA cannot go below (its fixed point is shifted by a zeta / mu)."""
    a, zeta, mu = _check_weight("a", a), _check_nonneg("zeta", np.abs(zeta)), _check_nonneg("mu", mu)
    if np.any(mu <= 0):
        raise ValueError(f"mu must be > 0, got {mu!r}")
    return a ** 2 * zeta ** 2 / (2 * mu)


def bc_loss_floor(a, b, sigma):
    """a^2 b sigma^2 / 2: order of BC's loss floor from the EMA's noise (Thm. 3); independent of zeta."""
    a, b, sigma = _check_weight("a", a), _check_weight("b", b), _check_nonneg("sigma", sigma)
    return a ** 2 * b * sigma ** 2 / 2


def _moments(eta, a, b, N, sigma, zeta, h, x0, c0, s_b, steps, record_every):
    """Mean and covariance recursion of (x, c) for one coordinate; yields E loss at recorded steps."""
    oracle = s_b is not None
    if oracle:
        # c_t = -h zeta + white noise: x_{t+1} = (1 - eta h) x + eta * (target noise with mean 0)
        A = np.array([[1 - eta * h, 0.0], [0.0, 0.0]])
        var_w = (eta * h * (1 - a)) ** 2 * sigma ** 2 + (eta * h * a) ** 2 * sigma ** 2 / N \
            + (eta * a) ** 2 * s_b ** 2 / N
        drift = np.array([0.0, 0.0])
        Q = np.array([[var_w, 0.0], [0.0, 0.0]])
        m = np.array([x0, 0.0])
    else:
        A = np.array([[1 - eta * h, eta * a], [0.0, 1 - b]])
        B = np.array([[eta * h * (1 - a), eta * h * a], [b * h, -b * h]])
        drift = B @ np.array([0.0, zeta])
        Q = B @ np.diag([sigma ** 2, sigma ** 2 / N]) @ B.T
        m = np.array([x0, c0])
    P = np.zeros((2, 2))
    out = [h * (m[0] ** 2 + P[0, 0]) / 2]
    for t in range(1, steps + 1):
        m = A @ m + drift
        P = A @ P @ A.T + Q
        if t % record_every == 0 or t == steps:
            out.append(h * (m[0] ** 2 + P[0, 0]) / 2)
    return np.array(out)


def expected_loss(*, steps: int, eta: float, N: int, sigma: float, zeta=1.0, x0=1.0, a: float = 0.0,
                  b: float = 0.0, c0: float = 0.0, curvature=1.0, s_b: float | None = None,
                  record_every: int = 1) -> np.ndarray:
    """Exact E[f_0(x_t) - f_0*] on the noisy quadratic, at t = 0, record_every, ..., steps.

    Alone: a = 0. WGA: weight a, b = 0, c0 = 0. BC: a, b, c0. Bias oracle: a and ``s_b`` (b, c0 unused).
    ``zeta``, ``x0`` and ``curvature`` are numbers or per-coordinate sequences (diagonal problem: the
    coordinates are independent and their losses add).
    """
    check_int("steps", steps, 0), check_int("record_every", record_every, 1)
    _check_weight("a", a), _check_weight("b", b), _check_n(N), _check_nonneg("sigma", sigma)
    if not eta > 0:
        raise ValueError(f"eta must be > 0, got {eta!r}")
    zeta, x0, h = np.broadcast_arrays(np.atleast_1d(np.asarray(zeta, float)), np.atleast_1d(np.asarray(x0, float)),
                                      np.atleast_1d(np.asarray(curvature, float)))
    if np.any(h <= 0):
        raise ValueError(f"curvature must be > 0, got {curvature!r}")
    return sum(_moments(float(eta), float(a), float(b), float(N), float(sigma), float(z), float(hk), float(x),
                        float(c0), None if s_b is None else float(s_b), steps, record_every)
               for z, x, hk in zip(zeta, x0, h))


def stationary_loss(*, eta: float, N: int, sigma: float, zeta=1.0, a: float = 0.0, b: float = 0.0,
                    curvature=1.0, s_b: float | None = None) -> float:
    """lim_{t -> inf} of :func:`expected_loss` (the method's loss floor at step size eta), by solving the
    discrete Lyapunov equation of the (x, c) recursion. For b = 0 (WGA) this is, per coordinate,
    h (a zeta)^2 / 2 + eta h^2 v / (2 (2 - eta h)) with v = ((1-a)^2 + a^2/N) sigma^2."""
    zeta, h = np.broadcast_arrays(np.atleast_1d(np.asarray(zeta, float)), np.atleast_1d(np.asarray(curvature, float)))
    total = 0.0
    for z, hk in zip(zeta, h):
        if not 0 < eta * hk < 2:
            raise ValueError(f"eta * curvature must lie in (0, 2) for a floor to exist, got {eta * hk!r}")
        if s_b is not None:
            var_w = (eta * hk * (1 - a)) ** 2 * sigma ** 2 + (eta * hk * a) ** 2 * sigma ** 2 / N \
                + (eta * a) ** 2 * s_b ** 2 / N
            total += hk * var_w / (1 - (1 - eta * hk) ** 2) / 2
            continue
        if b == 0:  # WGA / Alone: c stays at c0 = 0
            v = hk ** 2 * ((1 - a) ** 2 + a ** 2 / N) * sigma ** 2
            total += hk * ((a * z) ** 2 + eta ** 2 * v / (1 - (1 - eta * hk) ** 2)) / 2
            continue
        A = np.array([[1 - eta * hk, eta * a], [0.0, 1 - b]])
        B = np.array([[eta * hk * (1 - a), eta * hk * a], [b * hk, -b * hk]])
        mean = np.linalg.solve(np.eye(2) - A, B @ np.array([0.0, z]))
        P = solve_discrete_lyapunov(A, B @ np.diag([sigma ** 2, sigma ** 2 / N]) @ B.T)
        total += hk * (mean[0] ** 2 + P[0, 0]) / 2
    return float(total)
