"""The claims ledger: evaluate claims.yaml against every profile's results; write the table and the page.

    python scripts/claims.py                  results/claims.{csv,md}, reports/index.html, results/claims/
    python scripts/claims.py --check          also exit 1 when a run stage's claim has no value (a stale path)

For each entry of claims.yaml and each profile with results (default: results/<stage>/metrics.json, what
``dvc repro`` writes; another profile: build/<profile>/<stage>/metrics.json), the value(s) at the entry's
path and the verdict of its rule: holds / does not hold / not run (no results) / no value (the path is
not in the results). Outputs:

* ``results/claims.csv``: one row per claim and profile (tidy, for pandas);
* ``results/claims.md``: per paper, one table row per claim (README's results block is filled from it);
* ``reports/index.html``: the same rows with each figure's PNG beside its row and a link to the
  executed notebook; a small script in the page reports images that failed to load and script errors
  (``tests/unit/test_claims_page.py`` opens it in headless Chromium);
* ``results/claims/<stage>.json``: the DVC metrics, a few flat numbers per stage (claims checked, claims
  holding, the first claim's value), so ``dvc metrics show`` fits a terminal.
"""
from __future__ import annotations

import argparse
import csv
import fnmatch
import html
import io
import json
import math
import re
import sys
from pathlib import Path

from pflkit.config import read_yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from dvc_stages import load_stages  # noqa: E402  (the stage table, without importing pflkit)

RULE = re.compile(r"^(abs )?(<=|>=|<|>) *(\S+)$")
VERDICTS = ("holds", "does not hold", "not run", "no value")


class Missing(LookupError):
    """A path that is not in the results."""


class UnreadableResults(ValueError):
    """A stage's metrics.json is there but empty, not JSON or not an object: names the file and how to rewrite it."""


def read_metrics(path: Path, stage: str, profile: str, root: Path = ROOT) -> dict:
    """``path`` (a stage's metrics.json) as a dict; an empty or garbled file is an :class:`UnreadableResults`
    naming it, the stage that writes it and the command that does (``pflkit.report.read_json``'s message)."""
    command = f"dvc repro {stage}" if profile == "default" else (
        f"python -m pflkit reproduce --profile {profile} --stages {stage}")
    try:
        text = path.read_text()
        metrics = json.loads(text) if text.strip() else None
        why = "empty" if not text.strip() else f"holds a JSON {type(metrics).__name__}, not an object"
    except (OSError, ValueError) as exc:
        metrics, why = None, f"not valid JSON ({exc})"
    if isinstance(metrics, dict):
        return metrics
    raise UnreadableResults(f"{_rel(path, root)}: {why}; written by stage {stage}: run `{command}`")


def check_rule(rule) -> None:
    """A ValueError naming the allowed rules when ``rule`` is not one of them."""
    decide(rule, [[1.0]])


def natural(key: str):
    """Sort key: the numbers inside a name compare as numbers ('zeta=10' after 'zeta=1')."""
    return [float(t) if i % 2 else t for i, t in enumerate(re.split(r"(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)", key))]


def lookup(tree, path: list) -> list:
    """Every value at ``path`` (keys, globs, ``#i``), in natural order of the matched names."""
    found = [tree]
    for step in path:
        nxt = []
        for node in found:
            if not isinstance(node, dict):
                raise Missing(f"{step!r}: not a mapping")
            keys = sorted(node, key=natural)
            if str(step) in node:  # an exact key first: names such as "|x_T - x*|" hold glob characters
                nxt.append(node[str(step)])
            elif isinstance(step, str) and step.startswith("#"):
                index = int(step[1:])
                if -len(keys) <= index < len(keys):
                    nxt.append(node[keys[index]])
            elif isinstance(step, str) and any(c in step for c in "*?"):
                nxt += [node[k] for k in keys if fnmatch.fnmatchcase(k, step)]
        if not nxt:
            raise Missing(f"no key {step!r}")
        found = nxt
    return found


