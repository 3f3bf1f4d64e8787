"""Split a labelled pool of samples across clients: iid, k classes per client, Dirichlet(beta).

Each partitioner returns a list of index arrays, one per client, and is deterministic for a seed. The rules a
partition spec (``{scheme: classes, classes_per_client: 2}``) must meet, checked before any data loads
(:func:`partition_problems`: (key, problem) pairs naming the key, the value and what is allowed), are here too,
beside the partitioners they guard; those that need a dataset's size are ``vision.image_partition_problems``.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..checks import is_int, is_number, short_repr

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


#: partition scheme -> (required options, optional options); see the partitioners here, vision.federate
#: and (hlda, Charles NN tasks only) pflkit.data.hlda
PARTITION_OPTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "iid": ((), ("samples_per_client",)),
    "classes": (("classes_per_client",), ("samples_per_client",)),
    "dirichlet": (("beta",), ("min_size",)),
    "natural": ((), ()),
    "hlda": ((), ("alpha", "beta", "samples_per_client")),
}
#: the schemes image_federation (PERM figures, perm_hetero, Charles FEMNIST) can run
IMAGE_SCHEMES = ("iid", "classes", "dirichlet", "natural")
#: hierarchical LDA defaults (pflkit.experiments.charles_nn._hlda_federation); without num_clients, 500 clients
HLDA_DEFAULTS = {"alpha": 0.1, "beta": 10.0, "samples_per_client": 100, "num_clients": 500}


def partition_problems(spec, key: str = "partition", allow_natural: bool = True,
                       schemes: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    """Scheme name, option names (typos) and option values of one partition spec
    (``{scheme: classes, classes_per_client: 2}``). ``schemes``: the allowed schemes (default the image
    schemes, without ``natural`` unless ``allow_natural``)."""
    if not isinstance(spec, Mapping):
        return [(key, f"must be a mapping like {{scheme: iid}}, got {short_repr(spec)}")]
    if schemes is None:
        schemes = tuple(s for s in IMAGE_SCHEMES if allow_natural or s != "natural")
    scheme = spec.get("scheme")
    if not isinstance(scheme, str) or scheme not in schemes:
        return [(f"{key}.scheme", f"must be one of {schemes}, got {short_repr(scheme)}")]
    required, optional = PARTITION_OPTIONS[scheme]
    problems = []
    for k in spec:
        if k != "scheme" and k not in required + optional:
            problems.append((f"{key}.{k}", f"unknown option for scheme {scheme!r} (value {short_repr(spec[k])}); "
                                           f"allowed: {sorted(required + optional) or 'none'}"))
    for k in required:
        if k not in spec:
            problems.append((f"{key}.{k}", f"required by scheme {scheme!r}"))
    for k in ("classes_per_client", "samples_per_client", "min_size"):
        if k in spec and not (is_int(spec[k]) and spec[k] >= 1):
            problems.append((f"{key}.{k}", f"must be an integer >= 1, got {short_repr(spec[k])}"))
    what = {"beta": "Dirichlet concentration" if scheme == "dirichlet" else "hLDA fine-label concentration",
            "alpha": "hLDA coarse-label concentration"}
    for k in ("beta", "alpha"):
        if k in spec and not (is_number(spec[k]) and spec[k] > 0):
            problems.append((f"{key}.{k}", f"must be a number > 0 ({what[k]}; finite), got {short_repr(spec[k])}"))
        elif k in spec and scheme == "dirichlet" and spec[k] < DIRICHLET_BETA_MIN:
            problems.append((f"{key}.{k}", f"{short_repr(spec[k])} is below {DIRICHLET_BETA_MIN:g}: the Dirichlet "
                                           f"draws then give (almost) every sample to one client, and the partition "
                                           f"cannot give each client 2 samples; allowed: >= {DIRICHLET_BETA_MIN:g}"))
    return problems


#: the smallest Dirichlet concentration a partition takes (the papers' settings are 0.1 to 1)
DIRICHLET_BETA_MIN = 0.01
