"""The benchmark code keeps working (tiny sizes; no timing assertions)."""
import json

import pytest

from repo_files import load



def _load(name):
    return load(f"benchmarks/{name}.py")


def test_speed_benchmark_writes_its_tables(tmp_path, capsys):
    speed = _load("speed")
    res = speed.main(["--quick", "--threads", "1", "--device", "cpu", "--out", str(tmp_path)])
    # every workload x {FedAvg round, PERM shuffle round}, each with both sides timed
    assert [(r["workload"], r["algorithm"]) for r in res["speed"]] == [
        (w, a) for w in ("synthetic", "mlp", "cnn") for a in ("FedAvg round", "PERM shuffle round")]
    for r in res["speed"]:
        assert r["batched"]["median_s"] > 0 and r["reference"]["median_s"] > 0
        assert r["gflop_per_round"] > 0 and r["ceiling_gflops"] > 0 and r["machine_bmm_gflops"] > 0
        assert r["clients"] == 3 and r["local_steps"] == 2
    # FLOPs counted on the reference arithmetic: the MLP step costs more than the logistic one
    flops = {r["workload"]: r["gflop_per_round"] for r in res["speed"]}
    assert flops["mlp"] > flops["synthetic"]
    assert [(p["workload"], p["clients"]) for p in res["scaling"]] == [("synthetic", 2), ("synthetic", 4), ("mlp", 3)]
    assert all(p["median_s"] > 0 and p["round_peak_bytes"] >= 0 and p["data_bytes"] > 0 for p in res["scaling"])
    saved = json.loads((tmp_path / "speed.json").read_text())
    assert len(saved["speed"]) == 6 and len(saved["targets"]) == 6 + 1 + 1
    table = (tmp_path / "speed.md").read_text()
    assert "| MLP 2x8 on 28x28, N=3 | FedAvg round | 1 |" in table
    assert "matmul" not in capsys.readouterr().err


def test_threads_benchmark_writes_its_table(tmp_path):
    threads = _load("threads")
    res = threads.main(["--quick", "--threads", "1", "--out", str(tmp_path)])
    assert [(r["threads"], r["busy_core"]) for r in res["rows"]] == [("1", False), ("1", True)]
    assert all(r["status"] == "ok" and r["seconds"] > 0 for r in res["rows"])
    assert "| perm_fig1 | 1 | busy |" in (tmp_path / "threads.md").read_text()


def test_uneven_benchmark_writes_its_table(tmp_path):
    uneven = _load("uneven")
    res = uneven.main(["--quick", "--threads", "1", "--out", str(tmp_path)])
    w = res["workload"]
    assert w["clients"] == 6 and w["train_rows"] < w["padded_train_rows"]
    assert all(res["eval"][k]["median_s"] > 0 for k in ("buckets", "loop", "padded"))
    assert {p["path"] for p in res["memory"]["points"]} == {"buckets", "flat", "padded"}
    assert res["memory"]["real_rows_activation_bytes"] > 0
    assert all(res["alpha"][k]["median_s"] > 0 for k in ("alpha_update", "alpha_update_buckets", "alpha_update_padded",
                                                        "fedavg_round", "fedavg_round_reference"))
    assert [t["what"].split()[0] for t in res["targets"]] == ["evaluation", "full-gradient", "full-gradient", "PERM",
                                                              "PERM"]
    saved = json.loads((tmp_path / "uneven.json").read_text())
    assert saved["workload"] == w
    assert "| evaluation (test split), ms |" in (tmp_path / "uneven.md").read_text()


def test_flower_benchmark_writes_its_table(tmp_path):
    """In-process only (the Flower engines need the extra; benchmarks/results/flower.md has them all)."""
    flower = _load("flower")
    res = flower.main(["--quick", "--engines", "in-process", "--out", str(tmp_path)])
    [run] = res["runs"]
    assert run["engine"] == "in-process" and run["clients"] == 3 and run["peak_rss_mb"] > 0
    assert [m["method"] for m in run["methods"]] == ["FedAvg", "PERM"]
    assert all(len(m["round_seconds"]) == 2 and 0 <= m["accuracy"] <= 1 for m in run["methods"])
    assert "| in-process | 3 | PERM |" in (tmp_path / "flower.md").read_text()


