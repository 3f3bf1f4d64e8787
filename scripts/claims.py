"""The claims ledger: evaluate claims.yaml against every profile's results; write the table and the page.

    python scripts/claims.py                  by hand: build/claims/{index.html,claims.csv,claims.md,html/}
    python scripts/claims.py --profiles default,smoke   the same with the columns named (smoke only when asked)
    python scripts/claims.py --dvc            the DVC stage `claims`: results/claims.{csv,md}, reports/index.html,
                                              reports/html/, results/claims/ (default profile)
    python scripts/claims.py --check          also exit 1 when a run stage's claim has no value (a stale path)

For each entry of claims.yaml and each profile with results (default: results/<stage>/metrics.json, what ``dvc
repro`` writes; another profile: build/<profile>/<stage>/metrics.json; a profile with none has no column), the
value(s) at the entry's path and the verdict of its rule: holds / does not hold / inconclusive (the run cannot show
the claim, ``inconclusive``: the margin is within its seed-to-seed spread, one seed measured no spread, or the run
is shorter than the claim needs; the row's note says which) / partial (a grid stage whose cells are partly computed,
``pflkit.cells``: "k of n cells", never a verdict from part of a grid) / not run (no results) / no value (the path
is not in the results). A metrics.json that does not record its stage and the settings params.yaml gives that stage
now (another stage's file, a run of other settings, or one written before results recorded their provenance) stops
the ledger with a message naming both and the command that rewrites it. The DVC stage ``claims`` (``--dvc``) runs
after every stage and writes DVC's outputs below. After running some stages by hand (``dvc repro <stage>_plot``,
``pflkit reproduce``), run this script without ``--dvc`` to refresh the page: it writes the same page and tables
under ``build/claims/`` and never touches a DVC output; its columns are the profiles the pipelines ran (default, and
each profile with a DVC pipeline of its own that has results: ``paper``), and another profile (``smoke``, what
notebooks and nbval run) only when ``--profiles`` names it. Stages that have not run read "not run" with the command
that runs them. Outputs of ``--dvc``:

* ``results/claims.csv``: one row per claim and profile (tidy, for pandas);
* ``results/claims.md``: per paper, one table row per claim (README's results block is filled from it);
* ``reports/index.html``: the same rows, a column per profile, each stage's figures as thumbnails that open
  the PNG (and the SVG) and links to its executed notebooks as HTML; every link relative, so the page works
  moved or served; no <img> for a figure that does not exist. A small script in the page reports images
  that failed to load and script errors (``tests/unit/test_claims_page.py`` opens it in headless Chromium);
* ``reports/html/<paper>/<notebook>.html``: every executed notebook that exists
  (``reports/<paper>/<notebook>.ipynb``; another profile's: build/<profile>/reports/...), rendered by
  nbconvert for offline reading (``notebook_html.py``);
* ``results/claims/<stage>.json``: the DVC metrics, a few flat numbers per stage (claims checked, claims
  holding, the first claim's value), so ``dvc metrics show`` fits a terminal; a stage with no results
  reads ``holding: "not run"`` (no value), never a count of 0.
"""
from __future__ import annotations

import argparse
import csv
import fnmatch
import html
import io
import json
import math
import os
import re
import sys
from pathlib import Path
from urllib.parse import quote

from pflkit.cells import CellStore, store_path
from pflkit.config import read_yaml
from pflkit.report import PROVENANCE, provenance_problem, settings_digest
from pflkit.stages import PIPELINE_PROFILES, profile_path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from dvc_stages import load_stages  # noqa: E402  (the stage table, without importing pflkit)

#: where the page and tables go when the script is run by hand (not the DVC stage): never a DVC output
BY_HAND = Path("build") / "claims"
#: the measured cross-machine drift of the default profile's claims (benchmarks/drift.py)
DRIFT = Path("benchmarks") / "results" / "drift.json"
RULE = re.compile(r"^(abs )?(<=|>=|<|>) *(\S+)$")
VERDICTS = ("holds", "does not hold", "inconclusive", "partial", "not run", "no value")


class Missing(LookupError):
    """A path that is not in the results."""


class UnreadableResults(ValueError):
    """A stage's metrics.json is there but empty, not JSON or not an object, or not the stage's with the settings
    params.yaml gives it: names the file (both stages and settings) and how to rewrite it."""


