"""Reliability (issue 8): bad input fails before work with key, value and rule; checkpoints round-trip
(generator state included) and a resumed run equals an uninterrupted one; checkpoints never unpickle
objects; the same seed gives the same history in two processes.

Related tests elsewhere: divergence guard (test_eval_runner.py::test_divergence_names_method_round_and_lr,
test_perm.py::test_lr_sweep_records_divergence_and_goes_on), corrupted/truncated dataset files through
load_dataset (test_vision.py::test_truncated_local_file_gives_clear_error, ::test_download_bad_checksum_leaves_nothing,
::test_cifar_pickles_are_not_loaded_before_the_checksum_matches), a killed stage
(tests/integration/test_killed_stage.py)."""
import copy
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from pydantic import BaseModel

from pflkit.config import ConfigError, SimplexWeights, check_simplex, load_params, validate_stage
from pflkit.data.partition import partition_problems
from pflkit.data.vision import image_partition_problems
from pflkit.data.synthetic import perm_synthetic
from pflkit.engine import FunctionalModel
from pflkit.algorithms import FedAvg, PERM
from pflkit.experiments import curves, perm as P
from pflkit.io import (CheckpointError, decode_value, encode_value, load_checkpoint, save_checkpoint,
                       state_from_payload, state_to_payload)
from pflkit.models import logistic
from pflkit import runner
from pflkit.runner import DivergenceError, checkpoint_path, run, run_methods
from stage_params import build, perfedavg_section, perm_section, pfedme_section

ROOT = Path(__file__).resolve().parents[2]
PARAMS = load_params(ROOT / "params.yaml")


def _set(params, dotted, value):
    *path, last = dotted.split(".")
    node = params
    for key in path:
        node = node[key]
    node[last] = value


