"""Every notebook's smoke results against stored expected values, within tolerances measured across
machines (see smoke.py for what is compared and how to update the expected values).

How the tolerances were measured (``tests/regression/measure.py``; its report, with every stage's
numbers, is tests/regression/TOLERANCES.md): every notebook ran with its smoke defaults on one 2-core
AMD EPYC (AVX-512) VM with torch 2.13.0 under six conditions: OMP_NUM_THREADS=1 (the reference) and
=2, each idle and with the other core kept busy (``python -c "while True: pass"``), and two other CPUs
emulated by capping the instruction set of torch's kernels, oneDNN and MKL (AVX2 with 2 threads;
baseline SSE4 with 1 thread). Thread count and load changed nothing; the instruction set changed the
order of float sums, and with it the float32 results of convolutions, the ResNet/GroupNorm and LSTM
models and long SGD runs. Per stage the spread is the largest difference from the reference over every
compared value and condition. Randomness per client (issue 27) changed every trained result: the expected
values and the spreads were measured again (2-core Intel Xeon VM, torch 2.13.0) under the conditions that
moved anything, the reference and the two emulated CPUs (``measure.py run base avx2 sse``); the comments
below give those spreads.

* Stages whose values never moved by more than float64 rounding (closed forms, float64 quadratic
  simulations) are compared to 1e-9 relative (``EXACT``).
* Stages with trained float32 results get rtol = 5 x the measured relative spread, rounded up to one
  significant digit, and never below 2e-5: CSV tables keep 6 significant digits, so a difference in the
  7th digit can flip the last printed one (1e-5 relative). atol covers values near zero.
* One smoke setting was changed because it measured chaotic, not because of the tolerance: perm_fig2's
  pFedMe personal lr 0.05 -> 0.02 (at 0.05 its 4-round trajectory oscillates, and the SSE4 kernels moved
  its accuracy from 0.46 to 0.53; at 0.02 the spread is 1.5e-7). params.yaml keeps the paper setting.
"""
from __future__ import annotations

import pytest
from smoke import EXPECTED, Tolerance, compare, ensure_smoke_results, read_values, smoke_notebooks

#: closed forms and float64 simulations: equal up to float64 reassociation
EXACT = Tolerance(rtol=1e-9, atol=1e-12)

#: stages with trained float32 results (see the module docstring): measured relative spread -> rtol
FLOOR = Tolerance(rtol=2e-5, atol=1e-6)
TOLERANCES: dict[str, Tolerance] = {
    "perm_fig1": FLOOR,                      # spread 3.6e-7
    "perm_fig2": FLOOR,                      # 9.0e-7 (CNN)
    "perm_fig4": FLOOR,                      # 4.2e-8
    "perm_fig5": FLOOR,                      # 1.3e-8
    # 1.7e-4 relative, 8.5e-6 absolute: the alpha table (water-filling over sampled gradients in float32)
    "perm_fig6": Tolerance(rtol=9e-4, atol=5e-5),
    "perm_alpha_convergence": FLOOR,         # 1.9e-6
    "perm_hetero": Tolerance(rtol=3e-5, atol=1e-6),      # 0 (5.3e-6 in the six-condition measurement)
    # the in-process and one-process protocol rows the expected values hold (no Flower extra): 2.8e-8 (sse)
    "flower_equivalence": FLOOR,
    "charles_fig6": FLOOR,                   # 0 measured; a CNN trained in float32
    "charles_theory": Tolerance(rtol=2e-4, atol=2e-6),   # 2.9e-5, 2.3e-7 absolute
    # ResNet-18/GroupNorm and LSTM in float32: 7.6e-3 and 2.5e-3; the gamma/eta picks and the claim
    # verdicts compare losses that may lie within that of each other
    "charles_fig12": Tolerance(rtol=0.04, atol=1e-6, derived=r"best_gamma|\.holds$"),
    "charles_fig13": Tolerance(rtol=0.02, atol=1e-6, derived=r"best_gamma|\.holds$|tuned"),
}

NOTEBOOKS = smoke_notebooks()


def test_every_notebook_is_covered():
    stages = [nb.stage for nb in NOTEBOOKS]
    assert len(stages) == len(set(stages)) >= 26
    missing = [s for s in stages if not (EXPECTED / s).is_dir()]
    assert not missing, f"no expected values for {missing}: run `python tests/regression/smoke.py update <stage>`"
    assert set(TOLERANCES) <= set(stages)


@pytest.mark.slow
@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[nb.stage for nb in NOTEBOOKS])
def test_smoke_results_match_expected(nb):
    tolerance = TOLERANCES.get(nb.stage, EXACT)
    expected = read_values(EXPECTED / nb.stage)
    assert expected, f"{EXPECTED / nb.stage} holds no values"
    problems = compare(expected, read_values(ensure_smoke_results(nb)), tolerance)
    assert not problems, (f"{nb.stage}: {len(problems)} of {len(expected)} values differ from "
                          f"tests/regression/expected/{nb.stage}:\n  " + "\n  ".join(problems[:20]))


# ----------------------------------------------------------------------------- the comparison itself
def test_compare_accepts_values_within_the_tolerance_and_rejects_the_rest():
    tol = Tolerance(rtol=0.01, atol=0.001)
    expected = {"m.json:acc": 0.5, "m.json:count": 7, "m.json:name": "PERM", "m.json:ok": True}
    assert compare(expected, {"m.json:acc": 0.5059, "m.json:count": 7, "m.json:name": "PERM", "m.json:ok": True},
                   tol) == []
    problems = compare(expected, {"m.json:acc": 0.5061, "m.json:count": 8, "m.json:name": "FedAvg",
                                  "m.json:ok": False}, tol)
    assert [p.split(":")[1] for p in problems] == ["acc", "count", "name", "ok"]
    assert compare(expected, {}, tol)[0].startswith("m.json:acc: missing")


def test_compare_skips_only_the_picks_derived_from_trained_floats():
    tol = Tolerance(rtol=0.0, atol=0.0, derived=r"claim\.holds$|best_gamma")
    expected = {"m.json:claim.holds": True, "m.json:claim.best_gamma": 0.01, "m.json:dataset": "fashion-mnist",
                "m.json:loss": 2.0}
    assert compare(expected, {"m.json:claim.holds": False, "m.json:claim.best_gamma": 1.0,
                              "m.json:dataset": "fashion-mnist", "m.json:loss": 2.0}, tol) == []
    assert compare(expected, {"m.json:claim.holds": True, "m.json:claim.best_gamma": 0.01,
                              "m.json:dataset": "mnist", "m.json:loss": 2.1}, tol) != []


def test_compare_treats_nan_and_inf_exactly():
    tol = Tolerance(rtol=1.0, atol=1.0)
    assert compare({"k": float("nan")}, {"k": float("nan")}, tol) == []
    assert compare({"k": float("inf")}, {"k": 1e300}, tol) != []
    assert compare({"k": 1.0}, {"k": float("nan")}, tol) != []


def test_run_description_keys_are_not_compared(tmp_path):
    (tmp_path / "metrics.json").write_text('{"runtime_s": 3.2, "config": {"threads": 2}, '
                                           '"environment": {"torch": "x"}, "accuracy": 0.5}')
    (tmp_path / "run.json").write_text('{"anything": 1}')
    (tmp_path / "table.csv").write_text("method,accuracy\nPERM,0.75\n")
    assert read_values(tmp_path) == {"metrics.json:accuracy": 0.5, "table.csv:0.method": "PERM",
                                     "table.csv:0.accuracy": 0.75}