def read_metrics(path: Path, stage: str, profile: str, root: Path = ROOT, params: dict | None = None) -> dict:
    """``path`` (a stage's metrics.json) as a dict; an empty or garbled file is an :class:`UnreadableResults`
    naming it, the stage that writes it and the command that does (``pflkit.report.read_json``'s message). With
    ``params`` (params.yaml's contents) its provenance must be ``stage`` with the settings ``params`` give it
    under ``profile`` (``pflkit.report.settings_digest``, what the writer recorded), else the same error, naming
    the stage and settings it records and those expected (``pflkit.report.provenance_problem``)."""
    command = run_command(stage, profile)
    try:
        text = path.read_text()
        metrics = json.loads(text) if text.strip() else None
        why = "empty" if not text.strip() else f"holds a JSON {type(metrics).__name__}, not an object"
    except (OSError, ValueError) as exc:
        metrics, why = None, f"not valid JSON ({exc})"
    if isinstance(metrics, dict):
        recorded = metrics.pop(PROVENANCE, None)
        why = None if params is None else provenance_problem(
            recorded, {"stage": stage, "settings": settings_digest(params, stage, profile)})
        if why is None:
            return metrics
        raise UnreadableResults(f"{_rel(path, root)}: {why}; stage {stage} rewrites it: run `{command}`")
    raise UnreadableResults(f"{_rel(path, root)}: {why}; written by stage {stage}: run `{command}`")


def run_command(stage: str, profile: str) -> str:
    """The command that runs ``stage`` (and what it needs) under ``profile``."""
    table = load_stages()
    if profile == "default":
        return f"dvc repro {stage}"
    if profile in table.PIPELINE_PROFILES:
        return f"dvc repro {table.pipeline_file(profile)}:{stage}"
    source = stage.removesuffix("_plot")
    return f"python -m pflkit reproduce --profile {profile} --stages " + (
        f"{source},{stage}" if source != stage else stage)


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
    if rule == "equal":  # every path gives the same value, entry by entry (e.g. two verdicts agree)
        if any(len(col) != len(columns[0]) for col in columns):
            raise ValueError(f"rule {rule!r}: the paths match different numbers of entries")
        return all(all(v == r[0] for v in r) for r in zip(*columns))
    if rule.startswith("between "):
        lo, hi = map(float, rule.split()[1:])
        return all(lo <= v <= hi for v in flat)
    if rule.startswith("within "):
        tol = float(rule.split()[1])
        return all(max(r) - min(r) <= tol for r in zip(*columns))
    m = RULE.match(rule)
    if not m:
        raise ValueError(f"unknown rule {rule!r}; allowed: true, < x, <= x, > x, >= x, abs < x, between lo hi, "
                         "within x, equal, increasing, decreasing, nondecreasing")
    absolute, op, bound = m.group(1), m.group(2), float(m.group(3))
    cmp = {"<": lambda v: v < bound, "<=": lambda v: v <= bound, ">": lambda v: v > bound, ">=": lambda v: v >= bound}
    return all(cmp[op](abs(v) if absolute else v) for v in flat)


def inconclusive(metrics: dict, claim: dict, columns: list[list]) -> str | None:
    """Why the run cannot show the claim, or None (the rule's verdict stands):

    * ``spread`` (a path to the seed-to-seed standard deviation of the value, e.g. the sd over seeds of the
      paired per-seed margin) and ``seeds`` (the path to how many seeds ran): with one seed no spread was
      measured; with more, a single value within one sd of the rule's bound could fall either side of it
      on other seeds;
    * ``min_rounds`` ({value: path to the rounds run, at_least: n, source: where n comes from}): a claim about
      where a run ends up, from a run shorter than that (every match of the path is checked).
    """
    if "seeds" in claim:
        try:
            seeds = lookup(metrics, claim["seeds"])[0]
        except Missing:
            seeds = None
        if seeds == 1:
            return "one seed: the seed-to-seed spread of the margin is not measured"
    m = RULE.match(" ".join(str(claim["rule"]).split()))
    if "spread" in claim and m and not m.group(1) and len(columns) == 1 and len(columns[0]) == 1:
        try:
            spread = float(lookup(metrics, claim["spread"])[0])
        except Missing:
            spread = None
        value, bound = float(columns[0][0]), float(m.group(3))
        if spread is not None and abs(value - bound) <= spread:
            return (f"the value {show(value)} is within one seed-to-seed sd ({show(spread)}) of {show(bound)}: "
                    "other seeds could put it on either side")
    need = claim.get("min_rounds")
    if need:
        try:
            ran = [int(r) for r in lookup(metrics, need["value"])]
        except Missing:
            ran = []
        short = [r for r in ran if r < int(need["at_least"])]
        if short:
            return (f"{min(short)} rounds run; the claim is about where the runs end up, which needs "
                    f"{need['at_least']} rounds ({need['source']})")
    return None


