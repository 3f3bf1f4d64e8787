"""Alone / WGA / BC / bias oracle (Chayti et al.): the batched code against its loop twin, the exact
reductions between methods, and the variance reduction (1 - a)^2 + a^2 / N measured over runs."""
import math

import pytest
import torch

from pflkit.algorithms.collaborative import BC, WGA, Alone, BiasOracleBC, autograd_oracle, run, tune_step_size
from pflkit.data.quadratic import NoisyQuadraticUsers
from pflkit.theory import speedup as theory

from reference.collaborative import collaborative_losses


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def tiny():
    return NoisyQuadraticUsers(n_collaborators=3, sigma=0.7, zeta=[1.5, -0.5], dim=2, curvature=[1.0, 0.4])


@pytest.mark.parametrize("name, method, kw", [
    ("Alone", lambda u: Alone(), {}),
    ("WGA", lambda u: WGA(0.6), dict(a=0.6)),
    ("BC", lambda u: BC(0.8, 0.1, c0=0.25), dict(a=0.8, b=0.1, c0=0.25)),
    ("Bias oracle", lambda u: BiasOracleBC(u.bias, 0.7, s_b=0.5), dict(a=0.7, s_b=0.5)),
])
def test_vectorized_runs_equal_the_loop_over_runs_for_the_same_seed(name, method, kw):
    users, runs, steps, eta, seed = tiny(), 4, 25, 0.2, 7
    result = run(method(users), users, users.start([1.0, -2.0], runs), steps=steps, eta=eta,
                 generator=gen(seed), loss=users.loss)
    ref = torch.tensor(collaborative_losses(name, users, [1.0, -2.0], runs=runs, steps=steps, eta=eta,
                                            seed=seed, **kw), dtype=torch.float64).T
    assert result.losses.shape == (steps + 1, runs)
    torch.testing.assert_close(result.losses, ref, rtol=1e-12, atol=1e-14)
    assert result.losses[-1].std() > 0  # runs really differ


def test_wga_with_zero_weight_is_alone_exactly():
    users = tiny()
    x0 = users.start([1.0, 1.0], 8)
    alone = run(Alone(), users, x0, steps=200, eta=0.1, generator=gen(3), loss=users.loss)
    wga = run(WGA(0.0), users, x0, steps=200, eta=0.1, generator=gen(3), loss=users.loss)
    assert torch.equal(alone.x, wga.x) and torch.equal(alone.losses, wga.losses)
    other = run(WGA(0.3), users, x0, steps=200, eta=0.1, generator=gen(3))
    assert not torch.equal(alone.x, other.x)


def test_bc_without_correction_is_wga_exactly():
    users = tiny()
    x0 = users.start([1.0, 1.0], 8)
    wga = run(WGA(0.7), users, x0, steps=200, eta=0.1, generator=gen(4), loss=users.loss)
    bc = run(BC(0.7, b=0.0, c0=0.0), users, x0, steps=200, eta=0.1, generator=gen(4), loss=users.loss)
    assert torch.equal(wga.x, bc.x) and torch.equal(wga.losses, bc.losses)
    corrected = run(BC(0.7, b=0.05), users, x0, steps=200, eta=0.1, generator=gen(4))
    assert not torch.equal(wga.x, corrected.x)


def test_per_run_hyperparameters_equal_separate_runs():
    """A batch whose runs carry different (eta, a) equals running each setting on its own rows."""
    users = NoisyQuadraticUsers(4, 1.0, 2.0)
    etas = torch.tensor([0.05, 0.2], dtype=torch.float64)
    weights = torch.tensor([0.3, 0.9], dtype=torch.float64)
    both = run(WGA(weights.repeat_interleave(3)), users, users.start(1.0, 6), steps=50,
               eta=etas.repeat_interleave(3), generator=gen(5), loss=users.loss)
    # rebuild the same draws: the oracle draws [6, N+1, 1] each step whatever the hyperparameters
    for rows, eta, a in ((slice(0, 3), 0.05, 0.3), (slice(3, 6), 0.2, 0.9)):
        ref = torch.tensor(collaborative_losses("WGA", users, [1.0], runs=6, steps=50, eta=eta, seed=5, a=a),
                           dtype=torch.float64).T
        torch.testing.assert_close(both.losses[:, rows], ref[:, rows], rtol=1e-12, atol=1e-14)