BAD = [  # (stage, dotted key, bad value, regex the message must match)
    ("perm_fig1", "lr.perm", 0.0, r"perm_fig1\.lr: .*values > 0; bad entries: \{'perm': 0\.0\}"),
    ("perm_fig1", "lr.fedavg", -0.5, r"perm_fig1\.lr: .*bad entries: \{'fedavg': -0\.5\}"),
    ("perm_fig1", "local_steps", 0, r"perm_fig1\.local_steps: .*greater than or equal to 1 \(got 0\)"),
    ("perm_fig1", "rounds", 0, r"perm_fig1\.rounds: .*greater than or equal to 1 \(got 0\)"),
    ("perm_fig1", "num_clients", 1, r"perm_fig1\.num_clients: .*greater than or equal to 2 \(got 1\)"),
    ("perm_fig1", "test_fraction", 0.0, r"perm_fig1\.test_fraction: .*greater than 0 \(got 0\.0\)"),
    ("perm_fig2", "test_fraction", 1.5, r"perm_fig2\.test_fraction: .*less than 1 \(got 1\.5\)"),
    ("perm_fig1", "perm.lam", -1.0, r"perm_fig1\.perm\.lam: .*greater than or equal to 0 \(got -1\.0\)"),
    ("perm_fig1", "pfedme.lam", 0.0, r"perm_fig1\.pfedme\.lam: .*greater than 0 \(got 0\.0\)"),
    ("perm_fig6", "lam", -3.0, r"perm_fig6\.lam: .*greater than 0 \(got -3\.0\)"),
    ("perm_fig1", "methods", ["fedavg", "fedprox"], r"perm_fig1\.methods: .*unknown: \['fedprox'\]"),
    ("perm_fig1", "perm.alpha_solver", "newton", r"perm_fig1\.perm\.alpha_solver: must be one of .*'newton'"),
    ("perm_fig2", "model.name", "resnet1000", r"perm_fig2\.model\.name: must be one of .*'resnet1000'"),
    ("perm_fig2", "partition.scheme", "pathological",
     r"perm_fig2\.partition(\.scheme)?: .*must be one of .*'pathological'"),
    ("perm_fig6", "schemes", {"x": {"scheme": "shards"}}, r"perm_fig6\..*scheme.* must be one of .*'shards'"),
    ("perm_fig1", "rounds", "ten", r"perm_fig1\.rounds: Input should be a valid integer.*'ten'"),
    ("perm_fig1", "seeds", "0", r"perm_fig1\.seeds: Input should be a valid list"),
    ("perm_fig1", "perm.global_lr", "fast", r"perm_fig1\.perm\.global_lr: Input should be a valid number"),
    ("perm_fig1", "learning_rate", 0.1, r"perm_fig1\.learning_rate: unknown key \(value 0\.1\); allowed keys: .*lr"),
    ("perm_fig1", "perm.lamda", 3.0, r"perm_fig1\.perm\.lamda: .*(extra|unknown)"),
    ("perm_fig6", "dataset.nmae", "mnist", r"perm_fig6\.dataset\.nmae: .*(extra|unknown)"),
    ("perm_fig3", "threads", 0, r"perm_fig3\.threads: .*greater than or equal to 1"),
    ("perm_fig4", "eval_every", 0, r"perm_fig4\.eval_every: .*greater than or equal to 1"),
    ("perm_fig1", "device", "gpu", r"perm_fig1\.device: must be one of \('auto', 'cpu', 'cuda'\)"),
    ("charles_fig1", "gamma_fixed", 0.0, r"charles_fig1\.gamma_fixed: .*greater than 0"),
    ("chayti_fig2", "a_wga", 1.5, r"chayti_fig2\.a_wga: .*less than or equal to 1 \(got 1\.5\)"),
    ("perm_alpha_convergence", "lam", -1.0, r"perm_alpha_convergence\.lam: .*greater than 0"),
    # dataset-aware checks (config-level, without loading any pixels)
    pytest.param("perm_fig2", "dataset.name", "cifar11",
                 r"perm_fig2\.dataset\.name: unknown dataset 'cifar11'; allowed"),
    pytest.param("perm_fig4", "dataset.substitute", "fashoin", r"perm_fig4\.dataset\.substitute: unknown dataset"),
    pytest.param("perm_fig2", "partition", {"scheme": "classes", "classes_per_client": 11},
                 r"perm_fig2\.partition\.classes_per_client: 11 exceeds the 10 classes of cifar10; allowed: 1\.\.10"),
    pytest.param("perm_fig6", "schemes", {"x": {"scheme": "classes", "classes_per_client": 12}},
                 r"perm_fig6\.schemes\.x\.classes_per_client: 12 exceeds the 10 classes of mnist"),
    pytest.param("perm_fig2", "num_clients", 20000,
                 r"perm_fig2\.num_clients: 20000 clients need >= 2 samples each .* pool_size is 20000"),
    pytest.param("perm_fig2", "partition", {"scheme": "classes", "classes_per_clent": 2},
                 r"perm_fig2\.partition\.classes_per_clent: unknown option .*allowed: \['classes_per_client'"),
    pytest.param("perm_fig4", "partition", {"scheme": "dirichlet", "beta": 0.0},
                 r"perm_fig4\.partition\.beta: must be a number > 0"),
]


@pytest.mark.parametrize("stage, key, value, match", BAD, ids=[
    f"{c.values[0] if hasattr(c, 'values') else c[0]}.{c.values[1] if hasattr(c, 'values') else c[1]}-{i}"
    for i, c in enumerate(BAD)])
def test_bad_value_is_rejected_naming_key_value_and_rule(stage, key, value, match):
    params = copy.deepcopy(PARAMS)
    _set(params[stage], key, value)
    with pytest.raises(ConfigError, match=match):
        validate_stage(params, stage)


def test_cuda_without_a_gpu_is_rejected_before_work():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    params = copy.deepcopy(PARAMS)
    params["perm_fig2"]["device"] = "cuda"
    with pytest.raises(ConfigError, match=r"perm_fig2\.device: device='cuda' was requested but no CUDA GPU"):
        validate_stage(params, "perm_fig2")


class _Mixing(BaseModel):
    alpha: SimplexWeights


