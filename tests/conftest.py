import os

import numpy as np
import pytest
import torch

from pflkit.data import FederatedDataset
from pflkit.flower import OFFLINE_ENV

# Flower and Ray never phone home from the tests either. The engines set this where they start
# (pflkit.flower.simulation.simulate, Deployment's processes), but a test module's importorskip("flwr") imports
# Flower first, and Flower reads its telemetry switch at that import
os.environ.update(OFFLINE_ENV)


def make_mixed_clients(sizes=(7, 23, 3, 41, 12), dim=6, num_classes=3, seed=0, test=5):
    """Clients of unequal sizes with client-specific label rules."""
    rng = np.random.default_rng(seed)
    train, test_ = [], []
    for n in sizes:
        w = rng.standard_normal((dim, num_classes))
        for count, bucket in ((n, train), (test, test_)):
            x = rng.standard_normal((count, dim)).astype(np.float32)
            bucket.append((x, (x @ w).argmax(1)))
    return FederatedDataset.from_client_arrays(train, test_, num_classes, "mixed-test")


@pytest.fixture
def mixed():
    return make_mixed_clients()


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)
    yield



# --------------------------------------------------------------------------- running on both cores
# `make test` runs the unit and integration tests over two pytest-xdist workers (``-n 2 --dist loadgroup``)
# beside the notebooks (their own process: a plot notebook reads what its compute notebook wrote). The
# Flower tests are one xdist group: Ray and the deployment engine start local servers, never two at once.
# xdist marks a grouped test by appending "@<group>" to its node id; pytest 9.2 ignores that write, so every group
# would be spread over both workers without a word (pytest-dev/pytest-xdist#1386, open): pyproject pins pytest<9.2,
# and a loadgroup run under 9.2 stops here instead of running the Flower servers side by side.
def pytest_configure(config):
    version = tuple(int(p) for p in pytest.__version__.split(".")[:2])
    if config.getoption("dist", None) == "loadgroup" and version >= (9, 2):
        raise pytest.UsageError(f"--dist loadgroup ignores xdist_group under pytest {pytest.__version__} "
                                "(pytest-dev/pytest-xdist#1386): install pytest<9.2, as pyproject.toml pins it")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "flower" in item.path.name:
            item.add_marker(pytest.mark.xdist_group("flower"))