def test_alpha_memory_benchmark_measures_one_alpha_per_budget(tmp_path):
    """perm_fig2's alpha computation on the smoke profile (seconds), one fresh process per budget."""
    bench = _load("alpha_memory")
    res = bench.main(["--profile", "smoke", "--budgets", "64,1", "--out", str(tmp_path)])
    big, small = res["points"]
    assert (big["budget_mib"], small["budget_mib"]) == (64, 1) and small["rows_per_call"] < big["rows_per_call"]
    for p in res["points"]:
        assert p["alpha_finite"] and p["seconds"] > 0 and p["peak_rss_bytes"] > 0 and p["model"] == "cnn"
    assert "| 1 MiB |" in (tmp_path / "alpha_memory.md").read_text()


def test_paper_estimates_multiply_a_timed_round_out_and_say_what_they_skipped(tmp_path):
    """On the smoke profile (seconds): every method of a curve stage and every task of a grid stage gets a
    timed round; the estimate is that time multiplied out as the docstring says (checked from the detail);
    a skipped method makes the row a lower bound."""
    bench = _load("paper_estimates")
    out = tmp_path / "est"
    bench.main(["--profile", "smoke", "--stages", "perm_fig4,charles_fig12", "--out", str(out),
                "--skip", "perm_fig4:perfedavg_fo", "--note", "a note"])
    rows = {e["stage"]: e for e in json.loads(out.with_suffix(".json").read_text())["stages"]}
    curves, grid = rows["perm_fig4"], rows["charles_fig12"]
    assert curves["complete"] is False
    assert curves["detail"]["Per-FedAvg (FO)"] == {"skipped": "not timed here (see the note)"}
    assert set(curves["detail"]) == {"Local", "Localized FedAvg", "PERM", "Per-FedAvg (FO)"}
    assert abs(curves["seconds"] - sum(d.get("seconds_per_seed", 0) for d in curves["detail"].values())) < 0.5
    assert grid["complete"] is True and set(grid["detail"]) == {"femnist", "cifar100"}
    for task in grid["detail"].values():  # set-up + rounds x chunks x a chunk's round (all settings in one chunk)
        assert task["chunk"] == task["settings"] == 4  # smoke: 4 gammas, no settings_chunk
        assert task["setup_s"] >= 0 and task["chunk_round_s"] >= 0
        assert abs(task["seconds"] - (task["setup_s"] + task["rounds"] * task["chunk_round_s"])) < 0.2
    md = out.with_suffix(".md").read_text()
    assert "| perm_fig4 | smoke | cpu | more than " in md and "NOT perfedavg_fo" in md and "a note" in md


def test_cnn_stacked_benchmark_writes_its_table(tmp_path):
    bench = _load("cnn_stacked")
    res = bench.main(["--quick", "--out", str(tmp_path)])
    (row,) = res["layouts"]
    assert set(row["median_s"]) == {"loop", "grouped", "vmap", "reference"} and min(row["median_s"].values()) > 0
    assert max(row["max_abs_diff_to_vmap"].values()) < 1e-5  # float32, one round, same draws
    table = (tmp_path / "cnn_stacked.md").read_text()
    assert "| tiny CNN | cpu | 1 |" in table and "not measured (no device lent)" in table
    assert json.loads((tmp_path / "cnn_stacked.json").read_text())["conv_layout"] == {"cpu": "loop"}