@pytest.mark.parametrize("alpha, ok", [
    ([0.25, 0.75], True), ([[1.0, 0.0], [0.5, 0.5]], True), ([0.5, 0.6], False), ([1.5, -0.5], False),
    ([[1.0, 0.0], [0.7, 0.7]], False), ([], False), ([float("nan"), 1.0], False)])
def test_alpha_must_lie_on_the_simplex(alpha, ok):
    if ok:
        assert _Mixing(alpha=alpha).alpha == alpha
        return
    with pytest.raises(ValueError, match=r"alpha\n.*(simplex|non-empty)"):
        _Mixing(alpha=alpha)
    with pytest.raises(ValueError, match="simplex|non-empty"):
        check_simplex(alpha)


def test_partition_checks_name_key_value_and_allowed():
    assert partition_problems({"scheme": "classes", "classes_per_client": 2}) == []
    assert partition_problems({"scheme": "dirichlet", "beta": 0.3}) == []
    assert partition_problems({"scheme": "classes"}) == [("partition.classes_per_client",
                                                          "required by scheme 'classes'")]
    assert partition_problems({"scheme": "iid", "beta": 1.0})[0][0] == "partition.beta"
    assert partition_problems({"scheme": "natural"}, allow_natural=False)[0][1].startswith("must be one of")
    assert partition_problems({"scheme": "classes", "classes_per_client": 1.5})[0] == \
        ("partition.classes_per_client", "must be an integer >= 1, got 1.5")
    ds = SimpleNamespace(name="cifar100", substitute="fashion-mnist")
    problems = dict(image_partition_problems(ds, {"scheme": "classes", "classes_per_client": 20}, 50, 80))
    assert problems["partition.classes_per_client"] == "20 exceeds the 10 classes of fashion-mnist; allowed: 1..10"
    assert problems["num_clients"].startswith("50 clients need >= 2 samples each")
    assert "<= 40" in problems["num_clients"]
    assert image_partition_problems("cifar100", {"scheme": "classes", "classes_per_client": 20}, 50, 100) == []


def _tiny_images(n_train=30, n_test=10, classes=10):
    from pflkit.data.vision import ImageData
    rng = np.random.default_rng(0)
    return ImageData(rng.random((n_train, 1, 4, 4), dtype=np.float32), np.arange(n_train) % classes,
                     rng.random((n_test, 1, 4, 4), dtype=np.float32), np.arange(n_test) % classes,
                     classes, "tiny", "tiny", "test", None, "memory")


@pytest.mark.parametrize("num_clients, partition, match", [
    (5, {"scheme": "classes", "classes_per_client": 11}, r"classes_per_client must be in \[1, 10\].*got 11"),
    (50, {"scheme": "iid"}, r"num_clients=50 exceeds the 40 samples available"),
    (30, {"scheme": "iid"}, r"client \d+ has 1 samples; each client needs >= 2"),
])
def test_data_that_cannot_fit_fails_when_the_federation_is_built(num_clients, partition, match):
    """The source that actually loads (e.g. 5,000 offline MNIST digits) is checked before training."""
    cfg = SimpleNamespace(partition=partition, pool_size=None, num_clients=num_clients, test_fraction=0.2)
    with pytest.raises(ValueError, match=match):
        P.image_federation(cfg, _tiny_images(), seed=0)


# --------------------------------------------------------------------------- checkpoints
def test_encoded_values_round_trip_through_a_weights_only_file(tmp_path):
    g = torch.Generator().manual_seed(7)
    torch.rand(3, generator=g)
    value = {"w": {"a": torch.randn(2, 3), "b": torch.arange(4)}, "n": 3, "x": 0.5, "none": None,
             "t": (1, "two", torch.ones(1, dtype=torch.float64)), "rows": [(0, "FedAvg", 1, "loss", 0.25)],
             "g": g, "view": torch.arange(100.0)[10:12]}
    save_checkpoint(tmp_path / "c.pt", encode_value(value))
    back = decode_value(load_checkpoint(tmp_path / "c.pt"))
    torch.testing.assert_close(back["w"]["a"], value["w"]["a"])
    assert back["w"]["b"].dtype == torch.int64 and back["t"][2].dtype == torch.float64
    assert isinstance(back["t"], tuple) and back["rows"] == [(0, "FedAvg", 1, "loss", 0.25)]
    assert (back["n"], back["x"], back["none"]) == (3, 0.5, None)
    torch.testing.assert_close(torch.rand(5, generator=back["g"]), torch.rand(5, generator=g))  # same stream
    assert back["view"].tolist() == [10.0, 11.0] and back["view"].untyped_storage().nbytes() == 8
    assert not list(tmp_path.glob("*.tmp*"))
    with pytest.raises(TypeError, match=r"value\['f'\]: cannot checkpoint a function"):
        encode_value({"f": test_encoded_values_round_trip_through_a_weights_only_file})


