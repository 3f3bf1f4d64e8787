"""A stage's work as cells (issue 54): a grid setting draws what it draws alone, so its result is the same in
any packing (exactly); the cell store keeps each finished cell and a re-run computes only the missing ones
(a killed run, a grid grown by one value); keys, code digests and the executor's settings. The Ray executor on
a multi-node cluster: tests/integration/test_cells_ray.py."""
import json
import os

import pytest
import torch

from pflkit import cells, stages
from pflkit.data.draws import ClientDraws, LaneDraws
from pflkit.experiments import charles_nn as E

from test_local_update import tiny_data, tiny_model  # the same tiny problem (tests/unit is on sys.path)


# ------------------------------------------------------------------------------------- the draws of a lane
@pytest.mark.parametrize("order", ["replacement", "shuffled"])
def test_every_copy_of_a_lane_pass_draws_what_its_clients_draw_alone(order):
    data = tiny_data(num_clients=5).with_batch_order(order)
    clients = torch.tensor([3, 0, 4])
    alone = data.sample_indices(torch.stack([clients] * 4), 2, ClientDraws(11))  # [steps, M, B]
    many = clients.repeat(3)
    lanes = data.sample_indices(torch.stack([many] * 4), 2, LaneDraws(11, 3, 3))
    for lane in range(3):
        assert torch.equal(lanes[:, lane * 3:(lane + 1) * 3], alone)
    # the stream goes on after the rows as it does alone (a model's dropout seeds come next)
    one, three = ClientDraws(11), LaneDraws(11, 3, 3)
    data.sample_indices(torch.stack([clients] * 4), 2, one)
    data.sample_indices(torch.stack([many] * 4), 2, three)
    draw = lambda g, c, m: torch.randint(0, 2**62, (m, 4), generator=g)  # noqa: E731
    assert torch.equal(three.per_client(many, draw), one.per_client(clients, draw).repeat(3, 1))


def test_a_lane_pass_refuses_copies_that_differ():
    with pytest.raises(ValueError, match="same clients"):
        LaneDraws(1, 2, 2).per_client(torch.tensor([0, 1, 1, 0]), lambda g, c, m: torch.zeros(m))
    with pytest.raises(ValueError, match="2 copies of 2 clients got 3"):
        LaneDraws(1, 2, 2).per_client(torch.tensor([0, 1, 1]), lambda g, c, m: torch.zeros(m))


# ------------------------------------------------------------------------- a cell in any packing: exactly
SETTINGS = [E.Setting(0.1, 0.5), E.Setting(0.05, 0.2, "heavy_ball", 0.9), E.Setting(0.2, 0.3, "nesterov", 0.5),
            E.Setting(0.1, 0.5, alpha=1.0), E.Setting(0.0, 0.4), E.Setting(1e4, 1e3)]  # the last one diverges


def _grid(settings, chunk=None, order="replacement"):
    data, model = tiny_data(num_clients=6).with_batch_order(order), tiny_model()
    evaluate = E.make_evaluator(model, {"train": E.eval_batch(data, "train", 50, 0)})
    return E.run_grid(model, data, settings, rounds=4, local_steps=3, batch_size=2, clients_per_round=3, seed=1,
                      evaluate=evaluate, settings_chunk=chunk)


def _cell(run, g):
    h = run.history[run.history.setting == g][["round", "metric", "value"]].reset_index(drop=True)
    return h, {k: v[g] for k, v in run.params.items()}


@pytest.mark.parametrize("order", ["replacement", "shuffled"])
def test_a_settings_result_is_the_same_whichever_settings_share_its_batch(order):
    """Alone, in the whole grid, chunked two at a time, in reverse order: every setting's history and final
    model are identical (bit for bit), including beside a setting that diverges (the others' batch shrinks)."""
    whole = _grid(SETTINGS, order=order)
    assert whole.diverged["gamma"].tolist() == [1e4]
    chunked, reverse = _grid(SETTINGS, chunk=2, order=order), _grid(SETTINGS[::-1], order=order)
    for g, s in enumerate(SETTINGS):
        h, p = _cell(whole, g)
        for other, at in ((_grid([s], order=order), 0), (chunked, g), (reverse, len(SETTINGS) - 1 - g)):
            h2, p2 = _cell(other, at)
            assert h.equals(h2), (s, at)
            assert all(torch.equal(p[k], p2[k]) for k in p), (s, at)


# ------------------------------------------------------------------------------------------- the store
def _cells(n, group="t"):
    return [cells.Cell(f"c{i}", group, {"i": i}, cells.cell_key({"i": i}, "data", "code")) for i in range(n)]


def _compute(context, pack):
    context["calls"].append([c.name for c in pack])
    if context.get("fail") == len(context["calls"]):
        raise RuntimeError("boom")
    return [({"value": c.config["i"] * 0.5, "curve": [1.0, float("inf")]},
             {"w": torch.full((2,), float(c.config["i"]))}) for c in pack]


