"""The paper's claims, numerically: Theorems 1-4, Lemmas 3-6, Corollary 1, Table 2 and the MAML cusp."""
import math

import pytest
import torch

from pflkit.algorithms.local_update import MAML, LocalUpdate, QuadraticLocalUpdate, ServerOpt, Theta, maml_theta
from pflkit.data.quadratic import QuadraticModel, quadratic_clients
from pflkit.theory import surrogate as S

Z99 = 2.5758  # two-sided 99% normal quantile


def clients(seed=0, n=6, d=4, noise=0.0, examples=1, shared=False, L=10.0, C=2.0):
    g = torch.Generator().manual_seed(seed)
    return quadratic_clients(n, d, mu=1.0, L=L, C=C, examples_per_client=examples, example_noise=noise,
                             shared_basis=shared, generator=g)


def z_bonferroni(k):
    """Two-sided normal quantile for a 99% family-wise bound over k coordinates."""
    return float(torch.distributions.Normal(0, 1).icdf(torch.tensor(1 - 0.01 / (2 * k))))


# ------------------------------------------------------------------------------------ Theorem 1
@pytest.mark.parametrize("theta,alpha", [(S.theta_1_to_K(5), 0.0), (Theta.of([0.3, 0.0, 1.5, 0.7]), 0.4),
                                         (S.theta_K(4), 0.0)])
def test_theorem1_monte_carlo_mean_of_client_update_is_surrogate_gradient(theta, alpha):
    qc = clients(seed=1, noise=0.6, examples=8)
    gamma, R = 0.04, 4000
    x = torch.tensor([0.5, -1.0, 2.0, 0.3], dtype=torch.float64)
    algo = QuadraticLocalUpdate(theta=theta, gamma=gamma, alpha=alpha, batch_size=2)
    want = S.surrogate_grad(qc.A, qc.c, x, alpha, gamma, theta)  # [N, d]
    gen = torch.Generator().manual_seed(7)
    ids = torch.arange(qc.num_clients).repeat_interleave(R)
    q = algo.client_updates(qc, ids, x, gen).reshape(qc.num_clients, R, -1)
    mean, se = q.mean(1), q.std(1) / math.sqrt(R)
    assert bool((se > 0).all())  # the updates really are random
    z = (mean - want).abs() / se
    assert float(z.max()) < z_bonferroni(z.numel()), float(z.max())


def test_theorem1_monte_carlo_on_the_engine_path():
    qc = clients(seed=2, d=3, noise=0.5, examples=6)
    theta, gamma, alpha, R = Theta.of([1.0, 0.5, 2.0]), 0.05, 0.2, 3000
    algo = LocalUpdate(QuadraticModel(3), theta=theta, gamma=gamma, alpha=alpha, batch_size=2)
    x = torch.tensor([1.0, -0.5, 0.25])
    ids = torch.tensor([0, 3]).repeat_interleave(R)
    q = algo.client_updates({"x": x}, qc.to_federated(), ids, torch.Generator().manual_seed(1))["x"].double()
    q = q.reshape(2, R, 3)
    want = S.surrogate_grad(qc.A[[0, 3]], qc.c[[0, 3]], x.double(), alpha, gamma, theta)
    z = (q.mean(1) - want).abs() / (q.std(1) / math.sqrt(R))
    assert float(z.max()) < z_bonferroni(z.numel())


