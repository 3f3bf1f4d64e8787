"""Image data for the stages of every paper: which dataset a stage asks for (and its named offline
substitute), loading it, recording what actually ran, and partitioning it into a federation."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import seeds
from ..config import DatasetName, ProjectPath, Section
from ..data import prepared
from ..data.federated import FederatedDataset
from ..data.vision import federate


class DatasetSection(Section):
    """Which image dataset a stage asks for, and the named offline substitute when it cannot be had."""
    name: DatasetName  # a name pflkit.data.vision knows (aliases allowed)
    substitute: DatasetName | None
    allow_download: bool
    root: ProjectPath


def load_images(ds: DatasetSection):
    """The dataset ``ds`` asks for (or its named substitute), from data/prepared/ when the data stages have
    prepared it (``pflkit.data.prepared.images``), else from its sources."""
    return prepared.images(ds.name, root=ds.root, allow_download=ds.allow_download, substitute=ds.substitute)


def dataset_record(img) -> dict:
    """What actually ran, for metrics.json: never lets a substitute pass as the paper's data."""
    return {"dataset": img.name, "paper_dataset": img.paper_dataset, "is_substitute": img.is_substitute,
            "source": img.source}


def image_federation(cfg, img, seed: int) -> FederatedDataset:
    """Partition (pooled, optionally subsampled) image data into cfg.num_clients clients; ``cfg`` is any
    config with ``partition``, ``pool_size``, ``num_clients`` and ``test_fraction``."""

    spec = dict(cfg.partition)
    scheme = spec.pop("scheme")
    if scheme == "natural" and img.writers is None:
        raise ValueError(f"{img.label} has no writer ids for a natural split; set partition.scheme to "
                         "iid/classes/dirichlet (the substitute's partition)")
    if cfg.pool_size is not None and cfg.pool_size < len(img.y_train) + len(img.y_test):
        rng = np.random.default_rng(seeds.data_sample(seed))
        keep_tr = np.sort(rng.permutation(len(img.y_train))[: int(cfg.pool_size * 0.8)])
        keep_te = np.sort(rng.permutation(len(img.y_test))[: cfg.pool_size - len(keep_tr)])
        img = replace(img, x_train=img.x_train[keep_tr], y_train=img.y_train[keep_tr],
                      x_test=img.x_test[keep_te], y_test=img.y_test[keep_te], writers=None)
    return federate(img, cfg.num_clients, scheme, seed=seed, test_fraction=cfg.test_fraction, **spec)
