"""LEAF json reader: exact round trip of FEMNIST-style and Shakespeare-style files, and bad files."""
from __future__ import annotations

import json

import numpy as np
import pytest

from pflkit.data.leaf import find_leaf_split_dirs, read_leaf, read_leaf_dir, read_leaf_file


def _write_leaf(path, user_data: dict, hierarchies=None):
    blob = {"users": list(user_data), "num_samples": [len(v["y"]) for v in user_data.values()],
            "user_data": user_data}
    if hierarchies is not None:
        blob["hierarchies"] = hierarchies
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(blob))
    return blob


def _femnist_users(rng, names, sizes):
    return {u: {"x": rng.random((n, 784)).round(4).tolist(), "y": rng.integers(0, 62, n).tolist()}
            for u, n in zip(names, sizes)}


def test_femnist_dir_round_trip_is_exact(tmp_path):
    rng = np.random.default_rng(0)
    a = _femnist_users(rng, ["f0001_12", "f0002_40"], [3, 5])
    b = _femnist_users(rng, ["f0100_07"], [4])
    _write_leaf(tmp_path / "train" / "all_data_0_niid_train.json", a)
    _write_leaf(tmp_path / "train" / "all_data_1_niid_train.json", b)
    split = read_leaf_dir(tmp_path / "train")
    assert split.users == ("f0001_12", "f0002_40", "f0100_07")
    assert split.num_samples == {"f0001_12": 3, "f0002_40": 5, "f0100_07": 4}
    for u, d in {**a, **b}.items():
        assert split.x[u].dtype == np.float32 and split.x[u].shape == (len(d["y"]), 784)
        np.testing.assert_array_equal(split.x[u], np.asarray(d["x"], dtype=np.float32))
        assert split.y[u].dtype == np.int64
        np.testing.assert_array_equal(split.y[u], d["y"])
    x, y, w = split.flatten()
    assert x.shape == (12, 784) and y.shape == (12,)
    np.testing.assert_array_equal(w, [0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2])
    np.testing.assert_array_equal(y[3:8], a["f0002_40"]["y"])
    x2, y2, w2 = split.flatten(["f0100_07"])
    np.testing.assert_array_equal(y2, b["f0100_07"]["y"])
    assert set(w2.tolist()) == {0}


def test_shakespeare_strings_and_float_labels(tmp_path):
    users = {"THE_TEMPEST_MIRANDA": {"x": ["a" * 80, "b" * 80], "y": ["c", "d"]},
             "HAMLET_HAMLET": {"x": ["To be, or not to be".ljust(80)], "y": [" "]}}
    _write_leaf(tmp_path / "s.json", users, hierarchies=["tempest", "hamlet"])
    split = read_leaf_file(tmp_path / "s.json")
    assert split.x["THE_TEMPEST_MIRANDA"].tolist() == ["a" * 80, "b" * 80]
    assert split.y["HAMLET_HAMLET"].tolist() == [" "]
    _write_leaf(tmp_path / "f.json", {"u": {"x": [[0.5, 1.0]], "y": [3.0]}})
    y = read_leaf_file(tmp_path / "f.json").y["u"]
    assert y.dtype == np.int64 and y.tolist() == [3]


def test_bad_leaf_files_raise_clear_errors(tmp_path):
    blob = _write_leaf(tmp_path / "a.json", {"u1": {"x": [[0.1], [0.2]], "y": [1, 2]}})
    blob["num_samples"] = [3]
    (tmp_path / "bad_count.json").write_text(json.dumps(blob))
    with pytest.raises(ValueError, match="num_samples=3 but 2 x"):
        read_leaf_file(tmp_path / "bad_count.json")
    (tmp_path / "trunc.json").write_text((tmp_path / "a.json").read_text()[:-10])
    with pytest.raises(ValueError, match="truncated"):
        read_leaf_file(tmp_path / "trunc.json")
    (tmp_path / "nokey.json").write_text(json.dumps({"users": []}))
    with pytest.raises(ValueError, match="num_samples"):
        read_leaf_file(tmp_path / "nokey.json")
    _write_leaf(tmp_path / "d" / "1.json", {"u1": {"x": [[0.1]], "y": [1]}})
    _write_leaf(tmp_path / "d" / "2.json", {"u1": {"x": [[0.2]], "y": [2]}})
    with pytest.raises(ValueError, match="also appear"):
        read_leaf_dir(tmp_path / "d")
    with pytest.raises(FileNotFoundError, match="no LEAF"):
        read_leaf_dir(tmp_path / "empty")


def test_read_leaf_finds_train_and_test_under_data(tmp_path):
    rng = np.random.default_rng(1)
    _write_leaf(tmp_path / "femnist" / "data" / "train" / "t.json", _femnist_users(rng, ["a"], [2]))
    _write_leaf(tmp_path / "femnist" / "data" / "test" / "t.json", _femnist_users(rng, ["a"], [1]))
    tr_dir, te_dir = find_leaf_split_dirs(tmp_path / "femnist")
    assert tr_dir == tmp_path / "femnist" / "data" / "train"
    train, test = read_leaf(tmp_path / "femnist")
    assert train.num_samples == {"a": 2} and test.num_samples == {"a": 1}
    with pytest.raises(FileNotFoundError, match="train/ and test/"):
        find_leaf_split_dirs(tmp_path)