def decide(rule: str, columns: list[list]) -> bool:
    """The rule over the value columns (one per path; each a list of matches)."""
    rule = " ".join(str(rule).split())
    flat = [v for col in columns for v in col]
    if rule == "true":  # tables store booleans as 1.0 (report.table_records)
        return all(v is True or (type(v) in (int, float) and v == 1) for v in flat)
    if rule in ("increasing", "decreasing", "nondecreasing"):
        rows = list(zip(*columns)) if len(columns) > 1 else [tuple(columns[0])]
        if any(len(col) != len(columns[0]) for col in columns):
            raise ValueError(f"rule {rule!r}: the paths match different numbers of entries")
        ok = {"increasing": lambda a, b: a < b, "decreasing": lambda a, b: a > b,
              "nondecreasing": lambda a, b: a <= b + 1e-12}[rule]  # a bound: float64 round-off allowed
        return all(len(r) > 1 and all(ok(a, b) for a, b in zip(r, r[1:])) for r in rows)
    if rule.startswith("between "):
        lo, hi = map(float, rule.split()[1:])
        return all(lo <= v <= hi for v in flat)
    if rule.startswith("within "):
        tol = float(rule.split()[1])
        return all(max(r) - min(r) <= tol for r in zip(*columns))
    m = RULE.match(rule)
    if not m:
        raise ValueError(f"unknown rule {rule!r}; allowed: true, < x, <= x, > x, >= x, abs < x, between lo hi, "
                         "within x, increasing, decreasing, nondecreasing")
    absolute, op, bound = m.group(1), m.group(2), float(m.group(3))
    cmp = {"<": lambda v: v < bound, "<=": lambda v: v <= bound, ">": lambda v: v > bound, ">=": lambda v: v >= bound}
    return all(cmp[op](abs(v) if absolute else v) for v in flat)


