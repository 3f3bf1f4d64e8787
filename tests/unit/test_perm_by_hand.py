"""PERM checked line by line against the paper's Algorithms 1-3 on a problem small enough to follow by hand.

The problem: N = 4 clients, one scalar parameter w, client j's loss f_j(w) = mean_x (w - x)^2 / 2 over its
train points, so grad f_j(w) = w - m_j with m_j the client's mean. Client j holds n_j points
m_j - 1, m_j + 1 (n_j = 2) or m_j - 1, m_j - 1, m_j + 1, m_j + 1 (n_j = 4):

    m = (0, 1, 2, 4),   n = (2, 2, 4, 4).

Every step is full-batch (``batch_size=None``), so the only random draw is the epoch permutation
sigma_r, and one SGD step on client j with step s is the contraction

    w <- w - s (w - m_j) = (1 - s) w + s m_j.

The discrepancies D_ij = ||grad f_i(w) - grad f_j(w)||^2 = (m_i - m_j)^2 do not depend on w, so the
alpha of eq. (2) can be worked out by hand once (below, with lambda = 8).

Parameters and data are float64; every step size (eta alpha_ij N, gamma) is a dyadic rational, so
the float32 step sizes of ``engine.local_sgd`` are exact too. The expected values are computed in exact
rationals (``fractions.Fraction``) by a plain transcription of the paper's pseudo-code
(``_epoch_by_hand``) and compared exactly (first epoch) or to 1e-12 (later epochs, where the
rationals outgrow 53 bits); a few are written out by hand in the comments.

What the paper says and the implementation does (each test names the line it checks):
* Alg. 1, ``i_j = sigma_r((i + j) mod N)`` for j = 1..N: the implementation's shuffle step
  ``step = 0..N-1`` sends model i to ``sigma((i + step) mod N)``. The paper's j = step + 1, so the
  visit *sequence* of a fixed sigma is the paper's rotated by one position (model i starts on sigma(i),
  the paper's on sigma(i + 1)); the set of visits per epoch (every client once) and, since sigma is a
  uniform random permutation, the distribution of the whole schedule are the same
  (``test_alg1_visit_order``).
* Alg. 1, SGD-Update: v <- v - eta alpha_i(j) N grad f_j(v): checked exactly (``test_alg1_one_epoch_by_hand``).
* Alg. 1/2 ``P_W`` (projection onto a bounded set W) and the output step
  v_hat = P_W(v^R - (1/L) grad Phi(alpha, v^R)) are analysis devices (W and L are unknown in practice);
  the implementation has neither (W = R^d, and it outputs v^R as Alg. 4 of the appendix does).
  Not a test; stated here.
* Alg. 2: after each epoch, one global step w <- w - gamma (1/N) sum_i grad f_i(w) (the implementation
  uses full client gradients when ``alpha_samples=None``, i.e. M = n_i), then T_alpha projected-GD
  steps on g_i(w^{r+1}, .) from the current alpha (``test_alg2_two_epochs_by_hand``).
* Precision (not in the paper): ``shuffle_steps`` forms eta * N * alpha_ij from alpha cast to float32,
  so a non-dyadic alpha enters the step rounded to float32 (relative 6e-8); the reference does the same.
* Alg. 3: FedAvg rounds (K steps at lr gamma, plain average), then alpha from the final w
  (``test_alg3_warmup_then_alpha_estimate``).
"""
from fractions import Fraction as Fr

import pytest
import torch
from torch import nn

from pflkit.algorithms.perm import PERM, projected_gd, shuffle_clients, shuffle_steps, water_filling
from pflkit.data.federated import FederatedDataset
from pflkit.engine import FunctionalModel, make_generator

N = 4
MEANS = (0, 1, 2, 4)
SIZES = (2, 2, 4, 4)
LAM = 8.0


class _Scalar(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))


class Quadratic(FunctionalModel):
    """f(w; x) = (w - x)^2 / 2 (labels unused); the parameter starts at w = 0 for every seed."""

    def __init__(self):
        super().__init__(_Scalar)

    def init(self, seed):
        return {"w": torch.zeros(1, dtype=torch.float64)}

    def loss(self, params, x, y):
        return 0.5 * ((params["w"] - x[..., 0]) ** 2).mean()

    def _masked_loss(self, params, x, y, mask):
        m = mask.to(x.dtype)
        return (0.5 * (params["w"] - x[..., 0]) ** 2 * m).sum() / m.sum()

    def _masked_stats(self, params, x, y, mask):
        m = mask.to(x.dtype)
        return (0.5 * (params["w"] - x[..., 0]) ** 2 * m).sum(), torch.zeros((), dtype=x.dtype)