def test_flower_floor_table_sets_pflkits_rounds_beside_stock_flowers_floor():
    """The table from crafted measurements (the deployment itself runs in tests/integration/test_flower.py): each
    floor row, and each method's round against the floor's model round times its training passes plus its
    in-process round, and against the floor whose ClientApp imports torch."""
    floor = _load("flower_floor")
    out = {"nodes": 10, "cores": 2, "floats": 122, "simulation_round": 0.1, "machine": "X, 2 cores",
           "load": [0.5, 4.0], "profile": "default", "in_process": {"FedAvg": 0.5, "PERM": 1.0},
           "floor": {"empty": {"seconds": [2.0, 3.0], "busy": [0.7, 0.9]},
                     "model": {"seconds": [3.0, 3.0], "busy": [0.8, 0.8]},
                     "flower": {"seconds": [6.0, 6.0], "busy": [0.5, 0.5]},
                     "torch": {"seconds": [3.5, 3.5], "busy": [0.9, 0.9]}},
           "pflkit": [{"method": "FedAvg", "round_seconds": [4.0, 3.0], "passes": [1, 1]},
                      {"method": "PERM", "round_seconds": [5.0, 11.0], "passes": [1, 3]}]}
    md = floor.table(out)
    assert "| floor | empty | pulled every 0.05 s | 2 | 2.500 | 2.000 | 3.000 | 80% |" in md
    assert "| floor | 122 float32 each way | Flower's send_and_receive (3 s between pulls) | 2 | 6.000 |" in md
    assert "| floor | 122 float32 each way, the ClientApp imports torch | pulled every 0.05 s | 2 | 3.500 |" in md
    assert "| FedAvg | 2 | 1.0 | 3.500 | 3.000 | 0.500 | 1.00x | 0.88x | 35x |" in md  # 3.5 / (3.5 + 0.5)
    assert "| PERM | 2 | 2.0 | 8.000 | 6.000 | 1.000 | 1.14x | 1.00x | 80x |" in md  # 8 / (3.5 * 2 + 1)
    assert "10 SuperNodes on X, 2 cores, the deployment pinned to 2 of them" in md
    assert floor.passes_per_round([{"round": 0, "kind": "train"}, {"round": 1, "kind": "train"},
                                   {"round": 1, "kind": "evaluate"}, {"round": 2, "kind": "train"},
                                   {"round": 2, "kind": "train"}], 2) == [1, 2]


def test_flower_requests_counts_each_rounds_requests_and_the_waits_for_objects():
    """A crafted log of two rounds (the first left out): requests per round by process and path, and one
    object wait (a second ask for an object 1 s after the first, nothing between), exactly."""
    bench = _load("flower_requests")
    log = "\n".join([
        "10.0 0.01 1 flwr-serverapp /v1/runtime/push-messages",  # round 0 (left out)
        "10.1 0.01 2 flower-supernode /v1/fleet/pull-object",
        "11.1 0.01 2 flower-supernode /v1/fleet/pull-object",  # a wait, but in round 0
        "12.0 0.02 1 flwr-serverapp /v1/runtime/push-messages",  # round 1
        "12.1 0.01 2 flower-supernode /v1/fleet/pull-object",  # 1 s after its last ask, but that was round 0
        "12.2 0.01 2 flower-supernode /v1/fleet/pull-object",  # 0.09 s later: no wait
        "12.3 0.04 1 flwr-serverapp /v1/runtime/pull-object",
        "13.34 0.01 1 flwr-serverapp /v1/runtime/pull-object",  # 1.0 s after the end of the last: a wait
        "13.5 0.01 1 flwr-serverapp /v1/runtime/pull-messages",
        "13.9 0.01 1 flwr-serverapp /v1/runtime/pull-object",  # a request between: no wait
        "14.0 0.01 1 flwr-serverapp /v1/runtime/push-messages",  # round 2 (the last, its end unknown)
    ])
    rows = bench.read_log(log)
    s = bench.summarize(rows, skip={0, 2}, gap=0.3)
    assert s["rounds"] == 1 and s["round_seconds"] == [2.0]
    assert {k: v["per_round"] for k, v in s["requests"].items()} == {
        "flwr-serverapp /v1/runtime/pull-object": 3, "flower-supernode /v1/fleet/pull-object": 2,
        "flwr-serverapp /v1/runtime/push-messages": 1, "flwr-serverapp /v1/runtime/pull-messages": 1}
    assert s["object_waits"] == {"flwr-serverapp": {"per_round": 1.0, "seconds_per_round": pytest.approx(1.0)}}
    md = bench.table({"nodes": 1, "cores": 2, "floats": 122, "gap": 0.3, "machine": "m", "summary": s})
    assert "7 requests per round, 7 per node" in md and "flwr-serverapp 1.0 per round, 1.00 s" in md
    with pytest.raises(ValueError, match="3 rounds, none left"):
        bench.summarize(rows, skip={0, 1, 2}, gap=0.3)
    # the last round ends with the ServerApp's last request: the teardown after it is no round's
    rows = bench.read_log(log + "\n14.2 0.01 1 flwr-serverapp /v1/runtime/push-task-output"
                                "\n15.0 0.01 3 flower-superexec /v1/runtime/acquire-task")
    s = bench.summarize(rows, skip={0}, gap=0.3)
    assert s["rounds"] == 2 and "flower-superexec /v1/runtime/acquire-task" not in s["requests"]
    assert s["requests"]["flwr-serverapp /v1/runtime/push-task-output"]["per_round"] == 0.5


