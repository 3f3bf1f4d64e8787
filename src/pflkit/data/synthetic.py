"""PERM's synthetic two-group data (Deng et al., Section 5 / Fig. 1).

N clients, ``samples_per_client`` samples each, d features. Clients 0..N/2-1 draw
x ~ N(mu_1, Sigma), the rest x ~ N(mu_2, Sigma), with mu_1 = +0.2 and mu_2 = -0.2 in every
coordinate and Sigma diagonal, Sigma_kk = k^-1.2 (k = 1..d). One labelling vector
w ~ N(mu_w = 0.1, I) is shared: the first group labels y = sign(w.x), the second y = sign(-w.x).
Labels are stored as classes {0, 1} (1 = positive sign).
"""
from __future__ import annotations

import numpy as np

from .federated import FederatedDataset


def perm_synthetic_arrays(num_clients: int = 50, samples_per_client: int = 500, dim: int = 60,
                          mu: float = 0.2, mu_w: float = 0.1, cov_exponent: float = 1.2, seed: int = 0):
    """Return x [N, n, d], y [N, n] (0/1), group [N] and the labelling vector w [d]."""
    if num_clients < 2:
        raise ValueError(f"num_clients must be >= 2 (two groups), got {num_clients!r}")
    if samples_per_client < 2:
        raise ValueError(f"samples_per_client must be >= 2, got {samples_per_client!r}")
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim!r}")
    rng = np.random.default_rng(seed)
    std = np.arange(1, dim + 1, dtype=np.float64) ** (-cov_exponent / 2)
    group = (np.arange(num_clients) >= num_clients // 2).astype(np.int64)
    means = np.where(group == 0, mu, -mu)[:, None, None]
    x = means + rng.standard_normal((num_clients, samples_per_client, dim)) * std
    w = mu_w + rng.standard_normal(dim)
    sign = np.where(group == 0, 1.0, -1.0)[:, None]
    y = ((sign * (x @ w)) > 0).astype(np.int64)
    return x.astype(np.float32), y, group, w


def perm_synthetic(num_clients: int = 50, samples_per_client: int = 500, dim: int = 60,
                   test_fraction: float = 0.2, seed: int = 0, **kwargs) -> FederatedDataset:
    """The Fig. 1 federation; the last ``test_fraction`` of each client's samples is its test split."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    x, y, group, _ = perm_synthetic_arrays(num_clients, samples_per_client, dim, seed=seed, **kwargs)
    return perm_synthetic_from_arrays(x, y, group, test_fraction)


def perm_synthetic_from_arrays(x: np.ndarray, y: np.ndarray, group: np.ndarray,
                               test_fraction: float = 0.2) -> FederatedDataset:
    """The federation of :func:`perm_synthetic_arrays`' x [N, S, d], y [N, S], group [N] (what a prepared
    copy stores): the last ``test_fraction`` of each client's samples is its test split."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    num_clients, samples_per_client = y.shape
    n_test = max(1, int(round(test_fraction * samples_per_client)))
    train = [(x[j, :-n_test], y[j, :-n_test]) for j in range(num_clients)]
    test = [(x[j, -n_test:], y[j, -n_test:]) for j in range(num_clients)]
    return FederatedDataset.from_client_arrays(train, test, 2, "perm-synthetic", groups=group)
