"""Measure how much each notebook's smoke results move between machines: the evidence behind the
tolerances in test_smoke_results.py.

    .venv/bin/python tests/regression/measure.py run [condition ...]   # default: every condition
    .venv/bin/python tests/regression/measure.py report                # -> tests/regression/spread.json, TOLERANCES.md

``run`` executes every notebook with its smoke defaults under each condition (fresh kernel, the
condition's environment) and keeps its results folder in ``build/spread/<condition>/<stage>/``.
``report`` compares every condition with ``base`` (one thread, idle, this CPU's own kernels): per
stage the largest absolute and relative difference over every compared value (smoke.read_values),
and any string or boolean that changed. About 4 minutes per condition on a 2-core VM.

Conditions: the thread count and load change nothing on one CPU (measured); another CPU changes the
order of float sums. It is emulated by capping the instruction set of torch's kernels
(``ATEN_CPU_CAPABILITY``), oneDNN (``ONEDNN_MAX_CPU_ISA``) and MKL (``MKL_ENABLE_INSTRUCTIONS``).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from smoke import ROOT, read_values, smoke_notebooks

OUT = ROOT / "build" / "spread"
HERE = Path(__file__).resolve().parent
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
SSE = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
#: name -> (environment, keep the other core busy, what it stands for)
CONDITIONS: dict[str, tuple[dict, bool, str]] = {
    "base": ({"OMP_NUM_THREADS": "1"}, False, "1 thread, idle (the reference)"),
    "threads2": ({"OMP_NUM_THREADS": "2"}, False, "2 threads, idle"),
    "threads1-busy": ({"OMP_NUM_THREADS": "1"}, True, "1 thread, other core busy"),
    "threads2-busy": ({"OMP_NUM_THREADS": "2"}, True, "2 threads, other core busy"),
    "avx2": ({"OMP_NUM_THREADS": "2", **AVX2}, False, "another CPU: AVX2 kernels, 2 threads"),
    "sse": ({"OMP_NUM_THREADS": "1", **SSE}, False, "another CPU: baseline (SSE4) kernels, 1 thread"),
}


def run(condition: str) -> None:
    env, busy, _ = CONDITIONS[condition]
    load = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        for nb in smoke_notebooks():
            start = time.perf_counter()
            code = ("import sys; sys.path.insert(0, sys.argv[1]); import smoke; "
                    "smoke.run_notebook(next(n for n in smoke.smoke_notebooks() if n.stage == sys.argv[2]))")
            subprocess.run([sys.executable, "-c", code, str(HERE), nb.stage], check=True,
                           env={**os.environ, **env}, cwd=ROOT, capture_output=True)
            target = OUT / condition / nb.stage
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(nb.results_dir, target)
            print(f"{condition}: {nb.stage} {time.perf_counter() - start:.1f} s", flush=True)
    finally:
        if load is not None:
            load.kill()
            load.wait()


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _files_kept(condition: str) -> str:
    folders = [f for f in (OUT / condition).glob("*") if f.is_dir()]
    if not folders:
        return "not run"
    full = sum(any(p.suffix == ".csv" for p in f.iterdir()) for f in folders)
    return ("metrics.json and CSV tables" if full == len(folders) else
            f"metrics.json; CSV tables for {full} of {len(folders)} stages")


def report() -> dict:
    stages = {}
    for nb in smoke_notebooks():
        base = read_values(OUT / "base" / nb.stage)
        entry = {"values": len(base), "max_abs": 0.0, "max_rel": 0.0, "worst": None, "changed_labels": [],
                 "conditions": []}
        for condition in CONDITIONS:
            folder = OUT / condition / nb.stage
            if condition == "base" or not folder.exists():
                continue
            entry["conditions"].append(condition)
            other = read_values(folder)
            for key, want in base.items():
                if key not in other:  # a condition may keep fewer files (e.g. metrics.json only)
                    continue
                have = other[key]
                if _number(want) and _number(have) and math.isfinite(want) and math.isfinite(have):
                    diff = abs(have - want)
                    if diff > entry["max_abs"]:
                        entry["max_abs"], entry["worst"] = diff, [key, want, have, condition]
                    if abs(want) >= 1e-3:  # relative spread of values that are not ~0
                        entry["max_rel"] = max(entry["max_rel"], diff / abs(want))
                elif have != want and not (isinstance(want, float) and isinstance(have, float)
                                           and math.isnan(want) and math.isnan(have)):
                    entry["changed_labels"].append([key, want, have, condition])
        stages[nb.stage] = entry
    (HERE / "spread.json").write_text(json.dumps(stages, indent=1, default=str) + "\n")
    lines = ["# Measured spread of the smoke results (tests/regression/measure.py report)", "",
             "Every condition against `base`; |diff| over every compared value, relative over values "
             "with |value| >= 1e-3.", "",
             "| condition | what it stands for | files kept |", "|---|---|---|",
             *[f"| {c} | {d} | {_files_kept(c)} |" for c, (_, _, d) in CONDITIONS.items()], "",
             "| stage | values | max abs diff | max rel diff | labels changed | worst value (condition) |",
             "|---|---|---|---|---|---|"]
    for stage, e in stages.items():
        worst = ("" if e["worst"] is None
                 else f"`{e['worst'][0]}`: {e['worst'][1]:.6g} vs {e['worst'][2]:.6g} ({e['worst'][3]})")
        lines.append(f"| {stage} | {e['values']} | {e['max_abs']:.3g} | {e['max_rel']:.3g} | "
                     f"{len(e['changed_labels'])} | {worst} |")
    (HERE / "TOLERANCES.md").write_text("\n".join(lines) + "\n")
    return stages


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "report"):
        sys.exit(__doc__)
    if sys.argv[1] == "run":
        for c in sys.argv[2:] or list(CONDITIONS):
            run(c)
    else:
        report()
