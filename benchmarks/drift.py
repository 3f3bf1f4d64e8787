"""Cross-machine drift of the default pipeline's results: the same commit run on several machines (or CPU kinds,
thread counts), compared per claim and per headline number.

    python benchmarks/drift.py "LABEL=ROOT" "LABEL=ROOT" ...    (at least two runs)

Each ROOT is a checkout in which ``dvc repro`` (the default profile) ran: its ``results/<stage>/metrics.json``
(claims) and ``results/<stage>/headline.json`` (headlines) are read; a ROOT with headlines only (a recorded run,
e.g. the files git keeps) counts for the headlines. Writes benchmarks/results/drift.json and drift.md:

* per claim of claims.yaml: the largest absolute difference of any of its values between two runs (``drift``)
  and each run's verdict by the claim's rule alone; ``scripts/claims.py`` reads it: a default-profile margin
  within the drift of the rule's bound, or a verdict that differed between the runs, reads "inconclusive";
* per headline number: each run's value and the largest difference.

Trained floats drift between CPUs because reductions run in another order (other SIMD widths, other thread
splits) and training amplifies the last bits over rounds; closed forms do not drift.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import claims as ledger  # noqa: E402  (claims.yaml's lookup and rules)

OUT = ROOT / "benchmarks" / "results"


def numbers(columns: list[list]) -> list[float]:
    return [float(v) for col in columns for v in col
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))]


def claim_drift(claims: list[dict], runs: dict[str, Path]) -> dict[str, dict]:
    """claim id -> {drift, verdicts: {label: verdict by the rule alone}} over the runs that have its metrics."""
    out = {}
    for c in claims:
        values, verdicts = {}, {}
        for label, root in runs.items():
            path = root / "results" / c["stage"] / "metrics.json"
            if not path.is_file():
                continue
            metrics = json.loads(path.read_text())
            try:
                columns = [ledger.lookup(metrics, p) for p in (c["values"] if "values" in c else [c["value"]])]
                verdicts[label] = "holds" if ledger.decide(c["rule"], columns) else "does not hold"
            except (ledger.Missing, ValueError):
                continue
            values[label] = numbers(columns)
        if len(values) < 2:
            continue
        lists = list(values.values())
        same = all(len(v) == len(lists[0]) for v in lists)
        drift = max((abs(a - b) for i in range(len(lists[0])) for a in (v[i] for v in lists)
                     for b in (v[i] for v in lists)), default=0.0) if same else None
        out[c["id"]] = {"stage": c["stage"], "drift": drift, "verdicts": verdicts}
    return out


def flat(tree: dict, prefix: str = "") -> list[tuple[str, float]]:
    """The numbers of a nested mapping, keyed "a.b.c"."""
    out = []
    for key, value in tree.items():
        if isinstance(value, dict):
            out += flat(value, f"{prefix}{key}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append((f"{prefix}{key}", float(value)))
    return out


def headline_drift(runs: dict[str, Path]) -> dict[str, dict]:
    """'stage: key' -> {values: {label: value}, drift} for every headline number at least two runs have."""
    table: dict[str, dict] = {}
    for label, root in runs.items():
        for path in sorted((root / "results").glob("*/headline.json")):
            for section in json.loads(path.read_text()).values():
                for key, value in flat(section):
                    table.setdefault(f"{path.parent.name}: {key}", {})[label] = value
    return {k: {"values": v, "drift": max(v.values()) - min(v.values())} for k, v in sorted(table.items())
            if len(v) >= 2}


def markdown(result: dict) -> str:
    labels = list(result["runs"])
    lines = ["Runs compared (the same commit, default profile, `dvc repro`): "
             + "; ".join(f"**{k}**" for k in labels) + ".", "",
             "Claims whose verdict could move: the rule's verdict per run, and the largest difference of the "
             "claim's values between runs (the ledger reads a default-profile margin within it as inconclusive).",
             "", "| claim | stage | drift | " + " | ".join(labels) + " |", "|---|---|---:|" + "---|" * len(labels)]
    for cid, c in result["claims"].items():
        if c["drift"] or len(set(c["verdicts"].values())) > 1:
            d = "-" if c["drift"] is None else f"{c['drift']:.3g}"
            verdicts = " | ".join(c["verdicts"].get(x, "") for x in labels)
            lines.append(f"| {cid} | {c['stage']} | {d} | {verdicts} |")
    same = [cid for cid, c in result["claims"].items() if not c["drift"] and len(set(c["verdicts"].values())) == 1]
    lines += ["", f"{len(same)} more claims have identical values on every run.", "",
              "Headline numbers that differ between runs (`results/<stage>/headline.json`, the files git keeps):", "",
              "| stage: number | drift | " + " | ".join(labels) + " |", "|---|---:|" + "---:|" * len(labels)]
    for key, h in result["headlines"].items():
        if h["drift"]:
            lines.append(f"| {key} | {h['drift']:.3g} | "
                         + " | ".join(f"{h['values'][x]:.4g}" if x in h["values"] else "" for x in labels) + " |")
    lines += ["", f"{sum(1 for h in result['headlines'].values() if not h['drift'])} more headline numbers are "
              "identical on every run."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="LABEL=ROOT, a checkout where the default pipeline ran")
    p.add_argument("--out", default=str(OUT))
    a = p.parse_args(argv)
    runs = {}
    for spec in a.runs:
        label, sep, root = spec.partition("=")
        if not sep or not Path(root).is_dir():
            p.error(f"runs: expected LABEL=ROOT with ROOT a folder, got {spec!r}")
        runs[label] = Path(root)
    if len(runs) < 2:
        p.error("runs: at least two")
    claims = ledger.read_yaml(ROOT / "claims.yaml", "claims file")
    result = {"runs": list(runs), "claims": claim_drift(claims, runs),
              "headlines": headline_drift(runs)}
    out = Path(a.out)
    (out / "drift.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    (out / "drift.md").write_text(markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
