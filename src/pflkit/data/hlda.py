"""Hierarchical latent Dirichlet allocation split (Reddi et al. 2021, the federated CIFAR-100 of
TensorFlow Federated; Charles & Konecny App. E.1).

Each client draws a distribution over coarse labels from Dirichlet(alpha) and, for every coarse
label, a distribution over its fine labels from Dirichlet(beta). Its samples are then drawn one by
one without replacement from the pool: a coarse label from the client's coarse distribution, a fine
label within it, then a random remaining image of that fine label. When a fine label runs out it is
removed from every client's distributions (renormalised); a coarse label with no fine label left is
removed likewise. TFF's CIFAR-100: 500 clients x 100 images, alpha = 0.1, beta = 10.
"""
from __future__ import annotations

import numpy as np


def hierarchical_lda(fine: np.ndarray, coarse: np.ndarray, num_clients: int, samples_per_client: int,
                     alpha: float = 0.1, beta: float = 10.0, seed: int = 0) -> list[np.ndarray]:
    """-> one index array per client (each ``samples_per_client`` long, disjoint)."""
    fine, coarse = np.asarray(fine), np.asarray(coarse)
    if fine.shape != coarse.shape or fine.ndim != 1:
        raise ValueError(f"fine and coarse must be 1-D label arrays of one length, got {fine.shape} and "
                         f"{coarse.shape}")
    for name, v in (("alpha", alpha), ("beta", beta)):
        if not v > 0:
            raise ValueError(f"{name} must be > 0, got {v!r}")
    for name, v in (("num_clients", num_clients), ("samples_per_client", samples_per_client)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if num_clients * samples_per_client > len(fine):
        raise ValueError(f"num_clients x samples_per_client = {num_clients * samples_per_client} exceeds "
                         f"the {len(fine)} samples available")
    fines = np.unique(fine)
    parent = {}
    for f in fines:
        cs = np.unique(coarse[fine == f])
        if len(cs) != 1:
            raise ValueError(f"fine label {f} appears under several coarse labels {cs.tolist()}")
        parent[f] = cs[0]
    coarses = np.unique(coarse)
    children = [np.array([k for k, f in enumerate(fines) if parent[f] == c]) for c in coarses]
    rng = np.random.default_rng(seed)
    p_coarse = rng.dirichlet(np.full(len(coarses), alpha), size=num_clients)  # [N, C]
    p_fine = np.zeros((num_clients, len(fines)))  # within-coarse fine distribution, [N, F]
    for kids in children:
        p_fine[:, kids] = rng.dirichlet(np.full(len(kids), beta), size=num_clients)
    pools = [list(rng.permutation(np.flatnonzero(fine == f))) for f in fines]
    fine_alive = np.ones(len(fines), bool)
    coarse_of = np.searchsorted(coarses, [parent[f] for f in fines])
    parts = []
    for j in range(num_clients):
        got = []
        for _ in range(samples_per_client):
            pc = p_coarse[j] * np.array([fine_alive[k].any() for k in children])
            c = rng.choice(len(coarses), p=pc / pc.sum()) if pc.sum() > 0 else \
                rng.choice(np.flatnonzero([fine_alive[k].any() for k in children]))
            kids = children[c]
            pf = p_fine[j, kids] * fine_alive[kids]
            k = kids[rng.choice(len(kids), p=pf / pf.sum())] if pf.sum() > 0 else \
                rng.choice(kids[fine_alive[kids]])
            got.append(pools[k].pop())
            if not pools[k]:
                fine_alive[k] = False
        parts.append(np.sort(np.array(got, dtype=np.int64)))
    del coarse_of
    return parts