def test_theorem1_exact_when_the_batch_covers_the_data():
    qc = clients(seed=3)
    theta, gamma, alpha = Theta.of([2.0, 1.0, 0.0, 0.5]), 0.05, 0.3
    x = torch.randn(4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    want = S.surrogate_grad(qc.A, qc.c, x, alpha, gamma, theta)
    exact = QuadraticLocalUpdate(theta=theta, gamma=gamma, alpha=alpha).client_updates(
        qc, torch.arange(qc.num_clients), x)
    assert torch.allclose(exact, want, atol=1e-12)
    # engine path: one example per client, so every minibatch is the client's whole data
    eng = LocalUpdate(QuadraticModel(4), theta=theta, gamma=gamma, alpha=alpha, batch_size=3).client_updates(
        {"x": x.float()}, qc.to_federated(), torch.arange(qc.num_clients), torch.Generator().manual_seed(0))
    assert torch.allclose(eng["x"].double(), want, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------------ Theorem 2
@pytest.mark.parametrize("K", [1, 3])
def test_theorem2_maml_gradient_is_surrogate_gradient_with_theta_2k_plus_1(K):
    qc = clients(seed=4, d=3)
    gamma = 0.06
    x = torch.tensor([0.3, -1.2, 0.8])
    q = MAML(QuadraticModel(3), inner_steps=K, gamma=gamma, batch_size=2).client_updates(
        {"x": x}, qc.to_federated(), torch.arange(qc.num_clients), torch.Generator().manual_seed(0))["x"]
    want = S.surrogate_grad(qc.A, qc.c, x.double(), 0.0, gamma, maml_theta(K))
    assert torch.allclose(q.double(), want, atol=1e-4, rtol=1e-4)
    # and it is not the FOMAML (Theta_{K+1}) gradient
    fo = S.surrogate_grad(qc.A, qc.c, x.double(), 0.0, gamma, S.theta_K(K + 1))
    assert (q.double() - fo).abs().max() > 1e-2


# ------------------------------------------------------- central claim: converges to x*(alpha, gamma, Theta)
@pytest.mark.parametrize("theta,gamma,alpha", [(S.theta_1_to_K(10), 0.05, 0.0), (S.theta_1_to_K(5), 0.05, 1.0),
                                               (S.theta_K(4), 0.02, 0.0)])
def test_local_update_converges_to_surrogate_minimizer_not_to_x_star(theta, gamma, alpha):
    qc = clients(seed=5, C=2.0)
    mu_t = float((S.distortion_eigenvalues(torch.linalg.eigvalsh(qc.A), alpha, gamma, theta)
                  * torch.linalg.eigvalsh(qc.A)).min(-1).values.mean())
    L_t = float((S.distortion_eigenvalues(torch.linalg.eigvalsh(qc.A), alpha, gamma, theta)
                 * torch.linalg.eigvalsh(qc.A)).max(-1).values.mean())
    kap = L_t / mu_t
    assert abs(kap - float(S.kappa(qc.A, alpha, gamma, theta))) < 1e-9
    T = 300
    xs = QuadraticLocalUpdate(theta=theta, gamma=gamma, alpha=alpha,
                              server_opt=ServerOpt.tuned("gd", mu_t, L_t)).run(qc, torch.zeros(4), T)
    x_sur = S.surrogate_minimizer(qc.A, qc.c, alpha, gamma, theta)
    x_star = qc.minimizer()
    assert float((xs[-1] - x_sur).norm()) < 1e-8
    gap = float((x_sur - x_star).norm())
    assert gap > 1e-3  # gamma K > 0: a different point
    assert float((xs[-1] - x_star).norm()) > 0.9 * gap
    # Theorem 3 (gd) and Corollary 1 at every round, with kappa bounds (11)/(13) for Delta
    rho = float(S.rate(kap, "gd"))
    d0 = float((xs[0] - x_sur).norm())
    errs = (xs - x_sur).norm(dim=1)
    assert bool((errs <= rho ** torch.arange(T + 1, dtype=torch.float64) * d0 * (1 + 1e-9) + 1e-12).all())
    kap_bound = (S.kappa_bound_sum if theta.kind == "sum" else S.kappa_bound_last)(1.0, 10.0, alpha, gamma, theta.K)
    bound = torch.tensor([S.corollary1_bound(t, float(S.rate(kap_bound, "gd")), d0, qc.C, float(kap_bound), 10.0)
                          for t in range(T + 1)], dtype=torch.float64)
    assert bool(((xs - x_star).norm(dim=1) <= bound).all())


def test_with_gamma_zero_local_update_converges_to_x_star():
    qc = clients(seed=6)
    lam = torch.linalg.eigvalsh(qc.A)
    K = 5  # FedSGD: Q = K I
    xs = QuadraticLocalUpdate(theta=S.theta_1_to_K(K), gamma=0.0,
                              server_opt=ServerOpt.tuned("gd", K * float(lam[:, 0].mean()),
                                                         K * float(lam[:, -1].mean()))).run(qc, torch.zeros(4), 300)
    assert float((xs[-1] - qc.minimizer()).norm()) < 1e-8


# ------------------------------------------------------------------------------------ Table 2
@pytest.mark.parametrize("kind", ["gd", "nesterov", "heavy_ball"])
@pytest.mark.parametrize("theta,gamma", [(S.theta_1_to_K(10), 0.002), (S.theta_K(3), 0.001)])
def test_measured_contraction_matches_table2_rate(kind, theta, gamma):
    # exact updates (batch covers the data), all clients every round, Table 2's tuned server step;
    # shared eigenvectors make kappa (eq. 9) the surrogate Hessian's condition number
    qc = clients(seed=7, n=5, d=6, shared=True, L=100.0)
    lam = torch.linalg.eigvalsh(qc.A)
    qa = S.distortion_eigenvalues(lam, 0.0, gamma, theta) * lam
    mu_t, L_t = float(qa.min(-1).values.mean()), float(qa.max(-1).values.mean())
    kap = float(S.kappa(qc.A, 0.0, gamma, theta))
    assert abs(float(S.kappa_of_hessian(qc.A, 0.0, gamma, theta)) / kap - 1) < 1e-9
    x0 = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3
    xs = QuadraticLocalUpdate(theta=theta, gamma=gamma, server_opt=ServerOpt.tuned(kind, mu_t, L_t)).run(qc, x0, 3000)
    err = (xs - S.surrogate_minimizer(qc.A, qc.c, 0.0, gamma, theta)).norm(dim=1)
    # window in the asymptotic regime, above round-off: [t_end / 2, t_end], err(t_end) ~ 1e-10 err(0)
    hi = int((err > 1e-10 * err[0]).nonzero().max())
    lo = hi // 2
    measured = float((err[hi] / err[lo]) ** (1.0 / (hi - lo)))
    rho = float(S.rate(kap, kind))
    assert hi - lo >= 20
    assert abs(measured / rho - 1) < 0.05, (measured, rho)


def test_table2_orders_the_server_optimizers():
    k = torch.tensor([2.0, 10.0, 100.0], dtype=torch.float64)
    gd, nes, hb = S.rate(k, "gd"), S.rate(k, "nesterov"), S.rate(k, "heavy_ball")
    assert bool((hb < nes).all() and (nes < gd).all())
    assert torch.allclose(gd, (k - 1) / (k + 1)) and torch.allclose(hb, (k.sqrt() - 1) / (k.sqrt() + 1))


# ----------------------------------------------------------------------------------- Lemmas 3-6
def test_kappa_bounds_eq11_and_eq13_hold():
    qc = clients(seed=8, n=8, d=5)
    mu, L = 1.0, 10.0
    for alpha in (0.0, 0.5, 5.0):
        for K in (1, 2, 10, 100):
            for frac in (0.1, 0.5, 0.95):
                g_sum = frac / (L + alpha)
                k = float(S.kappa(qc.A, alpha, g_sum, S.theta_1_to_K(K)))
                assert k <= float(S.kappa_bound_sum(mu, L, alpha, g_sum, K)) * (1 + 1e-12)
                assert k <= L / mu * (1 + 1e-12)
                assert float(S.kappa_of_hessian(qc.A, alpha, g_sum, S.theta_1_to_K(K))) <= k * (1 + 1e-12)
                g_last = frac / (K * L + alpha)
                k = float(S.kappa(qc.A, alpha, g_last, S.theta_K(K)))
                assert k <= float(S.kappa_bound_last(mu, L, alpha, g_last, K)) * (1 + 1e-12)


def test_kappa_bounds_are_tight_on_the_appendix_b3_client():
    mu, L = 1.0, 10.0
    A = torch.diag(torch.tensor([L, mu], dtype=torch.float64)).unsqueeze(0)
    for alpha, gamma, K in [(0.0, 0.05, 7), (1.0, 0.02, 30), (0.3, 0.08, 2)]:
        assert math.isclose(float(S.kappa(A, alpha, gamma, S.theta_1_to_K(K))),
                            float(S.kappa_bound_sum(mu, L, alpha, gamma, K)), rel_tol=1e-12)
        g = gamma / K
        assert math.isclose(float(S.kappa(A, alpha, g, S.theta_K(K))),
                            float(S.kappa_bound_last(mu, L, alpha, g, K)), rel_tol=1e-12)
    # kappa(Theta_1:K) = L/mu iff alpha = 0 and (gamma = 0 or K = 1)
    assert math.isclose(float(S.kappa_bound_sum(mu, L, 0.0, 0.0, 50)), L / mu, rel_tol=1e-12)
    assert math.isclose(float(S.kappa_bound_sum(mu, L, 0.0, 0.05, 1)), L / mu, rel_tol=1e-12)
    assert float(S.kappa_bound_sum(mu, L, 0.5, 0.0, 50)) == pytest.approx(L / mu)  # gamma = 0: Q = K I
    assert float(S.kappa_bound_sum(mu, L, 0.5, 0.05, 50)) < L / mu - 1e-3
    assert float(S.kappa_bound_sum(mu, L, 0.0, 0.05, 50)) < L / mu - 1e-3


def test_lemma5_lemma6_and_theorem4_bound_the_distance_between_minimizers():
    kappa0 = 10.0
    for seed in range(5):
        qc = clients(seed=20 + seed, n=6, d=3, C=1.5)
        x_star = qc.minimizer()
        lam = torch.linalg.eigvalsh(qc.A)
        for theta, gamma in [(S.theta_1_to_K(20), 0.08), (S.theta_K(5), 0.015), (Theta.of([1, 0, 3]), 0.05)]:
            gap = float((S.surrogate_minimizer(qc.A, qc.c, 0.0, gamma, theta) - x_star).norm())
            assert 0 < gap <= float(S.lemma5_bound(qc.A, 0.0, gamma, theta, qc.C))  # Lemma 5
            if theta.kind == "general":
                continue
            bound = (S.kappa_bound_sum if theta.kind == "sum" else S.kappa_bound_last)(1.0, kappa0, 0.0, gamma, theta.K)
            q = S.distortion_eigenvalues(lam, 0.0, gamma, theta)
            assert bool((q.max(-1).values / q.min(-1).values <= kappa0 / float(bound) * (1 + 1e-9)).all())  # Lemma 6
            assert gap <= 8 * qc.C * float(S.suboptimality(bound, kappa0))  # Theorem 4


# --------------------------------------------------------------------------------- frontiers
def test_simulated_maml_frontier_has_its_cusp_at_the_one_shot_delta():
    Ks = torch.unique(torch.logspace(0, 6, 1500, dtype=torch.float64).round())
    df = S.simulated_maml_frontier(1.0, 10.0, 100, alpha=0.0, gamma=1e-3, K=Ks,
                                   generator=torch.Generator().manual_seed(0))
    cusp = df.loc[df["rho"].idxmin()]
    target = S.one_shot_delta(1.0, 10.0)
    assert abs(target - 0.5195) < 1e-3
    assert abs(float(cusp["delta"]) - target) < 0.02
    # the FedAvg frontier meets the Delta axis there (K -> inf)
    fa = S.frontier(1.0, 10.0, alpha=0.0, gamma=1e-3, K=[1e6], theta="sum")
    assert float(fa["rho"].iloc[0]) < 1e-6 and abs(float(fa["delta"].iloc[0]) - target) < 1e-6


def test_frontier_values_are_in_the_unit_square_and_monotone_in_K():
    df = S.frontier(1.0, 50.0, alpha=0.0, gamma=0.01, K=torch.logspace(0, 6, 50), theta="sum",
                    server_opt=["gd", "nesterov", "heavy_ball"])
    assert df[["rho", "delta"]].stack().between(0, 1).all()
    for _, part in df.groupby("server_opt"):
        assert part["rho"].is_monotonic_decreasing and part["delta"].is_monotonic_increasing
    with pytest.raises(ValueError, match="theta"):
        S.frontier(1.0, 5.0, alpha=0.0, gamma=0.01, K=3, theta="middle")