def show(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if value and (abs(value) < 1e-3 or abs(value) >= 1e4) else f"{value:.4g}"
    return str(value)


def estimate(metrics: dict, claim: dict) -> str:
    """The headline number behind the rule's value (``show``) as mean ± sd (``sd``; none with one seed)."""
    try:
        mean = show(lookup(metrics, claim["show"])[0]) if "show" in claim else ""
    except Missing:
        return ""
    try:
        return mean + (f" ± {show(lookup(metrics, claim['sd'])[0])}" if mean and "sd" in claim else "")
    except Missing:
        return mean


def dataset_of(metrics: dict) -> tuple[str, bool]:
    """What data the stage ran, and whether any of it is a substitute for the paper's dataset."""
    if isinstance(metrics.get("tasks"), dict):
        parts = [dataset_of(t) + (name,) for name, t in metrics["tasks"].items() if isinstance(t, dict)]
        return "; ".join(f"{name}: {d}" for d, _, name in parts), any(s for _, s, _ in parts)
    name = str(metrics.get("dataset") or metrics.get("data") or "")
    substitute = bool(metrics.get("is_substitute")) or "substitute" in name
    paper = metrics.get("paper_dataset")
    if substitute and paper and str(paper) not in name:
        name = f"{name} (substitute for {paper})"
    return name, substitute


def evaluate(claims: list[dict], folders: dict[str, Path], root: Path = ROOT) -> list[dict]:
    """One row per claim and profile: value(s), estimate (mean ± sd), verdict, dataset; ``folders`` maps each profile to
    the folder holding its <stage>/metrics.json."""
    rows = []
    for c in claims:
        for profile, folder in folders.items():
            row = {k: c.get(k, "") for k in ("id", "paper", "figure", "stage", "claim", "metric", "rule", "why")}
            row.update(profile=profile, value="", estimate="", verdict="not run", dataset="", substitute=False)
            path = folder / c["stage"] / "metrics.json"
            if path.is_file() and profile in c.get("profiles", [profile]):
                metrics = read_metrics(path, c["stage"], profile, root)
                row["dataset"], row["substitute"] = dataset_of(metrics)
                paths = c["values"] if "values" in c else [c["value"]]
                try:
                    columns = [lookup(metrics, p) for p in paths]
                    row["verdict"] = "holds" if decide(c["rule"], columns) else "does not hold"
                    flat = [v for col in columns for v in col]
                    row["value"] = ", ".join(show(v) for v in flat[:8]) + (" ..." if len(flat) > 8 else "")
                    row["first"] = flat[0]
                    row["estimate"] = estimate(metrics, c)
                except (Missing, ValueError) as exc:  # a path not in the results, or paths that do not pair up
                    row["verdict"], row["value"] = "no value", f"{exc} in {_rel(path, root)}"
            rows.append(row)
    return rows


def _rel(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def result_folders(params: dict, root: Path) -> dict[str, Path]:
    """The default profile's results (results/, what ``dvc repro`` writes) and every other profile of
    params.yaml that has run (build/<profile>/)."""
    folders = {"default": root / "results"}
    folders.update({str(p): root / "build" / str(p) for p in (params.get("profiles") or {})
                    if (root / "build" / str(p)).is_dir()})
    return folders


# --------------------------------------------------------------------------------------- outputs
COLUMNS = ["id", "paper", "figure", "stage", "profile", "claim", "metric", "rule", "value", "estimate", "verdict",
           "dataset", "substitute", "why"]


def to_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def to_markdown(rows: list[dict], profile: str = "default") -> str:
    lines = []
    for paper in dict.fromkeys(r["paper"] for r in rows):
        lines += [f"**{paper}** ({profile} profile)", "",
                  "| figure | claim | measured | verdict | data |", "|---|---|---|---|---|"]
        for r in rows:
            if r["paper"] == paper and r["profile"] == profile:
                value = r["value"] + (f" ({r['estimate']})" if r["estimate"] else "")
                data = r["dataset"] + (" **(substitute)**" if r["substitute"] else "")
                lines.append(f"| {r['figure']} | {r['claim']} | {r['metric']}: {value} | **{r['verdict']}** | {data} |")
        lines.append("")
    return "\n".join(lines)


PAGE_CHECK = """<script>
const problems = [];
window.addEventListener("error", e => problems.push("script error: " + e.message));
window.addEventListener("load", () => {
  const imgs = [...document.images];
  imgs.filter(i => !(i.complete && i.naturalWidth > 0)).forEach(i => problems.push("image not loaded: " + i.src));
  const out = document.getElementById("page-check");
  const found = problems.length ? ": " + problems.join("; ") : "";
  out.textContent = "images " + imgs.length + "; problems " + problems.length + found;
});
</script>"""


def to_html(rows: list[dict], profiles: list[str], stages: dict) -> str:
    """reports/index.html: per paper a table, one row per claim, a column per profile; paths relative
    to reports/ (figures at ../figures/<paper>/, executed notebooks at <paper>/<notebook>.ipynb)."""
    esc = html.escape
    by_id: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_id.setdefault(r["id"], {})[r["profile"]] = r
    body = []
    for paper in dict.fromkeys(r["paper"] for r in rows):
        body.append(f"<h2>{esc(paper)}</h2><table><tr><th>figure</th><th>claim</th><th>metric</th>"
                    + "".join(f"<th>{esc(p)} profile</th>" for p in profiles) + "<th>data</th></tr>")
        for per in by_id.values():
            first = next(iter(per.values()))
            if first["paper"] != paper:
                continue
            stage = stages[first["stage"]]
            plot = next((s for s in stages.values() if s.source == stage.name), None)
            figure = plot.figure_names[0] if plot is not None else None
            notebook = f"{stage.paper}/{stage.stem}.ipynb"
            cell = f"<b>{esc(first['figure'])}</b><br><a href=\"{esc(notebook)}\">notebook</a>"
            if plot is not None:
                cell += f" · <a href=\"{esc(plot.paper)}/{esc(plot.stem)}.ipynb\">figure notebook</a>"
            if figure:
                src = f"../figures/{stage.paper}/{figure}.png"
                cell += f"<br><a href=\"{esc(src)}\"><img src=\"{esc(src)}\" alt=\"{esc(figure)}\" width=\"220\"></a>"
            verdicts = "".join(
                f"<td class=\"{esc(per[p]['verdict'].replace(' ', '-'))}\"><b>{esc(per[p]['verdict'])}</b><br>"
                f"{esc(per[p]['value'])}{' (' + esc(per[p]['estimate']) + ')' if per[p]['estimate'] else ''}</td>"
                for p in profiles)
            data = esc(first["dataset"]) + (" <b>(substitute)</b>" if first["substitute"] else "")
            body.append(f"<tr><td>{cell}</td><td>{esc(first['claim'])}<br><small>{esc(first['why'])}</small></td>"
                        f"<td>{esc(first['metric'])}<br><small>rule: {esc(str(first['rule']))}</small></td>"
                        f"{verdicts}<td>{data}</td></tr>")
        body.append("</table>")
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:2em}"
             "td,th{border:1px solid #ccc;padding:6px;vertical-align:top;max-width:28em}"
             ".holds{background:#e6f4e6}.does-not-hold{background:#fbe3e3}.not-run,.no-value{background:#eee}")
    counts = {v: sum(r["verdict"] == v for r in rows if r["profile"] == "default") for v in VERDICTS}
    summary = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>pflkit: the papers' claims</title>"
            f"<style>{style}</style></head><body><h1>The papers' claims, as measured</h1>"
            f"<p>Generated by <code>python scripts/claims.py</code> from claims.yaml and each stage's "
            f"metrics.json (default profile: {esc(summary)}).</p><p id=\"page-check\">page not checked</p>"
            + "".join(body) + PAGE_CHECK + "</body></html>\n")


