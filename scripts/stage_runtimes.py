"""README's table of stage runtimes per profile, from measurements only.

    python scripts/stage_runtimes.py      writes benchmarks/results/stage_runtimes.{csv,md}

Two sources, each row says which:
* ``whole run``: build/runtimes.csv, one line per successful stage run (``pflkit.notebooks.record_runtime``:
  ``dvc repro``, ``python -m pflkit stage`` and ``python -m pflkit reproduce`` append to it); the latest
  run per stage, profile and device is kept. The table is committed, so the lines that made it are
  copied into benchmarks/results/stage_runtimes.csv with it.
* ``estimate``: benchmarks/results/paper_estimates.json (``benchmarks/paper_estimates.py``): a stage too
  slow to run whole on this CPU, timed for a few rounds at its paper setting and multiplied out to its
  rounds and seeds, stated as such.
"""
from __future__ import annotations

import csv
import io
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "build" / "runtimes.csv"
ESTIMATES = ROOT / "benchmarks" / "results" / "paper_estimates.json"
OUT = ROOT / "benchmarks" / "results" / "stage_runtimes"
#: overlay keys that only move files (the computation is the default's)
PATH_KEYS = {"alpha_file"}
COLUMNS = ["stage", "profile", "seconds", "device", "threads", "cpu", "how", "finished_utc"]


COMMITTED = OUT.with_suffix(".csv")
SUMMARY = ROOT / "benchmarks" / "results" / "reproduce_time.md"


def rows(log: Path = LOG, estimates: Path = ESTIMATES, committed: Path = COMMITTED,
         params: Path = ROOT / "params.yaml") -> list[dict]:
    """Latest whole run per (stage, profile, device) from the committed table and the local log (newer
    wins), then the estimates for (stage, profile, device) that have no whole run."""
    latest: dict[tuple, dict] = {}
    for source in (committed, log):
        if not source.is_file():
            continue
        for r in csv.DictReader(source.open()):
            if r.get("how", "whole run") != "whole run":
                continue
            key = (r["stage"], r["profile"], r["device"])
            if key not in latest or r["finished_utc"] >= latest[key]["finished_utc"]:
                latest[key] = {**{c: r.get(c, "") for c in COLUMNS}, "how": "whole run"}
    if estimates.is_file():
        for e in json.loads(estimates.read_text())["stages"]:
            key = (e["stage"], e["profile"], e["device"])
            if key not in latest:
                latest[key] = {"stage": e["stage"], "profile": e["profile"], "seconds": f"{e['seconds']:.0f}",
                               "device": e["device"], "threads": str(e["threads"]), "cpu": e["cpu"],
                               "how": f"{'' if e.get('complete', True) else 'lower-bound '}estimate: {e['how']}",
                               "finished_utc": e["finished_utc"]}
    # a profile that does not change a stage (no overlay entry, no `defaults`) runs it as the default
    # profile does: that stage's default whole run stands for it, said so
    import yaml
    profiles = yaml.safe_load(params.read_text()).get("profiles") or {}
    for profile in {k[1] for k in latest} - {"default"}:
        overlay = profiles.get(profile) or {}
        if "defaults" in overlay:
            continue
        for (stage, prof, device), r in list(latest.items()):
            changes = set(overlay.get(stage) or {}) - PATH_KEYS
            if prof == "default" and not changes and (stage, profile, device) not in latest:
                latest[(stage, profile, device)] = {**r, "profile": profile,
                                                    "how": "same settings as the default profile (no overlay)"}
    return sorted(latest.values(), key=lambda r: (r["profile"], r["stage"], r["device"]))


def duration(seconds: str) -> str:
    s = float(seconds)
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def to_markdown(table: list[dict]) -> str:
    from pflkit import stages
    order = [s.name for s in stages.STAGES]
    profiles = sorted({r["profile"] for r in table}, key=lambda p: (p != "default", p))
    devices = sorted({(r["profile"], r["device"]) for r in table}, key=lambda pd: (profiles.index(pd[0]), pd[1]))
    cell = {(r["stage"], r["profile"], r["device"]): r for r in table}
    head = "| stage | " + " | ".join(f"{p} profile, {d}" for p, d in devices) + " |"
    lines = [head, "|---" * (len(devices) + 1) + "|"]
    for stage in order:
        if not any((stage, p, d) in cell for p, d in devices):
            continue
        parts = []
        for p, d in devices:
            r = cell.get((stage, p, d))
            how = "" if r is None else r["how"]
            mark = ("" if how in ("", "whole run") else " (=)" if how.startswith("same")
                    else " (est., lower bound)" if how.startswith("lower") else " (est.)")
            parts.append("" if r is None else ("> " if how.startswith("lower") else "") + duration(r["seconds"]) + mark)
        lines.append(f"| {stage} | " + " | ".join(parts) + " |")
    totals = []
    for p, d in devices:
        got = [float(cell[(s, p, d)]["seconds"]) for s in order if (s, p, d) in cell]
        lower = any(cell[(s, p, d)]["how"].startswith("lower") for s in order if (s, p, d) in cell)
        totals.append(f"**{'> ' if lower else ''}{duration(str(sum(got)))}** ({len(got)} stages)")
    lines.append("| **all** | " + " | ".join(totals) + " |")
    machines = []  # per column, the machines its rows ran on (with counts where they differ)
    for p, d in devices:
        ran = Counter(f"{cell[(s, p, d)]['cpu']}, {cell[(s, p, d)]['threads']} torch thread(s)"
                      for s in order if (s, p, d) in cell)
        machines.append(f"{p} profile, {d}: " + ", ".join(m + (f" ({n} stages)" if len(ran) > 1 else "")
                                                           for m, n in ran.most_common()))
    notes = ["", "Measured on: " + "; ".join(machines) + ". Whole runs are the latest successful run of each stage "
             "(build/runtimes.csv); (=) marks a stage the profile does not change (its default run stands for it); "
             "(est.) marks a stage too slow to run whole here, timed for one round and multiplied out "
             "(benchmarks/results/paper_estimates.md says how, per stage)."]
    return "\n".join(lines + notes) + "\n"


def summary(table: list[dict]) -> str:
    """README's line: the default pipeline's stages summed, with the machine they ran on."""
    default = [r for r in table if r["profile"] == "default" and r["how"] in ("", "whole run")]
    machines = Counter(f"{r['cpu']}, {r['threads']} torch thread(s)" for r in default)
    return (f"`make reproduce` runs {len(default)} stages in {duration(str(sum(float(r['seconds']) for r in default)))}"
            f" on {', '.join(m for m, _ in machines.most_common())} (the data stages, seconds each, and the set-up "
            "in the table below come on top; per stage: docs/running.md).\n")


def main() -> int:
    sys.path.insert(0, str(ROOT / "src"))
    table = rows()
    if not table:
        print(f"no runtimes yet: run stages first ({LOG.relative_to(ROOT)} is empty)", file=sys.stderr)
        return 1
    buf = io.StringIO()
    w = csv.DictWriter(buf, COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(table)
    OUT.with_suffix(".csv").write_text(buf.getvalue())
    OUT.with_suffix(".md").write_text(to_markdown(table))
    SUMMARY.write_text(summary(table))
    print(f"wrote {OUT.relative_to(ROOT)}.csv and .md ({len(table)} rows), {SUMMARY.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