def drifted(claim: dict, columns: list[list], drift: dict | None) -> str | None:
    """Why another machine could give another verdict, or None: ``drift`` is the claim's entry of
    benchmarks/results/drift.json (the same commit run on several CPUs): the rule's verdict differed between
    those runs, or a value lies within the measured drift of the rule's bound (the rule's verdict with every
    value moved by + or - the drift differs)."""
    if not drift:
        return None
    verdicts = drift.get("verdicts", {})
    if len(set(verdicts.values())) > 1:
        return "the verdict differs between machines (" + "; ".join(f"{k}: {v}" for k, v in verdicts.items()) + ")"
    d = drift.get("drift")
    rule = " ".join(str(claim["rule"]).split())
    if not d or not (RULE.match(rule) or rule.startswith("between ")):
        return None

    def moved(by: float) -> list[list]:
        return [[v + by if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in col]
                for col in columns]
    if decide(rule, moved(d)) != decide(rule, moved(-d)):
        return (f"a value is within the cross-machine drift ({show(d)}, benchmarks/results/drift.md) of the "
                "rule's bound: another CPU could put it on either side")
    return None


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
    if metrics.get("setting"):  # the curve stages' setting as it ran (clients, split, model, rounds, K, seeds)
        name = f"{name}: {metrics['setting']}" if name else str(metrics["setting"])
    return name, substitute


def evaluate(claims: list[dict], folders: dict[str, Path], root: Path = ROOT, drift: dict | None = None,
             params: dict | None = None) -> list[dict]:
    """One row per claim and profile: value(s), estimate (mean ± sd), verdict, dataset; ``folders`` maps each profile to
    the folder holding its <stage>/metrics.json; ``drift`` (claim id -> its entry of drift.json, measured at the
    default profile) makes a default-profile verdict that another machine could flip inconclusive. With ``params``
    (params.yaml's contents; :func:`main` always passes them) every metrics.json read must record its stage and the
    settings ``params`` give it under that profile (:func:`read_metrics`); without, the values are read unchecked
    (tests/regression/expected: committed copies of smoke results)."""
    rows, drift = [], drift or {}
    for c in claims:
        for profile, folder in folders.items():
            row = {k: c.get(k, "") for k in ("id", "paper", "figure", "stage", "claim", "metric", "rule", "why")}
            row.update(profile=profile, value="", estimate="", verdict="not run", dataset="", substitute=False,
                       note="")
            path = folder / c["stage"] / "metrics.json"
            row["ran"] = path.is_file()
            cells = None if row["ran"] or params is None else cell_progress(c["stage"], profile, params, root)
            if cells is not None:  # a grid stage whose cells are partly computed: no verdict from part of a grid
                row["verdict"], row["value"] = "partial", f"{cells[0]} of {cells[1]} cells"
                row["note"] = f"the rest run with `{run_command(c['stage'], profile)}`"
            elif row["ran"] and profile not in c.get("profiles", [profile]):
                row["note"] = f"claims.yaml checks it under {', '.join(c['profiles'])} only"
            elif row["ran"]:
                metrics = read_metrics(path, c["stage"], profile, root, params)
                row["dataset"], row["substitute"] = dataset_of(metrics)
                paths = c["values"] if "values" in c else [c["value"]]
                try:
                    columns = [lookup(metrics, p) for p in paths]
                    row["verdict"] = "holds" if decide(c["rule"], columns) else "does not hold"
                    why_not = inconclusive(metrics, c, columns) or (
                        drifted(c, columns, drift.get(c["id"])) if profile == "default" else None)
                    if why_not:
                        row["verdict"], row["note"] = "inconclusive", f"{why_not} (the rule alone: {row['verdict']})"
                    flat = [v for col in columns for v in col]
                    row["value"] = ", ".join(show(v) for v in flat[:8]) + (" ..." if len(flat) > 8 else "")
                    row["first"] = flat[0]
                    row["estimate"] = estimate(metrics, c)
                except (Missing, ValueError) as exc:  # a path not in the results, or paths that do not pair up
                    row["verdict"], row["value"] = "no value", f"{exc} in {_rel(path, root)}"
            rows.append(row)
    return rows