def test_state_round_trip_keeps_the_generator_shared_and_reattaches_data(tmp_path):
    data = perm_synthetic(6, 30, 5, 0.2, seed=0)
    model = FunctionalModel(lambda: logistic((5,), 2))
    algo = PERM(model, local_steps=2, lr=0.1, batch_size=5, lam=3.0, update_every=2)
    state = algo.init(data, 0)
    for _ in range(3):
        state = algo.round(state)
    save_checkpoint(tmp_path / "s.pt", state_to_payload(state))
    assert "data" not in load_checkpoint(tmp_path / "s.pt")["fields"]
    fresh = algo.init(data, 0)
    back = state_from_payload(fresh, load_checkpoint(tmp_path / "s.pt"))
    assert back.data is data and back.generator is fresh.generator and back.round == 3
    torch.testing.assert_close(back.alpha, state.alpha)
    assert torch.equal(back.sigma, state.sigma) and back.shuffle_round == state.shuffle_round
    nxt, ref = algo.round(back), algo.round(state)  # both continue identically (same random draws)
    for k in ref.v:
        assert torch.equal(nxt.v[k], ref.v[k])
    with pytest.raises(CheckpointError, match="holds a 'PERMState' state, expected 'FedAvgState'"):
        state_from_payload(FedAvg(model, local_steps=1, lr=0.1, batch_size=5).init(data, 0),
                           load_checkpoint(tmp_path / "s.pt"))


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_checkpoints_never_unpickle_objects(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.save({"evil": _Boom()}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match=r"cannot read checkpoint .*evil\.pt.*Delete it"):
        load_checkpoint(tmp_path / "evil.pt")
    assert not (tmp_path / "PWNED").exists()
    (tmp_path / "cut.pt").write_bytes((tmp_path / "evil.pt").read_bytes()[:40])
    with pytest.raises(CheckpointError, match="cut.pt"):
        load_checkpoint(tmp_path / "cut.pt")


SETTINGS = dict(stage="perm_fig1", results_dir="x", figures_dir="y", device="cpu", num_clients=6,
                samples_per_client=30, dim=5, test_fraction=0.2, rounds=7, local_steps=2, batch_size=5,
                lr={k: 0.1 for k in curves.CURVE_METHODS}, finetune_steps=2, finetune_lr=0.1,
                methods=list(curves.CURVE_METHODS),
                seeds=[0], eval_every=2,
                perm=perm_section(lam=3.0, alpha_solver="gd", global_lr=0.1, update_every=2, warmup_rounds=2,
                                  alpha_init="estimate"),
                perfedavg=perfedavg_section(alpha=0.02), pfedme=pfedme_section(personal_lr=0.01, lam=15.0),
                perm_torchfed={"warmup_rounds": 2}, ditto={"lam": 0.1, "personal_steps": None},
                perm_alpha=perm_section(lam=3.0, alpha_solver="gd", global_lr=0.1, update_every=2))


class _Interrupted(Exception):
    pass


def _stop_after(algo, rounds_done):
    """Make ``algo.round`` raise once it has run ``rounds_done`` rounds (a kill, in-process)."""
    original, calls = algo.round, [0]

    def round_(s):
        if calls[0] == rounds_done:
            raise _Interrupted
        calls[0] += 1
        return original(s)
    algo.round = round_
    return algo


@pytest.mark.parametrize("every, stop", [(1, 5), (2, 5), (3, 6)])
@pytest.mark.parametrize("key", sorted(curves.CURVE_METHODS))
def test_resumed_run_equals_uninterrupted(tmp_path, key, every, stop):
    cfg = build("perm_fig1", **SETTINGS)
    model = FunctionalModel(lambda: logistic((5,), 2))
    data = perm_synthetic(6, 30, 5, 0.2, seed=0)
    name, make = curves.METHODS[key].name, curves.METHODS[key].make
    full = run(make(model, cfg), data, 7, 0, 2, method=name)
    ckpt = tmp_path / "run.pt"
    with pytest.raises(_Interrupted):
        run(_stop_after(make(model, cfg), stop), data, 7, 0, 2, method=name, checkpoint=ckpt, checkpoint_every=every)
    assert load_checkpoint(ckpt)["round"] == stop - stop % every
    keep = {}
    resumed = run(make(model, cfg), data, 7, 0, 2, method=name, checkpoint=ckpt, checkpoint_every=every, keep=keep)
    pd.testing.assert_frame_equal(resumed, full)
    assert keep[(name, 0)].round == 7 and keep[(name, 0)].data is data


def test_run_methods_resumes_skips_finished_runs_and_cleans_up(tmp_path, monkeypatch):
    model = FunctionalModel(lambda: logistic((5,), 2))
    cfg = build("perm_fig1", **SETTINGS)

    def factory(key, stop=None):
        def make():
            algo = curves.METHODS[key].make(model, cfg)
            return algo if stop is None else _stop_after(algo, stop)
        return make

    keys = ["fedavg", "perm"]
    data_for_seed = lambda s: perm_synthetic(6, 30, 5, 0.2, seed=s)  # noqa: E731
    full_states = {}
    full = run_methods({curves.METHODS[k].name: factory(k) for k in keys}, data_for_seed, [0, 1], 6, 2,
                       show_progress=False, keep=full_states)
    ckdir = tmp_path / "checkpoints"
    killed = {curves.METHODS["fedavg"].name: factory("fedavg"), curves.METHODS["perm"].name: factory("perm", stop=4)}
    with pytest.raises(_Interrupted):
        run_methods(killed, data_for_seed, [0, 1], 6, 2, show_progress=False, checkpoint_dir=ckdir,
                    checkpoint_every=3)
    assert sorted(p.name for p in ckdir.iterdir()) == ["FedAvg__seed0.pt", "PERM__seed0.pt"]
    assert load_checkpoint(checkpoint_path(ckdir, "FedAvg", 0))["round"] == 6  # finished
    assert load_checkpoint(checkpoint_path(ckdir, "PERM", 0))["round"] == 3
    seen = []
    original_round = FedAvg.round
    monkeypatch.setattr(FedAvg, "round", lambda self, s: seen.append(s.seed) or original_round(self, s))
    states = {}
    resumed = run_methods({curves.METHODS[k].name: factory(k) for k in keys}, data_for_seed, [0, 1], 6, 2,
                          show_progress=False, keep=states, checkpoint_dir=ckdir, checkpoint_every=3)
    pd.testing.assert_frame_equal(resumed, full)
    assert 0 not in seen and seen.count(1) == 6, "the finished FedAvg seed-0 run is read back, not re-run"
    torch.testing.assert_close(states[("PERM", 0)].alpha, full_states[("PERM", 0)].alpha)
    assert not ckdir.exists(), "checkpoints are removed once every run has finished"


def test_checkpoint_for_other_settings_is_ignored(tmp_path, capsys):
    model = FunctionalModel(lambda: logistic((5,), 2))
    data = perm_synthetic(6, 30, 5, 0.2, seed=0)
    fed = lambda lr: FedAvg(model, local_steps=2, lr=lr, batch_size=5)  # noqa: E731
    ckpt = tmp_path / "c.pt"
    run(fed(0.5), data, 4, 0, checkpoint=ckpt)  # a finished run at lr 0.5
    other = run(fed(0.1), data, 4, 0, checkpoint=ckpt)
    assert "written for other settings" in capsys.readouterr().err
    pd.testing.assert_frame_equal(other, run(fed(0.1), data, 4, 0))
    ckpt.write_bytes(b"garbage")
    again = run(fed(0.1), data, 4, 0, checkpoint=ckpt)
    err = capsys.readouterr().err
    assert f"cannot use checkpoint {ckpt}: unreadable (UnpicklingError: not a plain tensors-and-containers " \
           "file (Unsupported operand 103)); starting this run afresh" in err
    pd.testing.assert_frame_equal(again, other)


def _fedavg_run(tmp_path, **kwargs):
    model = FunctionalModel(lambda: logistic((5,), 2))
    data = perm_synthetic(6, 30, 5, 0.2, seed=0)
    return run(FedAvg(model, local_steps=2, lr=0.1, batch_size=5), data, 4, 0, method="FedAvg", **kwargs)


def test_checkpoint_written_by_other_code_is_ignored(tmp_path, capsys, monkeypatch):
    """Issue 16.2: the fingerprint covers the package source and the notebook twin."""
    monkeypatch.setenv("PFLKIT_PROGRESS", str(tmp_path / "progress.txt"))  # the stage runner's terminal
    monkeypatch.delenv(runner.TWIN_ENV, raising=False)
    clean = _fedavg_run(tmp_path)
    ckpt = tmp_path / "c.pt"
    _fedavg_run(tmp_path, checkpoint=ckpt)
    assert load_checkpoint(ckpt)["round"] == 4 and load_checkpoint(ckpt)["code"]["source"] == runner.source_digest()
    pd.testing.assert_frame_equal(_fedavg_run(tmp_path, checkpoint=ckpt), clean)
    assert f"resuming FedAvg seed 0 from round 4 of 4 ({ckpt})" in capsys.readouterr().err  # same code: resumed
    orig_round = FedAvg.round
    rounds_run = []
    monkeypatch.setattr(FedAvg, "round", lambda self, s: rounds_run.append(s.round) or orig_round(self, s))

    monkeypatch.setattr(runner, "source_digest", lambda: "0" * 64)  # as if src/pflkit had been edited
    pd.testing.assert_frame_equal(_fedavg_run(tmp_path, checkpoint=ckpt), clean)
    err = capsys.readouterr().err
    said = (f"ignoring checkpoint {ckpt}: written by other code (the pflkit source has changed since); "
            "starting this run afresh")
    assert said in err and "resuming" not in err and rounds_run == [0, 1, 2, 3]
    assert said in (tmp_path / "progress.txt").read_text().splitlines()

    rounds_run.clear()
    monkeypatch.setenv(runner.TWIN_ENV, "f" * 64)  # the notebook twin changed
    pd.testing.assert_frame_equal(_fedavg_run(tmp_path, checkpoint=ckpt), clean)
    err = capsys.readouterr().err
    assert "written by other code (the notebook has changed since)" in err and rounds_run == [0, 1, 2, 3]
    a = runner.run_fingerprint(FedAvg(None, local_steps=2, lr=0.1, batch_size=5), "FedAvg", 0, 4, 1, "t")
    monkeypatch.setenv(runner.TWIN_ENV, "e" * 64)
    assert runner.run_fingerprint(FedAvg(None, local_steps=2, lr=0.1, batch_size=5), "FedAvg", 0, 4, 1, "t") != a


def test_source_digest_covers_every_package_file_and_is_computed_once(monkeypatch):
    import hashlib

    import pflkit
    root = Path(pflkit.__file__).parent
    h = hashlib.sha256()
    for rel, path in sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*.py")):
        h.update(f"{rel}\0{path.stat().st_size}\0".encode() + path.read_bytes())
    runner.source_digest.cache_clear()
    assert runner.source_digest() == h.hexdigest()
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail("read again"))
    assert runner.source_digest() == h.hexdigest()  # cached: no file is read twice in a process