def headline(rows: list[dict], stage: str) -> dict:
    """A stage's DVC metrics: claims checked and holding (default profile), the first claim's value."""
    mine = [r for r in rows if r["stage"] == stage and r["profile"] == "default"]
    out = {"claims": len(mine), "holding": sum(r["verdict"] == "holds" for r in mine)}
    first = mine[0].get("first") if mine else None
    if isinstance(first, (int, float)) and not isinstance(first, bool) and math.isfinite(first):
        out["value"] = round(float(first), 6)
    return out


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(text)
    tmp.replace(path)


def main(argv=None, root: Path = ROOT) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--claims", default=str(root / "claims.yaml"))
    p.add_argument("--check", action="store_true", help="exit 1 when a claim of a stage that ran has no value")
    p.add_argument("--profiles", help="comma-separated profiles to show (default: every profile that has run); "
                   "the DVC stage shows only `default`, so its outputs depend on its inputs alone")
    p.add_argument("--out", help="write only the table and markdown (claims.csv, claims.md of the last profile) "
                   "into this folder, e.g. build/paper (what `python -m pflkit reproduce` does): DVC's outputs "
                   "(results/claims*, reports/index.html) are left as they are")
    a = p.parse_args(argv)
    claims = read_yaml(a.claims, "claims file")
    stages = {s.name: s for s in load_stages().STAGES}
    unknown = [c["id"] for c in claims if c["stage"] not in stages]
    if unknown:
        raise SystemExit(f"claims.yaml: claims {unknown} name stages that pflkit.stages does not have")
    for c in claims:  # a bad rule fails here, before any output is written
        check_rule(c["rule"])
    params = read_yaml(root / "params.yaml", "parameters file")
    folders = result_folders(params, root)
    if a.profiles:
        wanted = a.profiles.split(",")
        unknown = [p for p in wanted if p != "default" and p not in (params.get("profiles") or {})]
        if unknown:
            raise SystemExit(f"--profiles: unknown {unknown}; params.yaml defines {['default', *params['profiles']]}")
        folders = {p: folders.get(p, root / "build" / p) for p in wanted}
    profiles = list(folders)
    try:
        rows = evaluate(claims, folders, root)
    except UnreadableResults as exc:
        raise SystemExit(f"claims: {exc}") from None
    if a.out:
        out = root / a.out
        write(out / "claims.csv", to_csv(rows))
        write(out / "claims.md", to_markdown(rows, profiles[-1]))
        print(f"{len(claims)} claims, profiles {profiles}: wrote {_rel(out, root)}/claims.csv and claims.md")
        return rows
    write(root / "results" / "claims.csv", to_csv(rows))
    write(root / "results" / "claims.md", to_markdown(rows))
    write(root / "reports" / "index.html", to_html(rows, profiles, stages))
    for stage in (name for name, s in stages.items() if not s.is_plot):
        write(root / "results" / "claims" / f"{stage}.json", json.dumps(headline(rows, stage), indent=1) + "\n")
    default = [r for r in rows if r["profile"] == "default"]
    print(f"{len(claims)} claims, profiles {profiles}; default profile: "
          + ", ".join(f"{sum(r['verdict'] == v for r in default)} {v}" for v in VERDICTS))
    stale = [f"{r['id']}: {r['value']}" for r in rows if r["verdict"] == "no value"]
    if a.check and stale:
        raise SystemExit("claims with no value (a path not in the results):\n  " + "\n  ".join(stale))
    return rows


if __name__ == "__main__":
    main()