def _data() -> FederatedDataset:
    def points(m, n):
        xs = [m - 1.0, m + 1.0] * (n // 2)
        return torch.tensor(xs, dtype=torch.float64).reshape(-1, 1), torch.zeros(n, dtype=torch.long)
    train = [points(m, n) for m, n in zip(MEANS, SIZES)]
    test = [points(m, 2) for m in MEANS]
    return FederatedDataset.from_client_arrays(train, test, num_classes=1, name="quadratic-by-hand")


def _w(params) -> list[float]:
    return [float(x) for x in params["w"].reshape(-1)]


# ------------------------------------------------------------------ exact transcription of the paper
def _sgd_update(v: Fr, eta: Fr, j: int, K: int, alpha_i: list[Fr]) -> Fr:
    """Alg. 1 SGD-Update: K times v <- v - eta alpha(j) N grad f_j(v), grad f_j(v) = v - m_j."""
    for _ in range(K):
        v = v - eta * alpha_i[j] * N * (v - MEANS[j])
    return v


def _epoch_by_hand(v: list[Fr], sigma: list[int], eta: Fr, K: int, alpha: list[list[Fr]]) -> list[Fr]:
    """One epoch of Alg. 1 with the implementation's indexing (shuffle step 0..N-1, see the module doc)."""
    v = list(v)
    for step in range(N):
        for i in range(N):
            v[i] = _sgd_update(v[i], eta, sigma[(i + step) % N], K, alpha[i])
    return v


# alpha of eq. (2) by hand, lambda = 8. Row 0: D_0j = (m_0 - m_j)^2 = (0, 1, 4, 16); row 3: (16, 9, 4, 0).
# One projected-GD step from uniform a = 1/4 with the step 1/L = n_min / (2 lambda) = 1/8:
#   a_j - (D_0j + 2 lambda a_j / n_j) / 8 = -D_0j/8 (n_j = 2), 1/8 - D_0j/8 (n_j = 4)
#   row 0: v = (0, -1/8, -3/8, -15/8); simplex projection: support {0, 1, 2}, theta = (0 - 1/8 - 3/8 - 1)/3
#          = -1/2, a = (1/2, 3/8, 1/8, 0)
#   row 3: v = (-2, -9/8, -3/8, 1/8); support {2, 3}, theta = (-3/8 + 1/8 - 1)/2 = -5/8, a = (0, 0, 1/4, 3/4)
GD1_ROW0 = [0.5, 0.375, 0.125, 0.0]
GD1_ROW3 = [0.0, 0.0, 0.25, 0.75]
# Exact minimiser (water filling): a_j = max(0, (tau - D_0j) n_j / (2 lambda)), c = n/16 = (1/8, 1/8, 1/4, 1/4);
# support {0, 1, 2}: tau = (1 + sum c_j D_0j) / sum c_j = (1 + 1/8 + 1) / (1/2) = 17/4 (> D_02 = 4, < D_03 = 16)
#   row 0: a = (17/4 / 8, 13/4 / 8, 1/4 / 4, 0) = (17/32, 13/32, 1/16, 0)
EXACT_ROW0 = [17 / 32, 13 / 32, 1 / 16, 0.0]


def _discrepancies():
    return torch.tensor([[float((a - b) ** 2) for b in MEANS] for a in MEANS], dtype=torch.float64)


def test_eq2_alpha_by_hand():
    d, n = _discrepancies(), torch.tensor(SIZES, dtype=torch.float64)
    gd = projected_gd(d, n, LAM, steps=1)
    assert gd[0].tolist() == GD1_ROW0 and gd[3].tolist() == GD1_ROW3
    assert water_filling(d, n, LAM)[0].tolist() == pytest.approx(EXACT_ROW0, abs=1e-15)


def test_alg1_visit_order():
    """Shuffle step `step` sends model i to sigma((i + step) mod N); the paper's j = step + 1."""
    sigma = torch.tensor([2, 0, 3, 1])
    # step 0: model 0 -> sigma(0) = 2, model 1 -> sigma(1) = 0, model 2 -> sigma(2) = 3, model 3 -> sigma(3) = 1
    assert shuffle_clients(sigma, 0).tolist() == [2, 0, 3, 1]
    # step 1: model i -> sigma(i + 1): (0, 3, 1, 2); step 3: model i -> sigma(i + 3) = (1, 2, 0, 3)
    assert shuffle_clients(sigma, 1).tolist() == [0, 3, 1, 2]
    assert shuffle_clients(sigma, 3).tolist() == [1, 2, 0, 3]
    impl = [[int(shuffle_clients(sigma, step)[i]) for step in range(N)] for i in range(N)]
    paper = [[int(sigma[(i + j) % N]) for j in range(1, N + 1)] for i in range(N)]
    for i in range(N):  # the same visits, rotated by one position
        assert impl[i][1:] + impl[i][:1] == paper[i]
        assert sorted(impl[i]) == list(range(N))


def test_alg1_one_epoch_by_hand():
    """Four shuffle steps (one epoch), K = 2, eta = 1/8, a hand-chosen sparse alpha (some visits are
    no-ops: alpha_ij = 0) and a fixed sigma."""
    model, data = Quadratic(), _data()
    sigma = torch.tensor([2, 0, 3, 1])
    alpha = torch.tensor([[0.5, 0.25, 0.25, 0.0],
                          [0.0, 1.0, 0.0, 0.0],
                          [0.25, 0.25, 0.25, 0.25],
                          [0.0, 0.0, 0.5, 0.5]], dtype=torch.float64)
    v0 = [1.0, 2.0, -1.0, 3.0]
    v = {"w": torch.tensor(v0, dtype=torch.float64).reshape(N, 1)}
    # step 0 by hand: model 0 on client 2, s = eta alpha_02 N = 1/8 * 1/4 * 4 = 1/8:
    #   w = 1 -> 1 - (1 - 2)/8 = 9/8 -> 9/8 - (9/8 - 2)/8 = 79/64.
    # model 1 on client 0: alpha_10 = 0, s = 0, w stays 2. model 2 on client 3: s = 1/8, -1 -> -1 + 5/8 = -3/8
    #   -> -3/8 + (4 + 3/8)/8 = 11/64. model 3 on client 1: alpha_31 = 0, stays 3.
    after0 = shuffle_steps(model, v, data, alpha, sigma, 0, local_steps=2, lr=0.125, batch_size=None,
                           generator=make_generator(0))
    assert _w(after0) == [79 / 64, 2.0, 11 / 64, 3.0]
    got = v
    for step in range(N):
        got = shuffle_steps(model, got, data, alpha, sigma, step, local_steps=2, lr=0.125, batch_size=None,
                            generator=make_generator(step))
    want = _epoch_by_hand([Fr(x) for x in v0], sigma.tolist(), Fr(1, 8), 2,
                          [[Fr(float(a)) for a in row] for row in alpha])
    assert _w(got) == [float(x) for x in want]
    # model 1 (alpha = e_1) moved only on its visit to client 1 (s = 1/2, twice): 2 -> 3/2 -> 5/4
    assert _w(got)[1] == 1.25


def _alg2(warmup_rounds=0, **kw):
    return PERM(Quadratic(), local_steps=2, lr=0.125, batch_size=None, lam=LAM, alpha_solver="gd", alpha_steps=1,
                global_lr=0.5, global_steps=1, warmup_rounds=warmup_rounds, alpha_init="uniform",
                update_every="epoch", **kw)


def test_alg2_two_epochs_by_hand():
    """Alg. 2 from w^0 = v_i^0 = 0, uniform alpha: epoch 1 (4 rounds) with alpha = 1/4, then
    w^1 = w^0 - gamma (w^0 - mean m) and alpha^1 = one GD step on g_i(w^1, .); epoch 2 with alpha^1."""
    algo, data = _alg2(), _data()
    s = algo.init(data, seed=3)
    sig = torch.randperm(N, generator=torch.Generator().manual_seed(3))  # the only draw of this seed
    w0 = Fr(0)
    v = [w0] * N
    alpha = [[Fr(1, 4)] * N for _ in range(N)]
    for _ in range(N - 1):
        s = algo.round(s)
        assert s.w["w"].item() == 0.0  # no global update inside the epoch
    s = algo.round(s)  # the epoch's last round, then w and alpha
    v = _epoch_by_hand(v, sig.tolist(), Fr(1, 8), 2, alpha)
    assert _w(s.v) == [float(x) for x in v]
    # global step: w^1 = 0 - 1/2 (0 - 7/4) = 7/8 (mean m = 7/4, full client gradients)
    assert s.w["w"].item() == 0.875
    assert s.alpha[0].tolist() == GD1_ROW0 and s.alpha[3].tolist() == GD1_ROW3
    # epoch 2: a new permutation (second draw), personal steps with alpha^1 (model 0: s = alpha/2)
    sig2 = torch.Generator().manual_seed(3)
    torch.randperm(N, generator=sig2)
    sig2 = torch.randperm(N, generator=sig2)
    # alpha^1 rows 0, 1, 3 are dyadic (row 1 = (1/4, 3/8, 3/8, 0)); row 2 = (0, 1/3, 7/12, 1/12) is not, and
    # shuffle_steps scales the step with alpha cast to float32 (lr * N * alpha.float()): so does the reference
    alpha1 = [[Fr(float(a)) for a in row] for row in s.alpha.float()]
    assert s.alpha[1].tolist() == [0.25, 0.375, 0.375, 0.0]
    assert s.alpha[2].tolist() == pytest.approx([0, 1 / 3, 7 / 12, 1 / 12], abs=1e-15)
    for _ in range(N):
        s = algo.round(s)
    v = _epoch_by_hand(v, sig2.tolist(), Fr(1, 8), 2, alpha1)
    assert _w(s.v) == pytest.approx([float(x) for x in v], abs=1e-12)
    assert s.w["w"].item() == pytest.approx(0.875 - 0.5 * (0.875 - 1.75), abs=0)  # w^2 = 21/16


def test_alg2_update_every_rounds_changes_alpha_inside_an_epoch():
    """update_every = 2 (< N): the global step and alpha update come every 2 rounds, so the second
    half of the epoch already uses the new alpha (not the paper's Alg. 2, which updates per epoch;
    params.yaml's perm_fig4 uses update_every: 10 with N = 50)."""
    algo, data = _alg2(), _data()
    algo.update_every = 2
    s = algo.init(data, seed=3)
    s = algo.round(algo.round(s))
    assert s.shuffle_round == 2 and s.alpha[0].tolist() == GD1_ROW0 and s.w["w"].item() == 0.875


def test_alg3_warmup_then_alpha_estimate():
    """Alg. 3: R = 1 FedAvg round (K = 2 steps at gamma = 1/2 from w = 0, plain average), then alpha at w^R.
    Client j: 0 -> m_j/2 -> 3 m_j/4; average 3/4 * 7/4 = 21/16. Then two-stage PERM (update_every=None)
    starts every v_i at w^R with alpha = the exact minimiser (row 0 = 17/32, 13/32, 1/16, 0)."""
    data = _data()
    algo = PERM(Quadratic(), local_steps=2, lr=0.125, batch_size=None, lam=LAM, alpha_solver="exact",
                warmup_rounds=1, warmup_lr=0.5, alpha_init="estimate", update_every=None)
    s = algo.init(data, seed=0)
    assert s.v is None
    s = algo.round(s)
    assert s.w["w"].item() == 21 / 16
    assert _w(s.v) == [21 / 16] * N
    assert s.alpha[0].tolist() == pytest.approx(EXACT_ROW0, abs=1e-15)
    assert _w(algo.personalized(s)) == [21 / 16] * N
    # then Alg. 1 with this fixed alpha; w never moves again (two-stage: no global update)
    sig = torch.Generator().manual_seed(0)
    sig = torch.randperm(N, generator=sig)
    alpha = [[Fr(float(a)) for a in row] for row in s.alpha.float()]  # the step uses alpha in float32
    for _ in range(N):
        s = algo.round(s)
    want = _epoch_by_hand([Fr(21, 16)] * N, sig.tolist(), Fr(1, 8), 2, alpha)
    assert _w(s.v) == pytest.approx([float(x) for x in want], abs=1e-12)
    assert s.w["w"].item() == 21 / 16 and s.alpha[0].tolist() == pytest.approx(EXACT_ROW0, abs=1e-15)


def test_warmup_personalized_models_are_the_global_model():
    """During warm-up there is no personalization: every client's model is w (Fig. 2's 10 rounds)."""
    algo, data = _alg2(warmup_rounds=2, warmup_lr=0.5), _data()
    s = algo.round(algo.init(data, 0))
    assert s.v is None and _w(algo.personalized(s)) == [21 / 16] * N
    s = algo.round(s)  # second warm-up round: 21/16 -> client j: m_j + (21/16 - m_j)/4; average
    want = Fr(7, 4) + (Fr(21, 16) - Fr(7, 4)) / 4
    assert s.w["w"].item() == float(want) and _w(s.v) == [float(want)] * N
    assert s.alpha.tolist() == [[0.25] * N] * N and s.shuffle_round == 0
