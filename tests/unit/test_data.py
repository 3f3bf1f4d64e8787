"""Partitioners, the PERM synthetic generator, and FederatedDataset bookkeeping."""
import numpy as np
import pytest
import torch

from pflkit.data import FederatedDataset, classes_per_client, dirichlet, iid, partition, perm_synthetic
from pflkit.data.synthetic import perm_synthetic_arrays
from pflkit.seeds import mix

LABELS = np.repeat(np.arange(10), 100)


def test_iid_deals_everything_once():
    parts = iid(LABELS, 7, seed=0)
    assert sorted(np.concatenate(parts).tolist()) == list(range(1000))
    assert {len(p) for p in parts} <= {142, 143}
    assert all(len(np.unique(LABELS[p])) == 10 for p in parts)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_classes_per_client(k):
    parts = classes_per_client(LABELS, 20, k, seed=1)
    assert len(parts) == 20
    assert all(len(np.unique(LABELS[p])) == k for p in parts)
    assert len(np.unique(np.concatenate(parts))) == sum(len(p) for p in parts)  # disjoint


def test_dirichlet_skew_grows_as_beta_shrinks():
    def mean_max_share(beta):
        parts = dirichlet(LABELS, 10, beta, seed=0)
        return np.mean([np.bincount(LABELS[p], minlength=10).max() / len(p) for p in parts])
    assert mean_max_share(0.05) > 0.6 > mean_max_share(100.0) + 0.3
    assert min(len(p) for p in dirichlet(LABELS, 10, 0.1, seed=3)) >= 2


@pytest.mark.parametrize("call, match", [
    (lambda: classes_per_client(LABELS, 5, 11), r"classes_per_client must be in \[1, 10\]"),
    (lambda: iid(LABELS, 2000), "num_clients=2000 exceeds the 1000 samples"),
    (lambda: dirichlet(LABELS, 5, 0.0), "beta must be > 0"),
    (lambda: partition(LABELS, 5, "shards"), "partition scheme must be one of"),
])
def test_partition_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_perm_synthetic_matches_spec():
    x, y, group, w = perm_synthetic_arrays(num_clients=40, samples_per_client=2000, dim=8, seed=0)
    assert x.shape == (40, 2000, 8) and y.shape == (40, 2000)
    assert (group[:20] == 0).all() and (group[20:] == 1).all()
    x0, x1 = x[:20].reshape(-1, 8), x[20:].reshape(-1, 8)
    np.testing.assert_allclose(x0.mean(0), 0.2, atol=0.01)
    np.testing.assert_allclose(x1.mean(0), -0.2, atol=0.01)
    np.testing.assert_allclose(x0.var(0), np.arange(1, 9) ** -1.2, rtol=0.03)
    np.testing.assert_allclose(x1.var(0), np.arange(1, 9) ** -1.2, rtol=0.03)
    # one labelling vector; the rule flips between the groups
    assert ((x[:20] @ w > 0) == (y[:20] == 1)).all()
    assert ((x[20:] @ w < 0) == (y[20:] == 1)).all()
    # w ~ N(0.1, I): a different seed gives another w, the same seed the same data
    assert not np.allclose(w, perm_synthetic_arrays(40, 10, 8, seed=1)[3])
    np.testing.assert_array_equal(x, perm_synthetic_arrays(40, 2000, 8, seed=0)[0])


def test_perm_synthetic_federation():
    data = perm_synthetic(10, 50, 5, test_fraction=0.2, seed=0)
    assert data.num_clients == 10 and data.num_classes == 2
    assert data.train_sizes.tolist() == [40] * 10 and data.test_sizes.tolist() == [10] * 10
    assert data.groups.tolist() == [0] * 5 + [1] * 5
    assert not data.is_substitute and data.label == "perm-synthetic"


def test_substitute_is_labelled():
    x = np.zeros((20, 3), np.float32)
    y = np.arange(20) % 2
    data = FederatedDataset.from_partition(x, y, iid(y, 4), 2, "fashion-mnist", paper_dataset="cifar10")
    assert data.is_substitute
    assert data.label == "fashion-mnist (substitute for cifar10)"
    assert data.summary()["is_substitute"] is True


def test_label_counts(mixed):
    counts = mixed.label_counts()
    assert counts.shape == (5, 3)
    assert counts.sum(1).tolist() == mixed.train_sizes.tolist()


