"""FederatedDataset: every client's samples in one flat store plus offsets.

All clients' train samples live in one tensor ``x_train`` ([n_total, *features]); client ``j`` owns
rows ``train_offsets[j] : train_offsets[j] + train_sizes[j]`` (the same for test). A minibatch for
every model in a federation is therefore a single gather: ``x_train[indices]``.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from .draws import ClientDraws, as_draws


BATCH_ORDERS = ("replacement", "shuffled")
#: size buckets (``FederatedDataset.size_buckets``): clients are grouped by the smallest width
#: BUCKET_MIN_WIDTH * BUCKET_RATIO^k (rounded up) >= their size, so padding adds at most BUCKET_RATIO - 1
#: of a client's rows (or pads it to BUCKET_MIN_WIDTH); merging buckets may add BUCKET_SLACK_ROWS more in all
BUCKET_RATIO = 1.25
BUCKET_MIN_WIDTH = 16
BUCKET_SLACK_ROWS = 256


def _pad(x: Tensor, y: Tensor, off: Tensor, size: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor]:
    """The clients at offsets ``off`` with ``size`` rows each, padded to ``width`` rows: x [n, width, ...],
    y [n, width] and the mask [n, width] of real rows (padding repeats each client's first row)."""
    pos = torch.arange(width)
    mask = pos.unsqueeze(0) < size.unsqueeze(1)
    idx = torch.where(mask, off.unsqueeze(1) + pos.unsqueeze(0), off.unsqueeze(1)).to(x.device)
    return x[idx], y[idx], mask.to(x.device)


@dataclass(frozen=True)
class SizeBucket:
    """Clients of similar size, padded to one width: ``x`` [n_b, width, ...], ``y`` [n_b, width, ...],
    ``mask`` [n_b, width] (True on real rows), ``clients`` [n_b] their ids (increasing, CPU int64)."""
    clients: Tensor
    x: Tensor
    y: Tensor
    mask: Tensor

    @property
    def width(self) -> int:
        return int(self.mask.shape[1])


def bucket_width(size: int, ratio: float = BUCKET_RATIO, min_width: int = BUCKET_MIN_WIDTH) -> int:
    """The size group of a client with ``size`` rows: the smallest ceil(min_width * ratio^k) >= size."""
    if ratio <= 1.0:
        raise ValueError(f"bucket ratio must be > 1, got {ratio!r}")
    k, width = 0, int(min_width)
    while width < size:
        k += 1
        width = int(math.ceil(min_width * ratio ** k - 1e-9))
    return width


class Named:
    """A dataset's ``name`` (what loaded) and ``paper_dataset`` (what the paper used; None: not said), and
    how a reader sees them: a substitute is named as one."""

    name: str
    paper_dataset: str | None

    @property
    def is_substitute(self) -> bool:
        return self.paper_dataset is not None and self.paper_dataset != self.name

    @property
    def label(self) -> str:
        """Human-readable dataset name; names the substitute honestly."""
        if self.is_substitute:
            return f"{self.name} (substitute for {self.paper_dataset})"
        return self.name


@dataclass
class FederatedDataset(Named):
    x_train: Tensor
    y_train: Tensor
    train_offsets: Tensor  # [N] int64, CPU
    train_sizes: Tensor  # [N] int64, CPU
    x_test: Tensor
    y_test: Tensor
    test_offsets: Tensor
    test_sizes: Tensor
    num_classes: int
    name: str  # the data that actually ran (e.g. "fashion-mnist")
    paper_dataset: str | None = None  # what the paper used, when a substitute ran instead
    groups: Tensor | None = None  # optional ground-truth client groups (synthetic data)
    #: how minibatches are drawn (``sample_indices``): "replacement" (uniform, with replacement) or
    #: "shuffled" (passes over a fresh permutation of the client's rows within each call)
    batch_order: str = "replacement"
    _padded: dict = field(default_factory=dict, repr=False, compare=False)
    _buckets: dict = field(default_factory=dict, repr=False, compare=False)
    _rows: dict = field(default_factory=dict, repr=False, compare=False)

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_client_arrays(
        cls,
        train: Sequence[tuple[np.ndarray | Tensor, np.ndarray | Tensor]],
        test: Sequence[tuple[np.ndarray | Tensor, np.ndarray | Tensor]],
        num_classes: int,
        name: str,
        paper_dataset: str | None = None,
        groups: Sequence[int] | None = None,
    ) -> "FederatedDataset":
        if len(train) != len(test):
            raise ValueError(f"train has {len(train)} clients but test has {len(test)}")
        if len(train) < 1:
            raise ValueError("a FederatedDataset needs at least one client")
        xtr, ytr, otr, ntr = _concat(train, "train")
        xte, yte, ote, nte = _concat(test, "test")
        return cls(
            xtr, ytr, otr, ntr, xte, yte, ote, nte, int(num_classes), name, paper_dataset,
            None if groups is None else torch.as_tensor(groups, dtype=torch.long),
        )

    @classmethod
    def from_partition(
        cls,
        x: np.ndarray | Tensor,
        y: np.ndarray | Tensor,
        parts: Sequence[np.ndarray],
        num_classes: int,
        name: str,
        test_fraction: float = 0.2,
        seed: int = 0,
        paper_dataset: str | None = None,
    ) -> "FederatedDataset":
        """Split each client's index set into train/test (stratification-free, seeded)."""
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
        rng = np.random.default_rng(seed)
        train, test = [], []
        for j, idx in enumerate(parts):
            idx = np.asarray(idx)
            if len(idx) < 2:
                raise ValueError(f"client {j} has {len(idx)} samples; each client needs >= 2 "
                                 "(one train, one test)")
            idx = rng.permutation(idx)
            n_test = min(max(1, int(round(test_fraction * len(idx)))), len(idx) - 1)
            test.append((x[idx[:n_test]], y[idx[:n_test]]))
            train.append((x[idx[n_test:]], y[idx[n_test:]]))
        return cls.from_client_arrays(train, test, num_classes, name, paper_dataset)

    # ----------------------------------------------------------------- basic facts
    @property
    def num_clients(self) -> int:
        return int(self.train_sizes.numel())

    @property
    def device(self) -> torch.device:
        return self.x_train.device

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    def to(self, device: str | torch.device) -> "FederatedDataset":
        device = torch.device(device)
        return replace(
            self,
            x_train=self.x_train.to(device), y_train=self.y_train.to(device),
            x_test=self.x_test.to(device), y_test=self.y_test.to(device), _padded={}, _buckets={}, _rows={},
        )

    def with_batch_order(self, order: str) -> "FederatedDataset":
        """The same data (tensors shared) drawing its minibatches in ``order`` (see ``BATCH_ORDERS``)."""
        if order not in BATCH_ORDERS:
            raise ValueError(f"batch_order must be one of {BATCH_ORDERS}, got {order!r}")
        return replace(self, batch_order=order, _padded=self._padded, _buckets=self._buckets, _rows=self._rows)

    def with_label_groups(self, num_groups: int) -> "FederatedDataset":
        """Clients split into ``num_groups`` contiguous groups (client j in group j * G // N); group g's
        labels (train and test) are shifted by g, y -> (y + g) mod num_classes. Clients of one group share
        a task; clients of different groups give every image a different label, so they should not learn
        together (the structure of PERM's Fig. 1, label flips between two groups, on image data).
        ``groups`` records the truth. One group is the data unchanged."""
        n, c = self.num_clients, self.num_classes
        if not isinstance(num_groups, int) or not 1 <= num_groups <= min(n, c):
            raise ValueError(f"label_groups must be an integer in [1, {min(n, c)}] (at most the {n} clients "
                             f"and the {c} classes), got {num_groups!r}")
        if num_groups == 1:
            return self
        group = torch.arange(n) * num_groups // n

        def shifted(y, sizes):
            shift = torch.repeat_interleave(group, sizes).to(y.device)
            return (y + shift) % c
        return replace(self, y_train=shifted(self.y_train, self.train_sizes),
                       y_test=shifted(self.y_test, self.test_sizes), groups=group, _padded={}, _buckets={},
                       _rows=self._rows)

    def client(self, j: int, split: str = "train") -> tuple[Tensor, Tensor]:
        x, y, off, size = self._split(split)
        a, b = int(off[j]), int(off[j] + size[j])
        return x[a:b], y[a:b]

    def _split(self, split: str):
        if split == "train":
            return self.x_train, self.y_train, self.train_offsets, self.train_sizes
        if split == "test":
            return self.x_test, self.y_test, self.test_offsets, self.test_sizes
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")

    # ----------------------------------------------------------------- sampling
    def sample_indices(self, clients: Tensor, batch_size: int, generator: torch.Generator | ClientDraws) -> Tensor:
        """Minibatch indices into ``x_train``, drawn as ``batch_order`` says, each client from its own stream.

        ``clients`` is any integer tensor of client ids whose last axis is the models (e.g. [steps, models]).
        The result has shape ``clients.shape + (batch_size,)`` and lives on the data's device. Client c's
        rows come from ``generator``'s stream for c (``data.draws.ClientDraws``; a ``torch.Generator`` is a
        run's stream, from which the call's key is drawn), on the CPU, in an order that depends only on c's
        own entries: the same rows alone, inside any batch and on every device.

        - "replacement": every row uniform over the client's rows, independently (c's entries of
          ``clients`` in row-major order).
        - "shuffled": along the steps each model reads its client's rows in the order of a fresh random
          permutation, batch after batch, and starts a new permutation when one is used up (epochs of
          shuffled passes, as a shuffling data loader). Every model (column) stays on one client. A 1-D
          ``clients`` is one batch per model (rows without replacement when the client has at least
          ``batch_size`` of them).
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        clients = torch.as_tensor(clients, dtype=torch.long).cpu()
        if clients.numel() == 0:
            return torch.empty(*clients.shape, batch_size, dtype=torch.long, device=self.device)
        draws = as_draws(generator)
        if self.batch_order == "replacement":  # client c's entries, in row-major order: [n_c, B] from its stream
            flat = clients.reshape(-1)
            u = draws.per_client(flat, lambda g, c, m: torch.rand(m, batch_size, generator=g, dtype=torch.float64))
            sizes = self.train_sizes[flat].unsqueeze(-1)
            local = torch.minimum(u.mul_(sizes).long(), sizes - 1).reshape(*clients.shape, batch_size)
        else:
            cols = clients.reshape(-1, clients.shape[-1])  # [steps, models]
            if not bool((cols == cols[:1]).all()):
                raise ValueError("batch_order='shuffled' needs every model to stay on one client within a call "
                                 "(a [steps, N] schedule whose columns change client)")
            rows = draws.per_client(cols[0], lambda g, c, m: self._shuffled_rows(int(self.train_sizes[c]), m,
                                                                                len(cols), batch_size, g))
            local = rows.transpose(0, 1).reshape(*clients.shape, batch_size)
        return (self.train_offsets[clients].unsqueeze(-1) + local).to(self.device)

    @staticmethod
    def _shuffled_rows(n: int, m: int, steps: int, batch_size: int, generator: torch.Generator) -> Tensor:
        """Row numbers [m, steps, B] of m models on one client of n rows: shuffled passes, one after another."""
        total = steps * batch_size
        passes = -(-total // n)
        perm = torch.rand(m, passes, n, generator=generator, dtype=torch.float64).argsort(-1)
        return perm.reshape(m, passes * n)[:, :total].reshape(m, steps, batch_size)

    def padded(self, split: str = "test") -> tuple[Tensor, Tensor, Tensor]:
        """All clients' ``split`` data as [N, max_n, ...] with a boolean mask [N, max_n] (cached)."""
        if split not in self._padded:
            x, y, off, size = self._split(split)
            self._padded[split] = _pad(x, y, off, size, int(size.max()))
        return self._padded[split]

    def train_rows_with_ones(self) -> Tensor:
        """``x_train`` as rows [n_total, W]: the flattened features, a column of ones, then zeros up to
        W = a multiple of 16 columns (64-byte rows in float32). Cached (rebuilt if ``x_train`` is replaced
        or changed in place). ``engine.stacked.sgd_steps`` gathers its minibatches from it: whole aligned
        rows, with the first layer's bias riding as the weight of the ones column."""
        x = self.x_train
        if self._rows.get("x") is not x or self._rows["version"] != x._version:
            d = math.prod(x.shape[1:])
            rows = torch.zeros(x.shape[0], -(-(d + 1) // 16) * 16, dtype=x.dtype, device=x.device)
            rows[:, :d] = x.reshape(x.shape[0], d)
            rows[:, d] = 1.0
            self._rows.update(x=x, version=x._version, rows=rows)
        return self._rows["rows"]

    def size_buckets(self, split: str = "test", ratio: float | None = None, min_width: int | None = None,
                     slack: int | None = None) -> tuple[list[SizeBucket], Tensor]:
        """The ``split`` data grouped into size buckets (cached): clients whose sizes round up to the same
        ``bucket_width`` share one block padded to its largest member, so every client is padded by at
        most ``ratio`` times its rows (or to ``min_width``), where ``padded`` pads every client to the
        largest one. Then, cheapest first, a bucket is merged into the next wider one while the padding
        all merges add stays within ``slack`` rows in total: a small federation runs as one call (the
        padded layout), as a call costs more than a few hundred padded rows there. Defaults:
        ``BUCKET_RATIO``, ``BUCKET_MIN_WIDTH``, ``BUCKET_SLACK_ROWS``.

        Returns (buckets by increasing width, where [N, 2]: client j is row ``where[j, 1]`` of bucket
        ``where[j, 0]``)."""
        ratio = BUCKET_RATIO if ratio is None else float(ratio)
        min_width = BUCKET_MIN_WIDTH if min_width is None else int(min_width)
        slack = BUCKET_SLACK_ROWS if slack is None else int(slack)
        key = (split, ratio, min_width, slack)
        if key not in self._buckets:
            x, y, off, size = self._split(split)
            grid = torch.tensor([bucket_width(int(n), ratio, min_width) for n in size.tolist()], dtype=torch.long)
            groups = [(grid == g).nonzero().squeeze(1) for g in torch.unique(grid).tolist()]
            widths = [int(size[m].max()) for m in groups]
            spent = 0
            while len(groups) > 1:
                costs = [groups[i].numel() * (widths[i + 1] - widths[i]) for i in range(len(groups) - 1)]
                i = min(range(len(costs)), key=costs.__getitem__)
                if spent + costs[i] > slack:
                    break
                spent += costs[i]
                groups[i + 1] = torch.sort(torch.cat([groups[i], groups[i + 1]])).values
                del groups[i], widths[i]
            where = torch.empty(self.num_clients, 2, dtype=torch.long)
            buckets = []
            for b, (members, width) in enumerate(zip(groups, widths)):
                where[members, 0] = b
                where[members, 1] = torch.arange(members.numel())
                buckets.append(SizeBucket(members, *_pad(x, y, off[members], size[members], width)))
            self._buckets[key] = (buckets, where)
        return self._buckets[key]

    def label_counts(self, split: str = "train") -> Tensor:
        """[N, num_classes] label histogram per client."""
        _, y, off, size = self._split(split)
        owner = torch.repeat_interleave(torch.arange(self.num_clients), size).to(y.device)
        counts = torch.zeros(self.num_clients, self.num_classes, dtype=torch.long, device=y.device)
        counts.index_put_((owner, y), torch.ones_like(y), accumulate=True)
        return counts.cpu()

    def summary(self) -> dict:
        return {
            "dataset": self.name,
            "paper_dataset": self.paper_dataset or self.name,
            "is_substitute": self.is_substitute,
            "num_clients": self.num_clients,
            "num_classes": self.num_classes,
            "train_samples": int(self.train_sizes.sum()),
            "test_samples": int(self.test_sizes.sum()),
            "train_per_client_min": int(self.train_sizes.min()),
            "train_per_client_max": int(self.train_sizes.max()),
        }


def data_digest(data: FederatedDataset) -> str:
    """SHA-256 over the dataset's tensors (features, labels, client offsets): same data, same digest."""
    h = hashlib.sha256()
    for t in (data.x_train, data.y_train, data.train_sizes, data.x_test, data.y_test, data.test_sizes):
        h.update(str((tuple(t.shape), t.dtype)).encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _concat(pairs, split):
    xs, ys = [], []
    for j, (x, y) in enumerate(pairs):
        x = torch.as_tensor(np.asarray(x) if not isinstance(x, Tensor) else x)
        y = torch.as_tensor(np.asarray(y) if not isinstance(y, Tensor) else y)
        if len(x) != len(y):
            raise ValueError(f"client {j} {split}: {len(x)} inputs but {len(y)} labels")
        if len(x) == 0:
            raise ValueError(f"client {j} has no {split} samples")
        xs.append(x.float())
        ys.append(y.long())
    sizes = torch.tensor([len(y) for y in ys], dtype=torch.long)
    offsets = torch.cumsum(sizes, 0) - sizes
    return torch.cat(xs), torch.cat(ys), offsets, sizes