def cell_progress(stage: str, profile: str, params: dict, root: Path = ROOT) -> tuple[int, int] | None:
    """(cells stored, cells planned) of a grid stage's last run under ``profile`` (``pflkit.cells``: the plan its
    run wrote in the cell store, the project's cells/ for a DVC pipeline's profile, else build/<profile>/cells),
    when that run had the settings ``params`` give the stage now; else None."""
    store = CellStore(root / store_path(profile))
    got = store.progress(stage)
    if got is None or got[2] != settings_digest(params, stage, profile):
        return None
    return got[0], got[1]


def _rel(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def result_folders(params: dict, root: Path, stages: list[str]) -> dict[str, Path]:
    """The results folder of every pipeline profile that has run (results/, what ``dvc repro`` writes, for the
    default profile; build/<profile>/ for a profile with a DVC pipeline of its own, ``PIPELINE_PROFILES``;
    a profile that only ``pflkit reproduce`` or a notebook runs, such as smoke, is left out): one with no
    ``<stage>/metrics.json`` of any of ``stages`` has no results and no column. When none has any: the
    default alone (every stage "not run")."""
    names = ["default", *(str(p) for p in (params.get("profiles") or {}) if p in PIPELINE_PROFILES)]
    folders = {p: root / profile_path("results", p) for p in names}
    ran = {p: f for p, f in folders.items() if any((f / s / "metrics.json").is_file() for s in stages)}
    return ran or {"default": folders["default"]}


# --------------------------------------------------------------------------------------- outputs
COLUMNS = ["id", "paper", "figure", "stage", "profile", "claim", "metric", "rule", "value", "estimate", "verdict",
           "dataset", "substitute", "why", "note"]


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
                verdict = f"**{r['verdict']}**" + (f": {r['note']}" if r["verdict"] in ("inconclusive", "partial")
                                                   else "")
                if r["verdict"] == "not run" and r["ran"]:  # its stage ran, but the claim is not judged here
                    verdict = f"**not checked** under this profile: {r['note']}"
                lines.append(f"| {r['figure']} | {r['claim']} | {r['metric']}: {value} | {verdict} | {data} |")
        lines.append("")
    return "\n".join(lines)


PAGE_CHECK = """<script>
const problems = [];
window.addEventListener("error", e => problems.push("script error: " + e.message));
window.addEventListener("load", () => {
  const imgs = [...document.images];
  imgs.filter(i => !(i.complete && i.naturalWidth > 0))
      .forEach(i => problems.push("image not loaded: " + i.getAttribute("src")));
  const out = document.getElementById("page-check");
  const found = problems.length ? ": " + problems.join("; ") : "";
  out.textContent = "images " + imgs.length + "; problems " + problems.length + found;
});
</script>"""
#: thumbnails: figures are 2-5 times wider than tall; a click opens the full PNG
THUMB_WIDTH = 420


def plot_of(stage, stages: dict):
    """The plot stage that draws ``stage``'s figures, or None."""
    return next((s for s in stages.values() if s.source == stage.name), None)


def link(target: Path, page_dir: Path) -> str:
    """``target`` as a relative URL from the page's folder (never absolute: the page works moved or served)."""
    return quote(Path(os.path.relpath(target, page_dir)).as_posix())


def notebook_pages(stages: dict, profiles: list[str], root: Path, html_dir: Path | None = None
                   ) -> dict[tuple[str, str], Path]:
    """Render every executed notebook that exists (``reports/<paper>/<notebook>.ipynb``; another profile's
    under build/<profile>/reports/) with nbconvert (offline: ``notebook_html``) into
    ``<that reports folder>/html/<paper>/<notebook>.html`` (the DVC stage's), or, given ``html_dir``, into
    ``html_dir/<profile>/<paper>/<notebook>.html``; each folder is rebuilt whole. Returns {(profile, stage
    name): html path}."""
    import notebook_html  # nbconvert: only the page needs it (not ``--out``, what ``pflkit reproduce`` runs)

    pages = {}
    for profile in profiles:
        reports = root / profile_path("reports", profile)
        target = reports / "html" if html_dir is None else html_dir / profile
        pairs = []
        for s in stages.values():
            ipynb = reports / s.paper / f"{s.stem}.ipynb"
            if ipynb.is_file():
                pages[profile, s.name] = target / s.paper / f"{s.stem}.html"
                pairs.append((ipynb, pages[profile, s.name]))
        if pairs or target.exists():
            notebook_html.render_tree(pairs, target)
    return pages


def _figure_cell(stage, profiles: list[str], ran: dict, stages: dict, pages: dict, root: Path,
                 page_dir: Path) -> str:
    """The stage's figures (thumbnails linking to the PNG, plus the SVG) and its notebook pages, per profile;
    a figure that does not exist has no <img>: the cell says it is not drawn and how to draw it."""
    esc = html.escape
    plot = plot_of(stage, stages)
    parts = []
    for profile in profiles:
        bits, links, missing = [], [], []
        for name in (plot.figure_names if plot is not None else ()):
            png = root / profile_path(f"{plot.figures_dir}/{name}.png", profile)
            svg = png.with_suffix(".svg")
            if png.is_file():
                src, alt = link(png, page_dir), esc(f"{name} ({profile} profile)")
                bits.append(f"<a class=\"figure\" href=\"{src}\"><img class=\"thumb\" src=\"{src}\" "
                            f"width=\"{THUMB_WIDTH}\" alt=\"{alt}\"></a>")
                if svg.is_file():
                    links.append(f"<a href=\"{link(svg, page_dir)}\">{esc(name)}.svg</a>")
            elif ran[profile]:  # the verdict cell says "not run" (with its command) otherwise
                missing.append(name)
        if missing:
            what = f"figure{'s' if len(missing) > 1 else ''} {', '.join(missing)} not drawn: run"
            bits.append(f"<div class=\"missing\">{esc(what)} <code>{esc(run_command(plot.name, profile))}</code></div>")
        links[:0] = [f"<a class=\"notebook\" href=\"{link(pages[profile, s.name], page_dir)}\">{what}</a>"
                     for s, what in ((stage, "notebook"), (plot, "figure notebook"))
                     if s is not None and (profile, s.name) in pages]
        if links:
            bits.append("<div>" + " · ".join(links) + "</div>")
        if bits:
            label = f"<span class=\"profile\">{esc(profile)}</span> " if len(profiles) > 1 else ""
            parts.append(f"<div class=\"run\">{label}{''.join(bits)}</div>")
    return "".join(parts)


def _verdict_cell(row: dict) -> str:
    esc = html.escape
    verdict = row["verdict"]
    if verdict == "not run":
        return f"<td class=\"not-run\"><b>not checked</b> under this profile<br><small>{esc(row['note'])}</small></td>"
    estimate = f" ({esc(row['estimate'])})" if row["estimate"] else ""
    note = f"<br><small>{esc(row['note'])}</small>" if row.get("note") else ""
    return (f"<td class=\"{esc(verdict.replace(' ', '-'))}\"><b>{esc(verdict)}</b><br>{esc(row['value'])}{estimate}"
            f"{note}</td>")


def to_html(rows: list[dict], profiles: list[str], stages: dict, root: Path = ROOT, pages: dict | None = None,
            page_dir: Path | None = None) -> str:
    """The claims page: per paper a table, one row per claim, a column per profile; the figure and data
    cells span a stage's claims. Every link is relative to the page's folder ``page_dir`` (default reports/,
    the DVC stage's: figures at ../figures/<paper>/, notebook pages at html/<paper>/<notebook>.html, ``pages``;
    another profile's under ../build/<profile>/).
    A stage with no results under a profile reads "not run" with the command that runs it, and has no image."""
    esc, pages, page_dir = html.escape, pages or {}, page_dir or root / "reports"
    groups: dict[str, dict[str, dict[str, dict]]] = {}  # stage -> claim id -> profile -> row
    for r in rows:
        groups.setdefault(r["stage"], {}).setdefault(r["id"], {})[r["profile"]] = r
    body = []
    for paper in dict.fromkeys(r["paper"] for r in rows):
        body.append(f"<h2>{esc(paper)}</h2><table><tr><th>figure</th><th>claim</th><th>metric</th>"
                    + "".join(f"<th>{esc(p)} profile</th>" for p in profiles) + "<th>data</th></tr>")
        for stage_name, claims_of in groups.items():
            per_claim = list(claims_of.values())
            if per_claim[0][profiles[0]]["paper"] != paper:
                continue
            stage, span = stages[stage_name], len(per_claim)
            runs = (plot_of(stage, stages) or stage).name  # running the figure runs the stage too
            ran = {p: any(per[p]["ran"] for per in per_claim) for p in profiles}
            labels = ", ".join(dict.fromkeys(per[profiles[0]]["figure"] for per in per_claim))
            datasets = {p: esc(per_claim[0][p]["dataset"]) + (" <b>(substitute)</b>" if per_claim[0][p]["substitute"]
                                                               else "") for p in profiles if ran[p]}
            data = (next(iter(datasets.values())) if len(set(datasets.values())) == 1 else
                    "<br>".join(f"{esc(p)}: {d}" for p, d in datasets.items()))
            for i, per in enumerate(per_claim):
                first = per[profiles[0]]
                cells = []
                for p in profiles:
                    if not ran[p] and i == 0 and per[p]["verdict"] == "partial":  # part of a grid's cells
                        cells.append(f"<td class=\"partial\" rowspan=\"{span}\"><b>partial</b><br>"
                                     f"{esc(per[p]['value'])}<br>run <code>"
                                     f"{esc(run_command(runs, p))}</code></td>")
                    elif not ran[p] and i == 0:  # the stage has no results: one cell for all its claims
                        cells.append(f"<td class=\"not-run\" rowspan=\"{span}\"><b>not run</b><br>run <code>"
                                     f"{esc(run_command(runs, p))}</code></td>")
                    elif ran[p]:
                        cells.append(_verdict_cell(per[p]))
                lead = (f"<td rowspan=\"{span}\"><b>{esc(labels)}</b> <code>{esc(stage_name)}</code>"
                        f"{_figure_cell(stage, profiles, ran, stages, pages, root, page_dir)}</td>") if i == 0 else ""
                tail = f"<td rowspan=\"{span}\">{data}</td>" if i == 0 else ""
                body.append(f"<tr data-stage=\"{esc(stage_name)}\">{lead}<td>{esc(first['claim'])}<br>"
                            f"<small>{esc(first['why'])}</small></td><td>{esc(first['metric'])}<br><small>rule: "
                            f"{esc(str(first['rule']))}</small></td>{''.join(cells)}{tail}</tr>")
        body.append("</table>")
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:2em}"
             "td,th{border:1px solid #ccc;padding:6px;vertical-align:top;max-width:28em}"
             f"td:first-child{{min-width:{THUMB_WIDTH}px;max-width:{THUMB_WIDTH}px}}"
             f"img.thumb{{display:block;width:{THUMB_WIDTH}px;height:auto;margin:4px 0}}"
             ".run{margin-top:6px}.profile{font-weight:bold;color:#555}"
             ".missing{color:#777}.holds{background:#e6f4e6}.does-not-hold{background:#fbe3e3}.inconclusive{background:#fff4d6}"
             ".not-run,.no-value{background:#eee}.partial{background:#e8eefb}")
    summary = "; ".join(f"{esc(p)} profile: " + ", ".join(
        f"{n} {v}" for v, n in ((v, sum(r["verdict"] == v for r in rows if r["profile"] == p)) for v in VERDICTS) if n)
        for p in profiles)
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>pflkit: the papers' claims</title>"
            f"<style>{style}</style></head><body><h1>The papers' claims, as measured</h1>"
            f"<p>Generated by <code>python scripts/claims.py</code> from claims.yaml and each stage's "
            f"metrics.json ({summary}). After running stages, run it again to refresh the page (it writes "
            f"build/claims/index.html). A figure opens "
            f"full size on a click; \"notebook\" opens the executed notebook.</p>"
            f"<p id=\"page-check\">page not checked</p>" + "".join(body) + PAGE_CHECK + "</body></html>\n")


