"""Closed forms of pflkit.theory.speedup (Chayti et al.): optimal weights minimize their rate factors, the
speedup formula's limits, and the exact expected loss against a brute-force Monte Carlo-free recursion."""
import numpy as np
import pytest

from pflkit.theory import speedup as th


@pytest.mark.parametrize("n, tau", [(1, 0.0), (10, 0.0), (10, 0.3), (100, 5.0), (1000, 1e-3)])
def test_wga_optimal_weight_minimizes_the_rate_factor(n, tau):
    grid = np.linspace(0, 1, 200_001)
    values = th.wga_rate_factor(grid, n, tau)
    a_star = th.wga_optimal_weight(n, tau)
    assert abs(grid[values.argmin()] - a_star) < 1e-5
    assert th.wga_rate_factor(a_star, n, tau) <= values.min() + 1e-12
    assert th.wga_speedup(n, tau) == pytest.approx(th.wga_rate_factor(0.0, n, tau) / th.wga_rate_factor(a_star, n, tau))
    assert th.wga_speedup(n, tau) == pytest.approx(1 / (1 - a_star))


def test_speedup_limits():
    n = np.array([1, 10, 100, 1000])
    np.testing.assert_allclose(th.wga_speedup(n, 0.0), 1 + n)                      # a copy: linear speedup
    np.testing.assert_allclose(th.wga_speedup(n, 1e6), 1.0, atol=1e-5)             # large cumulative bias: none
    np.testing.assert_allclose(th.wga_speedup(1e9, np.array([0.5, 2.0])), [3.0, 1.5])  # saturates at 1 + 1/tau
    s = th.wga_speedup(10, np.logspace(-3, 3, 13))
    assert np.all(np.diff(s) < 0)
    np.testing.assert_allclose(th.wga_optimal_weight(n, 0.0), n / (n + 1))


def test_cumulative_bias():
    assert th.cumulative_bias(mu=0.5, L=2.0, T=100, zeta=3.0, sigma=1.5) == pytest.approx(0.5 * 100 * 9 / (2 * 2.25))
    with pytest.raises(ValueError, match="sigma"):
        th.cumulative_bias(1.0, 1.0, 10, 1.0, 0.0)


@pytest.mark.parametrize("n, s, s_b", [(1, 1.0, 0.0), (10, 1.0, 1.0), (50, 2.0, 5.0)])
def test_oracle_optimal_weight_minimizes_its_rate_factor(n, s, s_b):
    grid = np.linspace(0, 1, 200_001)
    a_star = th.oracle_optimal_weight(n, s, s_b)
    assert abs(grid[th.oracle_rate_factor(grid, n, s, s_b).argmin()] - a_star) < 1e-5
    assert a_star == pytest.approx(n * s ** 2 / (n * s ** 2 + s ** 2 + s_b ** 2))


def test_floors_and_variance_reduction():
    assert th.wga_loss_floor(0.5, 2.0, mu=1.0) == pytest.approx(0.5)
    assert th.wga_loss_floor(0.5, -2.0, mu=2.0) == pytest.approx(0.25)
    assert th.bc_loss_floor(0.9, 0.01, 1.0) == pytest.approx(0.81 * 0.01 / 2)
    assert th.variance_reduction(0.0, 10) == 1.0
    assert th.variance_reduction(1.0, 10) == pytest.approx(0.1)
    assert th.variance_reduction(10 / 11, 10) == pytest.approx(1 / 11)  # a = N/(N+1): 1/(N+1)


def _brute_force(eta, a, b, n, sigma, zeta, x0, steps, c0=0.0):
    """E[x_t^2]/2 by propagating the joint Gaussian of (x, c) written out with scalar algebra."""
    mx, mc, vxx, vxc, vcc = x0, c0, 0.0, 0.0, 0.0
    s0, sa = sigma ** 2, sigma ** 2 / n
    out = [(mx ** 2 + vxx) / 2]
    for _ in range(steps):
        # x' = (1-eta) x + eta a c + eta (1-a) xi0 + eta a xiavg ; c' = (1-b) c + b xi0 - b xiavg
        nmx = (1 - eta) * mx + eta * a * mc + eta * a * zeta
        nmc = (1 - b) * mc - b * zeta
        nvxx = (1 - eta) ** 2 * vxx + 2 * (1 - eta) * eta * a * vxc + (eta * a) ** 2 * vcc \
            + (eta * (1 - a)) ** 2 * s0 + (eta * a) ** 2 * sa
        nvxc = (1 - eta) * (1 - b) * vxc + eta * a * (1 - b) * vcc \
            + eta * (1 - a) * b * s0 - eta * a * b * sa
        nvcc = (1 - b) ** 2 * vcc + b ** 2 * (s0 + sa)
        mx, mc, vxx, vxc, vcc = nmx, nmc, nvxx, nvxc, nvcc
        out.append((mx ** 2 + vxx) / 2)
    return np.array(out)


@pytest.mark.parametrize("a, b", [(0.0, 0.0), (0.5, 0.0), (0.9, 0.05), (0.3, 1.0)])
def test_expected_loss_matches_the_scalar_recursion(a, b):
    got = th.expected_loss(steps=300, eta=0.05, N=7, sigma=1.3, zeta=2.0, x0=1.5, a=a, b=b)
    np.testing.assert_allclose(got, _brute_force(0.05, a, b, 7, 1.3, 2.0, 1.5, 300), rtol=1e-10, atol=1e-14)
    assert th.stationary_loss(eta=0.05, N=7, sigma=1.3, zeta=2.0, a=a, b=b) == \
        pytest.approx(th.expected_loss(steps=20_000, eta=0.05, N=7, sigma=1.3, zeta=2.0, x0=1.5, a=a, b=b,
                                       record_every=20_000)[-1], rel=1e-8)


def test_wga_stationary_loss_closed_form_and_speedup_link():
    eta, n, sigma, zeta, a = 0.1, 10, 1.0, 0.3, 0.6
    alone = th.stationary_loss(eta=eta, N=n, sigma=sigma)
    assert alone == pytest.approx(eta * sigma ** 2 / (2 * (2 - eta)))
    wga = th.stationary_loss(eta=eta, N=n, sigma=sigma, zeta=zeta, a=a)
    tau = zeta ** 2 * (2 - eta) / (eta * sigma ** 2)  # the horizon of the bound is played by 2/eta
    assert wga / alone == pytest.approx(th.wga_rate_factor(a, n, tau))


def test_diagonal_problem_adds_coordinates():
    one = th.expected_loss(steps=50, eta=0.1, N=3, sigma=1.0, zeta=1.0, x0=1.0, a=0.5, b=0.1, curvature=2.0)
    two = th.expected_loss(steps=50, eta=0.1, N=3, sigma=1.0, zeta=[1.0, -3.0], x0=[1.0, 0.5], a=0.5, b=0.1,
                           curvature=[2.0, 0.5])
    other = th.expected_loss(steps=50, eta=0.1, N=3, sigma=1.0, zeta=-3.0, x0=0.5, a=0.5, b=0.1, curvature=0.5)
    np.testing.assert_allclose(two, one + other)


@pytest.mark.parametrize("call, match", [
    (lambda: th.wga_optimal_weight(0, 1.0), "N"),
    (lambda: th.wga_speedup(10, -1.0), "tau"),
    (lambda: th.wga_rate_factor(1.5, 10, 0.0), "a must lie"),
    (lambda: th.expected_loss(steps=10, eta=0.0, N=2, sigma=1.0), "eta"),
    (lambda: th.stationary_loss(eta=2.5, N=2, sigma=1.0), "eta"),
])
def test_bad_values_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()