def _edit_saved_state(ckpt, edit):
    saved = load_checkpoint(ckpt)
    edit(saved["state"]["fields"])
    save_checkpoint(ckpt, saved)


def _tensor(t):
    return {"__kind__": "tensor", "value": t, "device": "cpu"}


@pytest.mark.parametrize("edit, reason", [
    (lambda f: f["w"]["value"]["1.weight"].update(value=torch.zeros(3, 5)),
     r"FedAvgState\.w\['1\.weight'\]: saved tensor has shape \[3, 5\] dtype float32, this run's state needs "
     r"shape \[2, 5\] dtype float32"),
    (lambda f: f["w"]["value"]["1.bias"].update(value=torch.zeros(2, dtype=torch.float64)),
     r"FedAvgState\.w\['1\.bias'\]: saved tensor has shape \[2\] dtype float64, this run's state needs "
     r"shape \[2\] dtype float32"),
    (lambda f: f["w"]["value"].pop("1.bias"),
     r"FedAvgState\.w: saved dict keys differ from this run's state: missing \['1\.bias'\], unexpected \[\]"),
    (lambda f: f["w"]["value"].update({"2.weight": _tensor(torch.zeros(1))}),
     r"FedAvgState\.w: .*missing \[\], unexpected \['2\.weight'\]"),
    (lambda f: f.update(w=_tensor(torch.zeros(2))), r"FedAvgState\.w: saved tensor, expected a dict"),
    (lambda f: f["w"]["value"].update({"1.bias": 0.5}),
     r"FedAvgState\.w\['1\.bias'\]: saved a float, expected a tensor \(shape \[2\] dtype float32\)"),
    (lambda f: f.update(round="four"), r"FedAvgState\.round: saved str 'four', expected a int"),
    (lambda f: f["generator"].update(value=torch.zeros(3, dtype=torch.uint8)),
     r"FedAvgState\.generator: not a valid cpu generator state"),
])
def test_checkpoint_that_does_not_fit_the_state_is_named_and_the_run_starts_afresh(tmp_path, capsys, monkeypatch,
                                                                                    edit, reason):
    """Issue 16.3: a wrong shape / dtype / key in a checkpoint names the file and the field, then runs afresh."""
    import re
    monkeypatch.setenv("PFLKIT_PROGRESS", str(tmp_path / "progress.txt"))
    clean = _fedavg_run(tmp_path)
    ckpt = tmp_path / "c.pt"
    _fedavg_run(tmp_path, checkpoint=ckpt, checkpoint_every=2)
    _edit_saved_state(ckpt, edit)
    capsys.readouterr()
    pd.testing.assert_frame_equal(_fedavg_run(tmp_path, checkpoint=ckpt, checkpoint_every=2), clean)
    err = capsys.readouterr().err
    pattern = rf"cannot use checkpoint {re.escape(str(ckpt))}: {reason}.*; starting this run afresh\n"
    assert re.search(pattern, err), err
    assert "resuming" not in err
    assert re.search(pattern, (tmp_path / "progress.txt").read_text())
    assert load_checkpoint(ckpt)["state"]["fields"]["w"]["value"]["1.weight"]["value"].shape == (2, 5)  # rewritten


