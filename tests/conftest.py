import numpy as np
import pytest
import torch

from pflkit.data import FederatedDataset


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
# `make test` spreads the suite over two pytest-xdist workers (``-n 2 --dist loadgroup``). What must run in
# one process, in collection order, is one xdist group: a compute notebook (nbval writes its smoke results
# to build/smoke/<stage>), the plot notebook that reads them and the regression test that compares them;
# and the Flower tests (Ray and the deployment engine start local servers: never two runs at once).
def _group_of(item) -> str | None:
    from pathlib import Path

    from pflkit import stages
    path = Path(str(item.fspath))
    if path.suffix == ".ipynb":
        rel = path.relative_to(Path(__file__).resolve().parents[1]).with_suffix(".py").as_posix()
        stage = next((s for s in stages.STAGES if s.notebook == rel), None)
        return None if stage is None else f"stage-{stage.source or stage.name}"
    if path.name == "test_smoke_results.py" and hasattr(item, "callspec") and "nb" in item.callspec.params:
        return f"stage-{item.callspec.params['nb'].stage}"
    if "flower" in path.name:
        return "flower"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        group = _group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
