"""Split a labelled pool of samples across clients: iid, k classes per client, Dirichlet(beta).

Each partitioner returns a list of index arrays, one per client, and is deterministic for a seed.
"""
from __future__ import annotations

import numpy as np

PARTITIONS = ("iid", "classes", "dirichlet")


def _check(n_samples: int, num_clients: int):
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients!r}")
    if num_clients > n_samples:
        raise ValueError(f"num_clients={num_clients} exceeds the {n_samples} samples available")


def iid(labels: np.ndarray, num_clients: int, seed: int = 0, samples_per_client: int | None = None):
    """Shuffle and deal equal shares (optionally only ``samples_per_client`` each)."""
    labels = np.asarray(labels)
    _check(len(labels), num_clients)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    if samples_per_client is not None:
        need = samples_per_client * num_clients
        if need > len(labels):
            raise ValueError(f"samples_per_client={samples_per_client} x num_clients={num_clients} "
                             f"= {need} exceeds the {len(labels)} samples available")
        order = order[:need]
    return [np.sort(p) for p in np.array_split(order, num_clients)]


def classes_per_client(labels: np.ndarray, num_clients: int, classes_per_client: int, seed: int = 0,
                       samples_per_client: int | None = None):
    """Pathological label skew: client j holds ``classes_per_client`` classes.

    Classes are assigned round-robin (client j gets classes j*k, j*k+1, ... mod C) so every class is
    used about equally; each class's samples are dealt evenly among the clients that hold it.
    """
    labels = np.asarray(labels)
    classes = np.unique(labels)
    num_classes = len(classes)
    _check(len(labels), num_clients)
    if not 1 <= classes_per_client <= num_classes:
        raise ValueError(f"classes_per_client must be in [1, {num_classes}] (the number of classes), "
                         f"got {classes_per_client!r}")
    rng = np.random.default_rng(seed)
    owned = [[classes[(j * classes_per_client + t) % num_classes] for t in range(classes_per_client)]
             for j in range(num_clients)]
    holders = {c: [j for j in range(num_clients) if c in owned[j]] for c in classes}
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in classes:
        if not holders[c]:
            continue
        idx = rng.permutation(np.flatnonzero(labels == c))
        for j, chunk in zip(holders[c], np.array_split(idx, len(holders[c]))):
            parts[j].append(chunk)
    out = []
    for j, chunks in enumerate(parts):
        idx = np.concatenate(chunks) if chunks else np.array([], dtype=int)
        if samples_per_client is not None:
            idx = rng.permutation(idx)[:samples_per_client]
        if len(idx) == 0:
            raise ValueError(f"client {j} received no samples; use fewer clients or more data")
        out.append(np.sort(idx))
    return out


def dirichlet(labels: np.ndarray, num_clients: int, beta: float, seed: int = 0, min_size: int = 2):
    """Label proportions per client ~ Dirichlet(beta) (Hsu et al. 2019); small beta = more skew.

    Redraws (up to 100 times) until every client has at least ``min_size`` samples.
    """
    labels = np.asarray(labels)
    _check(len(labels), num_clients)
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta!r}")
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    for _ in range(100):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            p = rng.dirichlet(np.full(num_clients, beta))
            cuts = (np.cumsum(p) * len(idx)).astype(int)[:-1]
            for j, chunk in enumerate(np.split(idx, cuts)):
                parts[j].extend(chunk.tolist())
        if min(len(p) for p in parts) >= min_size:
            return [np.sort(np.array(p, dtype=int)) for p in parts]
    raise ValueError(f"Dirichlet(beta={beta}) could not give all {num_clients} clients >= {min_size} "
                     "samples in 100 draws; raise beta or lower num_clients")


def partition(labels, num_clients: int, scheme: str, seed: int = 0, **kwargs):
    """Dispatch by name: ``iid``, ``classes`` (needs classes_per_client), ``dirichlet`` (needs beta)."""
    if scheme == "iid":
        return iid(labels, num_clients, seed, **kwargs)
    if scheme == "classes":
        return classes_per_client(labels, num_clients, seed=seed, **kwargs)
    if scheme == "dirichlet":
        return dirichlet(labels, num_clients, seed=seed, **kwargs)
    raise ValueError(f"partition scheme must be one of {PARTITIONS}, got {scheme!r}")