def test_a_checkpoint_that_does_not_fit_leaves_the_template_untouched(tmp_path):
    model = FunctionalModel(lambda: logistic((5,), 2))
    data = perm_synthetic(6, 30, 5, 0.2, seed=0)
    algo = FedAvg(model, local_steps=2, lr=0.1, batch_size=5)
    state = algo.round(algo.round(algo.init(data, 0)))
    payload = state_to_payload(state)
    payload["fields"]["w"]["value"]["1.bias"]["value"] = torch.zeros(7)
    fresh = algo.init(data, 0)
    before = fresh.generator.get_state()
    with pytest.raises(CheckpointError, match=r"FedAvgState\.w\['1\.bias'\]: saved tensor has shape \[7\]"):
        state_from_payload(fresh, payload)
    assert torch.equal(fresh.generator.get_state(), before)  # the generator field came before w: not yet set
    with pytest.raises(CheckpointError, match="not a state payload"):
        state_from_payload(fresh, ["junk"])


def test_perm_state_round_trips_with_fields_unset_in_the_fresh_state(tmp_path):
    """A fresh PERM state (warm-up: v, alpha, sigma) holds None where a later one holds tensors: any
    saved value is accepted there."""
    data = perm_synthetic(6, 30, 5, 0.2, seed=0)
    model = FunctionalModel(lambda: logistic((5,), 2))
    algo = PERM(model, local_steps=2, lr=0.1, batch_size=5, lam=3.0, update_every=2, warmup_rounds=1)
    fresh = algo.init(data, 0)
    state = fresh
    for _ in range(3):
        state = algo.round(state)
    unset = [f for f in ("v", "alpha", "sigma") if getattr(fresh, f) is None]
    assert unset and all(getattr(state, f) is not None for f in unset)
    back = state_from_payload(algo.init(data, 0), state_to_payload(state))
    torch.testing.assert_close(back.alpha, state.alpha)
    assert torch.equal(back.sigma, state.sigma) and back.v.keys() == state.v.keys()


