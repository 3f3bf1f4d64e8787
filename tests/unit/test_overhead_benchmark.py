"""benchmarks/overhead.py keeps working (tiny sizes; no timing assertions)."""
import json

from repo_files import load



def test_overhead_benchmark_writes_its_table(tmp_path):
    overhead = load("benchmarks/overhead.py")
    res = overhead.main(["--quick", "--threads", "1", "--device", "cpu", "--out", str(tmp_path)])
    assert [r["workload"] for r in res["split"]] == ["synthetic", "mlp", "cnn"]
    for r in res["split"]:
        # the profiled split is a share of the round: kernels + overhead = 1, each in [0, 1]
        assert 0 <= r["kernel_share"] <= 1 and abs(r["kernel_share"] + r["overhead_share"] - 1) < 1e-12
        assert r["round_s"] > 0 and r["achieved_gflops"] > 0 and r["share_of_peak"] > 0
    assert [r["clients"] for r in res["rounds"]] == [4, 8] and all(r["rounds_per_s"] > 0 for r in res["rounds"])
    assert json.loads((tmp_path / "overhead_cpu.json").read_text())["split"] == res["split"]
    assert "| synthetic logistic (d=60), N=4 |" in (tmp_path / "overhead_cpu.md").read_text()
    # K steps at once vs one step at a time: both timed, the same numbers up to float rounding
    assert [r["workload"] for r in res["steps"]] == ["synthetic", "mlp", "cnn"]
    for r in res["steps"]:
        assert r["new_s"] > 0 and r["reference_s"] > 0 and r["max_abs_diff"] < 1e-5
        assert r["met"] == (r["speedup"] >= r["target"])
    assert "K steps at once vs one step at a time >= 2.50x" in (tmp_path / "overhead_cpu.md").read_text()
