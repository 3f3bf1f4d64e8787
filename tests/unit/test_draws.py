"""Randomness per client (pflkit.data.draws): a client computing alone draws exactly what it draws inside the
batch (its minibatch rows and its dropout masks), whatever else the batch holds."""
import pytest
import torch

from pflkit.data import perm_synthetic
from pflkit.data.draws import ClientDraws
from pflkit.engine import FunctionalModel
from pflkit.engine.local_sgd import local_sgd
from pflkit.flower.client import one_client
from pflkit.models import build
from pflkit.seeds import mix

DATA = dict(num_clients=5, samples_per_client=30, dim=4, test_fraction=0.3, seed=2)
# models per client: client 2 hosts two, client 3 none
SCHEDULE = torch.tensor([0, 2, 4, 2, 1]).expand(6, 5)


def test_mix_is_a_fixed_function_of_its_values():
    assert mix(5, 0) == mix(5, 0) and mix(5, 0) != mix(5, 1) != mix(6, 1) != mix(1, 5)
    assert mix(2**62, 2**40) < 2**63
    assert mix(0) == 0xE220A8397B1DCDAF >> 1  # splitmix64's first output from state 0 (Vigna's reference), 63 bits
    assert mix(0, 0) == 6017775124710473527  # the stream of client 0 under key 0: a change here changes results


@pytest.mark.parametrize("order", ["replacement", "shuffled"])
def test_a_client_alone_draws_its_rows_inside_the_batch(order):
    data = perm_synthetic(**DATA).with_batch_order(order)
    batch = data.sample_indices(SCHEDULE, 4, ClientDraws(123))  # [6, 5, 4]
    assert batch.shape == (6, 5, 4)
    for c in range(5):
        cols = (SCHEDULE[0] == c).nonzero().squeeze(1)
        alone = one_client(data, c).sample_indices(torch.zeros(6, len(cols), dtype=torch.long), 4,
                                                   ClientDraws(123).for_client(c))
        assert torch.equal(alone, batch[:, cols] - data.train_offsets[c])
        assert alone.shape == (6, len(cols), 4) and bool(((alone >= 0) & (alone < data.train_sizes[c])).all())
    # another key, other rows; another batch around client 0, the same rows for it
    assert not torch.equal(batch, data.sample_indices(SCHEDULE, 4, ClientDraws(124)))
    assert torch.equal(data.sample_indices(torch.tensor([[0, 3]] * 6), 4, ClientDraws(123))[:, :1], batch[:, :1])


def test_shuffled_rows_are_passes_over_the_client():
    data = perm_synthetic(**DATA).with_batch_order("shuffled")
    n = int(data.train_sizes[1])
    rows = data.sample_indices(torch.ones(n, 1, dtype=torch.long), 2, ClientDraws(9))[:, 0] - data.train_offsets[1]
    flat = rows.reshape(-1)  # 2n rows: two whole passes, each a permutation of the client's rows
    assert sorted(flat[:n].tolist()) == list(range(n)) == sorted(flat[n:].tolist())


def test_models_that_move_draw_each_visit_from_the_hosts_stream_and_shuffled_order_refuses_them():
    data = perm_synthetic(**DATA)
    moving = torch.tensor([[0, 1], [1, 0], [0, 1]])  # client 0's entries in row-major order: (0,0) (1,1) (2,0)
    rows = data.sample_indices(moving, 4, ClientDraws(1))
    alone = one_client(data, 0).sample_indices(torch.zeros(3, dtype=torch.long), 4, ClientDraws(1).for_client(0))
    assert torch.equal(torch.stack([rows[0, 0], rows[1, 1], rows[2, 0]]), alone)
    with pytest.raises(ValueError, match="columns change client"):
        data.with_batch_order("shuffled").sample_indices(moving, 4, ClientDraws(1))


def test_a_client_alone_trains_with_dropout_as_inside_the_batch():
    """Local SGD with dropout for five models on four clients, then each client alone from the same key: the
    same models (float32 of one client alone vs in a batch of five: 1e-6), and other masks under another key."""
    data = perm_synthetic(**DATA)
    model = FunctionalModel(lambda: build("mlp", (DATA["dim"],), 2, hidden=(6,), dropout=0.5))
    start = {k: v.unsqueeze(0).repeat(5, *[1] * v.dim()) for k, v in model.init(0).items()}
    clients = SCHEDULE[0]
    batch, _ = local_sgd(model, start, data, clients, steps=4, lr=0.3, batch_size=4, generator=ClientDraws(5))
    for c in (0, 2, 4):
        cols = (clients == c).nonzero().squeeze(1)
        mine = {k: v[cols] for k, v in start.items()}
        alone, _ = local_sgd(model, mine, one_client(data, c), torch.zeros(len(cols), dtype=torch.long), steps=4,
                             lr=0.3, batch_size=4, generator=ClientDraws(5).for_client(c))
        torch.testing.assert_close(alone, {k: v[cols] for k, v in batch.items()}, rtol=1e-6, atol=1e-6)
    other, _ = local_sgd(model, start, data, clients, steps=4, lr=0.3, batch_size=4, generator=ClientDraws(6))
    assert not any(torch.equal(other[k], batch[k]) for k in batch)


def test_dropout_masks_are_per_model_and_scaled():
    model = FunctionalModel(lambda: build("mlp", (4,), 2, hidden=(200,), dropout=0.25))
    x = torch.zeros(3, 50, 4)
    (masks,) = model.dropout_masks(x, torch.tensor([1, 2, 1]))
    assert masks.shape == (3, 50, 200)
    assert set(masks.unique().tolist()) == {0.0, torch.tensor(4 / 3).item()}  # 1 / (1 - p) in float32
    assert torch.equal(masks[0], masks[2]) and not torch.equal(masks[0], masks[1])
    kept = float((masks > 0).float().mean())
    assert abs(kept - 0.75) < 0.02  # 30,000 units: 6 standard deviations of the binomial is 0.015