def test_long_load_errors_are_cut_at_a_sentence_or_word_never_mid_word(tmp_path, monkeypatch):
    from pflkit.io import shorten
    text = "The first sentence is here. " * 20
    cut = shorten(text)
    assert cut.endswith("here. ...") and len(cut) <= 305
    words = shorten("abcdefgh " * 60)
    assert words.endswith("abcdefgh ...") and len(words) <= 305
    assert shorten("short. text") == "short. text"

    def boom(*args, **kwargs):
        raise RuntimeError("the loader failed because " + "something was wrong " * 40)
    monkeypatch.setattr(torch, "load", boom)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path / "x.pt")
    import re
    assert re.search(r" (something|was|wrong) \.\.\. Delete it \(or its folder\)", str(info.value)), str(info.value)
    assert info.value.reason.startswith("RuntimeError: the loader failed because something was wrong")


def test_divergence_with_checkpointing_names_method_round_and_lr(tmp_path):
    model = FunctionalModel(lambda: logistic((5,), 2))
    data = perm_synthetic(6, 30, 5, 0.2, seed=0)
    with pytest.raises(DivergenceError, match=r"FedAvg diverged at round 1 \(seed 3, lr=inf\)"):
        run(FedAvg(model, local_steps=3, lr=float("inf"), batch_size=5), data, 6, 3, checkpoint=tmp_path / "c.pt",
            checkpoint_every=1)