def headline(rows: list[dict], stage: str) -> dict:
    """A stage's DVC metrics: claims checked and holding (default profile), the first claim's value; a stage
    with no results holds the string "not run" (``dvc metrics show`` prints it in the holding column)."""
    mine = [r for r in rows if r["stage"] == stage and r["profile"] == "default"]
    if mine and not any(r["ran"] for r in mine):
        partial = next((r["value"] for r in mine if r["verdict"] == "partial"), None)
        return {"claims": len(mine), "holding": f"partial: {partial}" if partial else "not run"}
    out = {"claims": len(mine), "holding": sum(r["verdict"] == "holds" for r in mine)}
    if any(r["verdict"] == "inconclusive" for r in mine):
        out["inconclusive"] = sum(r["verdict"] == "inconclusive" for r in mine)
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
    p.add_argument("--params", default=str(root / "params.yaml"),
                   help="the parameters file the stages ran with (default: params.yaml): each metrics.json must "
                        "record the settings it gives its stage")
    p.add_argument("--check", action="store_true", help="exit 1 when a claim of a stage that ran has no value")
    p.add_argument("--dvc", action="store_true",
                   help="the DVC stage `claims`: write DVC's outputs (results/claims*, reports/index.html, "
                        "reports/html/) for the default profile only, so they depend on its inputs alone")
    p.add_argument("--profiles", help="comma-separated profiles to show (default: every pipeline profile that "
                   "has run: default, and paper where build/paper/ has results; smoke only when named)")
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
    params = read_yaml(a.params, "parameters file")
    compute = [name for name, s in stages.items() if not s.is_plot]
    folders = result_folders(params, root, compute)
    if a.dvc and a.profiles not in (None, "default"):
        raise SystemExit(f"--dvc shows the default profile only (got --profiles {a.profiles})")
    if a.dvc and a.out:
        raise SystemExit("--dvc and --out: choose one (--dvc writes DVC's outputs, --out a folder of tables)")
    if a.dvc:
        a.profiles = "default"
    if a.profiles:
        wanted = a.profiles.split(",")
        unknown = [p for p in wanted if p != "default" and p not in (params.get("profiles") or {})]
        if unknown:
            raise SystemExit(f"--profiles: unknown {unknown}; params.yaml defines {['default', *params['profiles']]}")
        folders = {p: root / profile_path("results", p) for p in wanted}
    profiles = list(folders)
    drift_file = root / DRIFT
    drift = json.loads(drift_file.read_text()).get("claims", {}) if drift_file.is_file() else {}
    try:
        rows = evaluate(claims, folders, root, drift, params)
        default = ([r for r in rows if r["profile"] == "default"] if "default" in folders
                   else evaluate(claims, {"default": root / "results"}, root, drift, params))
    except UnreadableResults as exc:
        raise SystemExit(f"claims: {exc}") from None
    if a.out:
        out = root / a.out
        write(out / "claims.csv", to_csv(rows))
        write(out / "claims.md", to_markdown(rows, profiles[-1]))
        print(f"{len(claims)} claims, profiles {profiles}: wrote {_rel(out, root)}/claims.csv and claims.md")
        return rows
    if a.dvc:
        write(root / "results" / "claims.csv", to_csv(rows))
        write(root / "results" / "claims.md", to_markdown(default))
        pages = notebook_pages(stages, profiles, root)
        write(root / "reports" / "index.html", to_html(rows, profiles, stages, root, pages))
        for stage in compute:
            write(root / "results" / "claims" / f"{stage}.json",
                  json.dumps(headline(default, stage), indent=1) + "\n")
        page = root / "reports" / "index.html"
    else:  # by hand: nothing DVC tracks is touched
        out = root / BY_HAND
        write(out / "claims.csv", to_csv(rows))
        write(out / "claims.md", "\n\n".join(to_markdown(rows, p) for p in profiles))  # it keeps p's rows
        pages = notebook_pages(stages, profiles, root, html_dir=out / "html")
        page = out / "index.html"
        write(page, to_html(rows, profiles, stages, root, pages, page_dir=out))
    print(f"{len(claims)} claims, profiles {profiles}; default profile: "
          + ", ".join(f"{sum(r['verdict'] == v for r in default)} {v}" for v in VERDICTS)
          + f"; the page: {_rel(page, root)}")
    stale = [f"{r['id']}: {r['value']}" for r in rows if r["verdict"] == "no value"]
    if a.check and stale:
        raise SystemExit("claims with no value (a path not in the results):\n  " + "\n  ".join(stale))
    return rows


if __name__ == "__main__":
    main()
