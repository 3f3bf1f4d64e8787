"""Federated datasets, partitioners, generators and real-dataset readers."""
from .federated import FederatedDataset
from .hlda import hierarchical_lda
from .leaf import LeafSplit, read_leaf, read_leaf_dir, read_leaf_shakespeare
from .partition import classes_per_client, dirichlet, iid, partition
from .synthetic import perm_synthetic, perm_synthetic_arrays
from .text import TextClients, load_shakespeare
from .vision import (ChecksumError, DatasetUnavailableError, DownloadError, ImageData, Writers, federate,
                     load_dataset)

__all__ = ["FederatedDataset", "partition", "iid", "classes_per_client", "dirichlet",
           "perm_synthetic", "perm_synthetic_arrays", "ImageData", "Writers", "load_dataset", "federate",
           "ChecksumError", "DownloadError", "DatasetUnavailableError", "LeafSplit", "read_leaf",
           "read_leaf_dir", "read_leaf_shakespeare", "hierarchical_lda", "TextClients", "load_shakespeare"]