# --------------------------------------------------------------------------- determinism across processes
_HISTORY_SCRIPT = """
import sys, torch
from pflkit.algorithms import FedAvg, PERM, PFedMe
from pflkit.data.synthetic import perm_synthetic
from pflkit.engine import FunctionalModel
from pflkit.models import logistic
from pflkit.runner import run_methods
model = FunctionalModel(lambda: logistic((5,), 2))
methods = {"FedAvg": lambda: FedAvg(model, local_steps=2, lr=0.1, batch_size=5),
           "PERM": lambda: PERM(model, local_steps=2, lr=0.5, batch_size=5, lam=3.0, update_every=2),
           "pFedMe": lambda: PFedMe(model, lr=0.1, personal_lr=0.05, lam=15.0, local_steps=2, batch_size=5)}
h = run_methods(methods, lambda s: perm_synthetic(6, 30, 5, 0.2, seed=s), [0, 1], 4, 1, show_progress=False)
h.to_csv(sys.argv[1], index=False, float_format="%.17g")
"""


def test_same_seed_same_history_across_two_processes(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "random"}
    outs = []
    for i in range(2):
        out = tmp_path / f"h{i}.csv"
        done = subprocess.run([sys.executable, "-c", _HISTORY_SCRIPT, str(out)], env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        outs.append(out.read_text())
    assert outs[0] == outs[1]
    h = pd.read_csv(tmp_path / "h0.csv")
    assert len(h) > 50 and h["value"].nunique() > 10 and set(h["method"]) >= {"FedAvg", "PERM", "pFedMe"}