def test_flower_requests_counts_the_model_rows_rounds_of_every_floor_row():
    """The floor sends rounds + 1 messages for each of its rows in order: of the log's rounds, only the model
    row's after its first count, whatever rows come after it (a fourth row once made 2 asked rounds count 5)."""
    bench = _load("flower_requests")
    assert [k for k, *_ in bench.FLOOR_ROWS] == ["empty", "model", "flower", "torch"]
    assert set(range(12)) - bench.floor_skip(2) == {4, 5}
    assert set(range(24)) - bench.floor_skip(5) == {7, 8, 9, 10, 11}


def test_flower_benchmark_keeps_the_other_engines_rows_of_an_earlier_run():
    """``--keep``: a run of the deployment engine merged with an earlier run's in-process and simulation rows,
    in engine order, every row stamped with the load averages of the run that measured it and the table naming
    which rows came from which run, also when merged again; other work is refused."""
    bench = _load("flower")

    def run(engine, clients, seconds):
        return {"engine": engine, "clients": clients, "startup_seconds": 1.0, "peak_rss_mb": 1.0,
                "peak_used_mb": 1.0, "methods": [{"method": "FedAvg", "round_seconds": [seconds], "eval_seconds": 0.1,
                                                "accuracy": 0.5, "traffic": None, "num_parameters": 3,
                                                "formula_bytes": 24.0}]}

    machine = {"cpu": "cpu", "cores": 2, "torch": "t", "load_average": [1.0, 1.0, 1.0]}
    earlier = {"machine": {**machine, "load_average": [0.5, 0, 0]}, "rounds": 5, "work": "w", "load_average_end": [2.0],
               "runs": [run("in-process", 10, 0.01), run("simulation", 10, 0.1), run("deployment", 10, 9.0)]}
    res = {"machine": machine, "rounds": 5, "work": "w", "load_average_end": [3.0],
           "runs": [run("deployment", 10, 2.0)]}
    merged = bench.keep_other_engines(earlier, res, ["deployment"])
    assert [(r["engine"], r["methods"][0]["round_seconds"], r["load_average"]) for r in merged["runs"]] == [
        ("in-process", [0.01], [0.5, 2.0]), ("simulation", [0.1], [0.5, 2.0]), ("deployment", [2.0], [1.0, 3.0])]
    assert ("load average 0.50 at start, 2.00 at end for the in-process, simulation rows (one run); 1.00 at start, "
            "3.00 at end for the deployment rows (one run).") in bench.markdown(merged)
    # merged again with a newer run of the simulation engine: every row keeps the run it came from
    newer = {**res, "machine": {**machine, "load_average": [4.0]}, "load_average_end": [5.0],
             "runs": [run("simulation", 10, 0.2)]}
    again = bench.keep_other_engines(merged, newer, ["simulation"])
    assert [(r["engine"], r["load_average"]) for r in again["runs"]] == [
        ("in-process", [0.5, 2.0]), ("simulation", [4.0, 5.0]), ("deployment", [1.0, 3.0])]
    assert "load average 0.50 at start, 2.00 at end for the in-process rows (one run); 4.00" in bench.markdown(again)
    assert "load average 1.00 at start, 3.00 at end." in bench.markdown(res)  # one run: no rows named
    with pytest.raises(SystemExit, match="--keep: the earlier flower.json ran other work"):
        bench.keep_other_engines({**earlier, "rounds": 2}, res, ["deployment"])


def test_grad_buffers_benchmark_writes_its_table(tmp_path):
    bench = _load("grad_buffers")
    res = bench.main(["--quick", "--threads", "1", "--repeats", "1", "--out", str(tmp_path)])
    assert list(res["threads"]) == [1]
    assert list(res["threads"][1]) == list(bench.ROWS)
    assert all(t["fresh"] > 0 and t["buffers"] > 0 for t in res["threads"][1].values())
    assert json.loads((tmp_path / "grad_buffers.json").read_text())["workload"]["clients"] == 3
    assert "| pFedMe inner step | 1 |" in (tmp_path / "grad_buffers.md").read_text()