def test_autograd_oracle_matches_the_analytic_quadratic_gradients():
    users = tiny()
    h = users.curvatures

    def sample_losses(xs, generator):  # f_i(x; xi) = 1/2 sum_k h_k (x_k - xi_k)^2, one draw per run and user
        xi = users.sample(xs.shape[0], generator)
        return 0.5 * (h * (xs - xi) ** 2).sum(-1)

    oracle = autograd_oracle(sample_losses, n_users=4)
    x = torch.randn(5, 2, generator=gen(1), dtype=torch.float64)
    torch.testing.assert_close(oracle(x, gen(9)), users(x, gen(9)), rtol=1e-12, atol=1e-12)
    a = run(BC(0.8, 0.1), oracle, users.start([1.0, 1.0], 3), steps=30, eta=0.1, generator=gen(2))
    b = run(BC(0.8, 0.1), users, users.start([1.0, 1.0], 3), steps=30, eta=0.1, generator=gen(2))
    torch.testing.assert_close(a.x, b.x, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("a", [0.5, 0.9])
def test_zero_bias_collaboration_reduces_variance_by_the_predicted_factor(a):
    """zeta = 0: at stationarity Var(x) of WGA / Var(x) of Alone = (1 - a)^2 + a^2 / N exactly (same eta);
    BC with a slow EMA (b << eta) is within 2% of it. E[x] = 0 here, so Var(x) = 2 E[loss]; each run's loss
    is averaged over 5 stationary records (40 steps apart), then mean and SE over 5000 independent runs;
    the measured ratios must match within 4 combined standard errors."""
    n, runs, eta, burn_in, every = 10, 5000, 0.1, 120, 40
    users = NoisyQuadraticUsers(n, 1.0, 0.0)
    x0 = users.start(0.0, runs)
    stats = {}
    for seed, (name, method) in enumerate((("Alone", Alone()), ("WGA", WGA(a)), ("BC", BC(a, b=1e-4)))):
        result = run(method, users, x0, steps=burn_in + 4 * every, eta=eta, generator=gen(11 + seed),
                     loss=users.loss, record_every=every)
        per_run = result.losses[result.steps >= burn_in].mean(0)
        stats[name] = (float(per_run.mean()), float(per_run.std()) / runs ** 0.5)

    def ratio(name):
        (m, s), (m0, s0) = stats[name], stats["Alone"]
        return m / m0, math.hypot(s / m, s0 / m0)

    predicted = theory.variance_reduction(a, n)
    wga, wga_rel_se = ratio("WGA")
    assert abs(math.log(wga / predicted)) < 4 * wga_rel_se
    common = dict(steps=burn_in + 4 * every, eta=eta, N=n, sigma=1.0, zeta=0.0, x0=0.0, record_every=every)
    keep = slice(burn_in // every, None)  # records at steps >= burn_in
    exact_bc = theory.expected_loss(a=a, b=1e-4, **common)[keep].mean() / theory.expected_loss(**common)[keep].mean()
    assert abs(exact_bc / predicted - 1) < 0.02
    bc, bc_rel_se = ratio("BC")
    assert abs(math.log(bc / exact_bc)) < 4 * bc_rel_se
    assert wga_rel_se < 0.03 and wga < 0.5


def test_bias_oracle_reaches_its_exact_floor():
    """Thm. 2: with a bias oracle, BC's floor does not depend on zeta; matches the exact expectation."""
    runs, eta = 4000, 0.05
    for zeta in (1.0, 50.0):
        users = NoisyQuadraticUsers(10, 1.0, zeta)
        result = run(BiasOracleBC(users.bias, 0.9, s_b=1.0), users, users.start(0.0, runs), steps=300, eta=eta,
                     generator=gen(int(zeta)), loss=users.loss)
        floor = theory.stationary_loss(eta=eta, N=10, sigma=1.0, zeta=zeta, a=0.9, s_b=1.0)
        se = float(result.losses[-1].std()) / runs ** 0.5
        assert abs(float(result.losses[-1].mean()) - floor) < 4 * se
        assert floor < 0.2 * theory.stationary_loss(eta=eta, N=10, sigma=1.0)  # far below Alone's


def test_run_records_every_k_steps_and_the_last_one():
    users = tiny()
    result = run(BC(0.5, 0.1), users, users.start([1.0, 0.0], 3), steps=20, eta=0.1, generator=gen(), loss=users.loss,
                 record_every=7)
    assert result.steps.tolist() == [0, 7, 14, 20] and result.losses.shape == (4, 3)
    full = run(BC(0.5, 0.1), users, users.start([1.0, 0.0], 3), steps=20, eta=0.1, generator=gen(), loss=users.loss)
    torch.testing.assert_close(result.losses, full.losses[[0, 7, 14, 20]], rtol=0, atol=0)
    frame = result.frame()
    assert list(frame.columns) == ["step", "run", "loss"] and len(frame) == 12
    assert frame.loc[(frame["step"] == 20) & (frame["run"] == 2), "loss"].item() == float(result.losses[-1, 2])


def test_tune_step_size_batches_the_grid_and_picks_the_best():
    users = NoisyQuadraticUsers(5, 1.0, 1.0)
    best, table = tune_step_size(Alone, users, users.start(1.0, 200), [0.001, 0.01, 0.1, 0.5], steps=1000,
                                 generator=gen(0), loss=users.loss)
    exact = [theory.expected_loss(steps=1000, eta=e, N=5, sigma=1.0, x0=1.0)[-1] for e in table["eta"]]
    assert best == 0.01 == table["eta"][int(min(range(4), key=lambda i: exact[i]))]
    assert list(table["runs"]) == [200] * 4
    assert ((table["final_loss"] - exact).abs() < 5 * table["se"]).all()


@pytest.mark.parametrize("kwargs, match", [
    (dict(eta=0.0), "eta"), (dict(eta=-1.0), "eta"), (dict(steps=-1), "steps"), (dict(record_every=0), "record_every"),
])
def test_bad_run_arguments_raise(kwargs, match):
    users = tiny()
    args = dict(steps=5, eta=0.1, generator=gen(), record_every=1) | kwargs
    with pytest.raises(ValueError, match=match):
        run(Alone(), users, users.start([0.0, 0.0], 2), **args)


@pytest.mark.parametrize("method, match", [(WGA(1.5), "a must lie"), (BC(0.5, b=-0.1), "b must lie"),
                                           (WGA(torch.tensor([0.1, 0.2, 0.3])), r"shape \[2\]"),
                                           (BC(0.5, 0.1, c0=float("nan")), "c0")])
def test_bad_weights_raise(method, match):
    users = tiny()
    with pytest.raises(ValueError, match=match):
        run(method, users, users.start([0.0, 0.0], 2), steps=5, eta=0.1, generator=gen())


def test_bad_problem_values_raise():
    with pytest.raises(ValueError, match="n_collaborators"):
        NoisyQuadraticUsers(0)
    with pytest.raises(ValueError, match="curvature"):
        NoisyQuadraticUsers(2, curvature=0.0)
    with pytest.raises(ValueError, match="zeta"):
        NoisyQuadraticUsers(2, zeta=[1.0, 2.0], dim=3)
    with pytest.raises(ValueError, match="sigma"):
        NoisyQuadraticUsers(2, sigma=-1.0)
    with pytest.raises(ValueError, match="n_users"):
        autograd_oracle(lambda x, g: x.sum(-1), n_users=1)


def test_quadratic_users_moments_and_constants():
    users = NoisyQuadraticUsers(n_collaborators=50, sigma=2.0, zeta=[3.0, -1.0], dim=2, curvature=[2.0, 0.5])
    xi = users.sample(4000, gen(0))
    assert xi.shape == (4000, 51, 2)
    torch.testing.assert_close(xi[:, 0].mean(0), torch.zeros(2, dtype=torch.float64), atol=0.15, rtol=0)
    torch.testing.assert_close(xi[:, 1:].mean((0, 1)), torch.tensor([3.0, -1.0], dtype=torch.float64),
                               atol=0.02, rtol=0)
    assert abs(float((xi - xi.mean(0)).std()) - 2.0) < 0.02
    assert users.mu == 0.5 and users.smoothness == 2.0
    assert users.zeta_sq == pytest.approx(6.0 ** 2 + 0.5 ** 2)
    assert users.sigma_sq == pytest.approx((4.0 + 0.25) * 4.0)
    x = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    assert float(users.loss(x)) == pytest.approx(0.5 * (2.0 * 1 + 0.5 * 4))
    g = users(x.expand(20000, 2), gen(1))
    torch.testing.assert_close(g[:, 1:].mean((0, 1)) - g[:, 0].mean(0), users.bias(x)[0], atol=0.06, rtol=0)