def test_a_rerun_computes_only_the_cells_the_store_lacks(tmp_path):
    store, ctx = cells.CellStore(tmp_path), {"calls": []}
    first = cells.run_cells("s", _cells(5), _compute, ctx, store=store, pack_size=2, log=lambda _: None)
    assert (first.computed, first.cached) == (5, 0) and ctx["calls"] == [["c0", "c1"], ["c2", "c3"], ["c4"]]
    record, tensors = first.results[3]
    assert record == {"value": 1.5, "curve": [1.0, float("inf")]} and torch.equal(tensors["w"], torch.full((2,), 3.0))
    ctx["calls"].clear()
    again = cells.run_cells("s", _cells(5), _compute, ctx, store=store, pack_size=2, log=lambda _: None)
    assert (again.computed, again.cached, ctx["calls"]) == (0, 5, [])
    assert [r for r, _ in again.results] == [r for r, _ in first.results]
    assert all(torch.equal(a["w"], b["w"]) for (_, a), (_, b) in zip(again.results, first.results))
    grown = cells.run_cells("s", _cells(6), _compute, ctx, store=store, log=lambda _: None)  # one value more
    assert (grown.computed, grown.cached, ctx["calls"]) == (1, 5, [["c5"]])
    assert store.keys("s") == {c.key for c in _cells(6)}


def test_a_run_killed_midway_keeps_its_finished_cells_and_names_the_failed_ones(tmp_path):
    store, ctx = cells.CellStore(tmp_path), {"calls": [], "fail": 2}
    with pytest.raises(cells.CellError, match=r"cells \['c2', 'c3'\] failed: boom"):
        cells.run_cells("s", _cells(5), _compute, ctx, store=store, pack_size=2, log=lambda _: None)
    assert store.keys("s") == {c.key for c in _cells(2)}  # the first pack, stored before the failure
    assert not list(tmp_path.rglob("*.tmp*"))
    ctx.update(calls=[], fail=None)
    rerun = cells.run_cells("s", _cells(5), _compute, ctx, store=store, pack_size=2, log=lambda _: None)
    assert (rerun.computed, ctx["calls"]) == (3, [["c2", "c3"], ["c4"]])


def test_the_store_layout_the_plan_and_a_missing_tensor_file(tmp_path):
    store = cells.CellStore(tmp_path)
    grid = _cells(3)
    store.write_plan("s", grid, "abc")
    cells.run_cells("s", grid[:2], _compute, {"calls": []}, store=store, log=lambda _: None)
    assert store.progress("s") == (2, 3, "abc")
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == sorted([f"{c.key}.json" for c in grid[:2]]
                                                                        + ["plan.json"])
    assert sorted(p.name for p in (tmp_path / "tensors" / "s").iterdir()) == sorted(f"{c.key}.pt" for c in grid[:2])
    saved = json.loads((tmp_path / "s" / f"{grid[0].key}.json").read_text())
    assert saved["name"] == "c0" and saved["config"] == {"i": 0} and saved["tensors"] is True
    (tmp_path / "tensors" / "s" / f"{grid[0].key}.pt").unlink()
    with pytest.raises(FileNotFoundError, match="dvc pull"):
        store.get("s", grid[0].key)


def test_two_cells_with_one_key_are_refused(tmp_path):
    twice = _cells(2)[:1] * 2
    with pytest.raises(ValueError, match="one key"):
        cells.run_cells("s", twice, _compute, {"calls": []}, store=cells.CellStore(tmp_path), log=lambda _: None)


def test_packs_group_cells_and_respect_the_pack_size():
    mixed = _cells(3, "a") + _cells(2, "b")
    assert [[c.group for c in p] for p in cells.packs_of(mixed, None)] == [["a"] * 3, ["b"] * 2]
    assert [len(p) for p in cells.packs_of(mixed, 2)] == [2, 1, 2]
    assert cells.packs_of([], None) == []


# ---------------------------------------------------------------------------------------- keys and code
def test_a_cell_key_depends_on_config_data_and_code_only():
    k = cells.cell_key({"a": 1, "b": [0.1, 2]}, "d", "c")
    assert k == cells.cell_key({"b": [0.1, 2], "a": 1}, "d", "c") and len(k) == 32
    assert len({k, cells.cell_key({"a": 2, "b": [0.1, 2]}, "d", "c"), cells.cell_key({"a": 1, "b": [0.1, 2]}, "e", "c"),
                cells.cell_key({"a": 1, "b": [0.1, 2]}, "d", "x")}) == 4