# ------------------------------------------------------------------ minibatch order
def _uneven_federation():
    g = torch.Generator().manual_seed(0)
    sizes = [7, 12, 5]
    train = [(torch.randn(n, 2, generator=g), torch.zeros(n, dtype=torch.long)) for n in sizes]
    test = [(torch.randn(2, 2, generator=g), torch.zeros(2, dtype=torch.long)) for _ in sizes]
    return FederatedDataset.from_client_arrays(train, test, 2, "uneven")


def test_shuffled_batches_are_passes_over_a_permutation_of_each_clients_rows():
    """With batch_order='shuffled' each model reads its client's rows as whole passes: every pass of
    n_c consecutive draws is a permutation of the client's rows (exact), and passes differ."""
    data = _uneven_federation().with_batch_order("shuffled")
    clients = torch.tensor([0, 1, 2, 0])  # two models on client 0 draw independently
    steps, batch = 9, 4  # 36 draws: several passes of 7, 12 and 5 rows
    idx = data.sample_indices(clients.unsqueeze(0).expand(steps, 4), batch, torch.Generator().manual_seed(3))
    assert idx.shape == (steps, 4, batch)
    for col, c in enumerate(clients.tolist()):
        n, off = int(data.train_sizes[c]), int(data.train_offsets[c])
        seq = idx[:, col, :].reshape(-1) - off
        passes = [seq[p * n:(p + 1) * n] for p in range(len(seq) // n)]
        for p in passes:
            assert sorted(p.tolist()) == list(range(n))
        assert any(not torch.equal(passes[0], p) for p in passes[1:])
    assert not torch.equal(idx[:, 0], idx[:, 3])
    again = data.sample_indices(clients.unsqueeze(0).expand(steps, 4), batch, torch.Generator().manual_seed(3))
    assert torch.equal(idx, again)


def test_batch_order_default_is_with_replacement_and_bad_orders_are_refused():
    data = _uneven_federation()
    assert data.batch_order == "replacement"
    clients = torch.tensor([[0, 1, 2], [0, 1, 2]])
    # a run's generator gives the call's key; client c's two batches come from its own stream, seeded mix(key, c)
    key = int(torch.randint(0, 2**62, (), generator=torch.Generator().manual_seed(1)))
    want = torch.empty(2, 3, 4, dtype=torch.long)
    for c in range(3):
        u = torch.rand(2, 4, generator=torch.Generator().manual_seed(mix(key, c)), dtype=torch.float64)
        n = int(data.train_sizes[c])
        want[:, c] = int(data.train_offsets[c]) + torch.minimum((u * n).long(), torch.tensor(n - 1))
    assert torch.equal(data.sample_indices(clients, 4, torch.Generator().manual_seed(1)), want)
    with pytest.raises(ValueError, match=r"batch_order must be one of \('replacement', 'shuffled'\), got 'sorted'"):
        data.with_batch_order("sorted")
    moving = torch.tensor([[0, 1], [1, 1]])
    with pytest.raises(ValueError, match="stay on one client"):
        data.with_batch_order("shuffled").sample_indices(moving, 2, torch.Generator())


def test_label_groups_shift_each_groups_labels_and_record_the_groups():
    """with_label_groups(G): client j is in group j * G // N and its labels (train and test) are shifted by
    its group mod the classes, checked row by row against the original; images are untouched."""
    rng = np.random.default_rng(0)
    train = [(rng.normal(size=(5, 3)), rng.integers(0, 4, 5)) for _ in range(6)]
    test = [(rng.normal(size=(2, 3)), rng.integers(0, 4, 2)) for _ in range(6)]
    fed = FederatedDataset.from_client_arrays(train, test, num_classes=4, name="toy")
    grouped = fed.with_label_groups(3)
    assert grouped.groups.tolist() == [0, 0, 1, 1, 2, 2]
    for j in range(6):
        g = j * 3 // 6
        for split, pairs in (("train", train), ("test", test)):
            x, y = grouped.client(j, split)
            assert torch.equal(x, torch.as_tensor(pairs[j][0]).to(x.dtype))
            assert y.tolist() == [(int(v) + g) % 4 for v in pairs[j][1]]
    assert fed.with_label_groups(1) is fed
    assert fed.groups is None  # the original is unchanged


@pytest.mark.parametrize("groups", [0, 5, 7, 2.0])
def test_label_groups_out_of_range_are_refused_naming_the_parameter(groups):
    fed = FederatedDataset.from_client_arrays([(np.zeros((2, 1)), np.array([0, 1]))] * 6,
                                              [(np.zeros((1, 1)), np.array([0]))] * 6, num_classes=4, name="toy")
    with pytest.raises(ValueError, match=r"label_groups must be an integer in \[1, 4\]"):
        fed.with_label_groups(groups)
