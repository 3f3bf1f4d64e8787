"""Reader for LEAF json datasets (FEMNIST, Shakespeare, ...): one writer / speaker per user.

LEAF (Caldas et al. 2018, https://github.com/TalwalkarLab/leaf) stores each split as a directory of
json files, every file holding a disjoint set of users::

    {"users": ["f0000_14", ...], "num_samples": [n_0, ...],
     "user_data": {"f0000_14": {"x": [[784 floats], ...], "y": [label, ...]}, ...},
     "hierarchies": [...]}   # optional

``x`` entries are 784 floats for FEMNIST (28 x 28 gray, LEAF keeps white background = 1.0 and ink near
0.0) and 80-character strings for Shakespeare (``y`` then holds single next characters). The reader
keeps the values exactly as stored; callers reshape / encode them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class LeafSplit:
    """One LEAF split (train or test): users in file order, each with its own samples."""

    users: tuple[str, ...]
    x: dict[str, np.ndarray]  # user -> [n_u, ...] (float32 for numbers, str for text)
    y: dict[str, np.ndarray]  # user -> [n_u] (int64 for integer labels, str for text)

    @property
    def num_samples(self) -> dict[str, int]:
        return {u: len(self.y[u]) for u in self.users}

    def flatten(self, users: list[str] | tuple[str, ...] | None = None):
        """All samples of ``users`` (default: all, in order) -> (x, y, writer index into ``users``)."""
        users = self.users if users is None else tuple(users)
        missing = [u for u in users if u not in self.y]
        if missing:
            raise ValueError(f"users {missing[:5]} are not in this LEAF split")
        if not users:
            raise ValueError("users must name at least one user")
        x = np.concatenate([self.x[u] for u in users])
        y = np.concatenate([self.y[u] for u in users])
        writer = np.repeat(np.arange(len(users), dtype=np.int64), [len(self.y[u]) for u in users])
        return x, y, writer


def _as_array(values, what: str, path: Path, user: str) -> np.ndarray:
    if len(values) == 0:
        return np.zeros((0,), dtype=np.float32)
    first = values[0]
    if isinstance(first, str):
        return np.asarray(values, dtype=str)
    arr = np.asarray(values)
    if arr.dtype == object:
        raise ValueError(f"{path}: user {user!r} has ragged {what} entries (not all the same length)")
    if np.issubdtype(arr.dtype, np.integer):
        return arr.astype(np.int64)
    if np.issubdtype(arr.dtype, np.floating):
        if what == "y" and np.all(arr == np.round(arr)):
            return arr.astype(np.int64)  # LEAF sometimes writes labels as 3.0
        return arr.astype(np.float32)
    raise ValueError(f"{path}: user {user!r} has {what} of unsupported type {arr.dtype}")


def read_leaf_file(path: str | Path) -> LeafSplit:
    """Parse one LEAF json file and check it is self-consistent (num_samples = len(x) = len(y))."""
    path = Path(path)
    with open(path, "rb") as fh:
        try:
            blob = json.load(fh)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid json ({err}); the file may be truncated — "
                             "delete it and regenerate it with LEAF's preprocess.sh") from err
    for key in ("users", "num_samples", "user_data"):
        if key not in blob:
            raise ValueError(f"{path} lacks the LEAF key {key!r} (found keys {sorted(blob)})")
    users, counts, data = blob["users"], blob["num_samples"], blob["user_data"]
    if len(users) != len(counts):
        raise ValueError(f"{path}: {len(users)} users but {len(counts)} num_samples entries")
    if len(set(users)) != len(users):
        raise ValueError(f"{path}: duplicate user ids")
    xs, ys = {}, {}
    for user, n in zip(users, counts):
        if user not in data:
            raise ValueError(f"{path}: user {user!r} is listed in 'users' but has no 'user_data'")
        x = _as_array(data[user]["x"], "x", path, user)
        y = _as_array(data[user]["y"], "y", path, user)
        if not len(x) == len(y) == n:
            raise ValueError(f"{path}: user {user!r} has num_samples={n} but {len(x)} x and "
                             f"{len(y)} y entries")
        xs[user], ys[user] = x, y
    return LeafSplit(tuple(users), xs, ys)


def read_leaf_dir(directory: str | Path) -> LeafSplit:
    """Merge every ``*.json`` file of a LEAF split directory (sorted by file name)."""
    directory = Path(directory)
    files = sorted(directory.glob("*.json"))
    if not files:
        raise FileNotFoundError(f"no LEAF *.json files in {directory}")
    users: list[str] = []
    xs: dict[str, np.ndarray] = {}
    ys: dict[str, np.ndarray] = {}
    for f in files:
        part = read_leaf_file(f)
        clash = set(part.users) & set(xs)
        if clash:
            raise ValueError(f"{f}: users {sorted(clash)[:5]} also appear in an earlier file of "
                             f"{directory}")
        users.extend(part.users)
        xs.update(part.x)
        ys.update(part.y)
    return LeafSplit(tuple(users), xs, ys)


def find_leaf_split_dirs(root: str | Path) -> tuple[Path, Path]:
    """Locate ``train/`` and ``test/`` under a LEAF dataset dir (``root`` or ``root/data``)."""
    root = Path(root)
    for base in (root, root / "data"):
        if (base / "train").is_dir() and (base / "test").is_dir():
            return base / "train", base / "test"
    raise FileNotFoundError(f"no LEAF train/ and test/ directories under {root} or {root / 'data'}")


def read_leaf(root: str | Path) -> tuple[LeafSplit, LeafSplit]:
    """Read a LEAF dataset directory -> (train, test) splits."""
    train_dir, test_dir = find_leaf_split_dirs(root)
    return read_leaf_dir(train_dir), read_leaf_dir(test_dir)


def read_leaf_shakespeare(root: str | Path, seq_len: int = 80) -> tuple[LeafSplit, LeafSplit]:
    """LEAF Shakespeare (train, test): checks every ``x`` is a ``seq_len``-character string and every
    ``y`` one character (LEAF's next-character format); values are kept as strings."""
    train, test = read_leaf(root)
    for split in (train, test):
        for u in split.users:
            x, y = split.x[u], split.y[u]
            if len(x) and (x.dtype.kind != "U" or y.dtype.kind != "U"):
                raise ValueError(f"{root}: user {u!r} is not text (Shakespeare x and y are strings)")
            bad = [s for s in x if len(s) != seq_len][:1] + [c for c in y if len(c) != 1][:1]
            if bad:
                raise ValueError(f"{root}: user {u!r} has x of length != {seq_len} or y of length != 1 "
                                 f"(e.g. {bad[0]!r})")
    return train, test