def test_the_code_digest_covers_what_the_stage_imports():
    names = {p.name for p in cells.code_files("pflkit.experiments.charles_nn")}
    assert {"charles_nn.py", "draws.py", "local_sgd.py", "federated.py", "cells.py", "__init__.py"} <= names
    assert "plotting.py" not in names and "notebooks.py" not in names  # drawing and the runner: not the cells'
    assert cells.code_digest("pflkit.experiments.charles_nn") == cells.code_digest("pflkit.experiments.charles_nn")
    assert cells.code_digest("pflkit.experiments.charles_nn") != cells.code_digest("pflkit.experiments.charles")


def test_grid_cell_keys_ignore_packing_settings_and_labels():
    cfg = E.CharlesFig13Config.from_namespace({"stage": "charles_fig13", "profile": "smoke"})
    data = tiny_data(num_clients=6)
    a = E.grid_cells(cfg, "femnist", [E.Setting(0.1, 0.5, variant="x")], data)[0]
    b = E.grid_cells(cfg.model_copy(update={"settings_chunk": 1, "threads": 2}), "femnist",
                     [E.Setting(0.1, 0.5, variant="y")], data)[0]
    c = E.grid_cells(cfg.model_copy(update={"seed": 5}), "femnist", [E.Setting(0.1, 0.5)], data)[0]
    assert a.key == b.key != c.key
    assert a.name == "femnist: gamma=0.1, eta=0.5, server=gd, momentum=0, alpha=0" and a.group == "femnist"


# ------------------------------------------------------------------------------------ executor settings
def test_the_executor_setting_and_its_errors(monkeypatch):
    assert cells.Executor.parse(None) == cells.Executor("local")
    ray = cells.Executor.parse("ray:127.0.0.1:6379")
    assert (ray.kind, ray.address, ray.pack_size) == ("ray", "127.0.0.1:6379", None)
    assert cells.Executor.parse("ray").address is None
    for bad in ("slurm", "local:x", "Ray"):
        with pytest.raises(ValueError, match="PFLKIT_EXECUTOR=.*allowed: local, ray, ray:<address>"):
            cells.Executor.parse(bad)
    monkeypatch.setenv("PFLKIT_PACK", "0")
    with pytest.raises(ValueError, match="PFLKIT_PACK='0': allowed: a positive integer"):
        cells.Executor.from_env()
    monkeypatch.setenv("PFLKIT_PACK", "4")
    monkeypatch.setenv("PFLKIT_GPUS", "0.25")
    got = cells.Executor.from_env()
    assert (got.kind, got.pack_size, got.gpus) == ("local", 4, 0.25)
    monkeypatch.setenv("PFLKIT_GPUS", "half")
    with pytest.raises(ValueError, match="PFLKIT_GPUS='half': allowed: a number >= 0"):
        cells.Executor.from_env()


def test_which_profiles_share_the_project_store(monkeypatch, tmp_path):
    monkeypatch.delenv("PFLKIT_CELLS", raising=False)
    assert set(cells.SHARED_PROFILES) == set(stages.PIPELINE_PROFILES) == {"paper"}
    root = cells.default_store("paper").root
    assert root.name == "cells" and root.parent == cells.project_root()
    assert cells.default_store("default").root.parts[-3:] == ("build", "default", "cells")
    assert cells.default_store("smoke").root.parts[-3:] == ("build", "smoke", "cells")
    assert cells.default_store(None).root.parts[-2:] == ("build", "cells")
    canary = cells.CellStore(cells.default_store("canary/paper").root)  # the canary measures: it starts empty
    (canary.root / "s").mkdir(parents=True)
    assert cells.default_store("canary/paper").root == canary.root and not canary.root.exists()
    monkeypatch.setenv("PFLKIT_CELLS", os.fspath(tmp_path))
    assert cells.default_store("default").root == tmp_path


def test_params_yaml_sets_the_executor_and_the_environment_overrides_it_for_one_run(monkeypatch):
    monkeypatch.delenv("PFLKIT_EXECUTOR", raising=False)
    assert cells.Executor.from_env("ray:auto") == cells.Executor("ray", "auto")
    assert cells.Executor.from_env("local") == cells.Executor("local")
    with pytest.raises(ValueError, match="executor='slurm': allowed: local, ray, ray:<address>"):
        cells.Executor.from_env("slurm")
    monkeypatch.setenv("PFLKIT_EXECUTOR", "local")
    assert cells.Executor.from_env("ray:auto") == cells.Executor("local")
    cfg = E.CharlesFig12Config.from_namespace({"stage": "charles_fig12", "profile": "smoke"})
    assert cfg.executor == "local"  # params.yaml's defaults
    with pytest.raises(ValueError, match=r"charles_fig12\.executor: got 'slurm'; allowed: local, ray, ray:<address>"):
        E.CharlesFig12Config.from_namespace({"stage": "charles_fig12", "profile": "smoke", "executor": "slurm"})
