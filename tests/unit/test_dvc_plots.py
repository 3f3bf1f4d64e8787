"""`dvc plots show` draws what the figures draw: every curve figure has its plot, each series in its own colour
with a legend, the figures' log axes, and a missing value is never drawn (not as 0 either); offline, in a real
headless browser.

A scratch DVC project gets this repository's dvc.yaml, .dvc/config (plots.html_template), .dvc/plots/ templates
and plots/ (the template page and the vendored vega, vega-lite and vega-embed), and for every plotted CSV the
smoke profile's copy (tests/regression/expected/<stage>/: the columns the stages write), with one row more per
plot whose y is empty, at an x beyond the others; `dvc plots show` writes dvc_plots/index.html, which Chromium
opens with every host unresolvable. A check script (added to a copy of the page, beside it) keeps each chart's
Vega view and reports, per chart, its scales, the drawn series and legends and any script error into
#page-check; Chromium's --dump-dom prints it.

Needs dvc and Chromium (Debian package `chromium`); without Chromium the browser tests skip, unless
PFLKIT_REQUIRE_BROWSER=1 (CI sets it).
"""
import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pflkit import stages
from repo_files import load

ROOT = Path(__file__).resolve().parents[2]
BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
DVC = shutil.which("dvc", path=str(Path(sys.executable).parent)) or shutil.which("dvc")
SPEC = yaml.safe_load((ROOT / "dvc.yaml").read_text())
EXPECTED = ROOT / "tests/regression/expected"
dvc_stages = load("scripts/dvc_stages.py")
NEEDS_BROWSER = pytest.mark.skipif(BROWSER is None and os.environ.get("PFLKIT_REQUIRE_BROWSER") != "1",
                                   reason="no chromium on PATH (apt-get install chromium)")

#: every figure that draws curves, and the plots that draw them (a plot's id: its name, or its CSV's path)
CURVE_FIGURES = {
    **{f"perm_fig{n}": [f"perm_fig{n}_accuracy", f"perm_fig{n}_loss"] for n in (1, 2, 4)},
    "perm_hetero": ["perm_hetero_accuracy"],
    "perm_alpha_convergence": ["perm_alpha_convergence_errors"],
    "flower_equivalence": ["flower_equivalence_accuracy", "flower_equivalence_differences"],
    **{f"charles_fig{n}": [f"results/charles_fig{n}/frontier.csv"] for n in (1, 2, 3, 4, 5, 7, 8, 9, 10)},
    "charles_fig6": ["charles_fig6_test_accuracy", "charles_fig6_test_loss"],  # Figs. 6 and 11
    "charles_fig12": ["charles_fig12_train_loss"],
    "charles_fig13": ["charles_fig13_train_loss", "results/charles_fig13/tuned.csv"],
    "chayti_fig1": ["results/chayti_fig1/check.csv"],
    **{f"chayti_fig{n}": [f"results/chayti_fig{n}/curves.csv"] for n in (2, 3, 4, 5)},
}
#: the axes the figures draw on a log scale (x, y); every other plot is linear on both
SCALES = {**{f"perm_fig{n}_loss": ("linear", "log") for n in (1, 2, 4)},
          "perm_alpha_convergence_errors": ("log", "log"),
          "results/chayti_fig1/check.csv": ("log", "log"),
          **{f"results/chayti_fig{n}/curves.csv": ("linear", "log") for n in (2, 3, 4, 5)},
          "flower_equivalence_differences": ("linear", "symlog")}
#: the tables that hold curves: a compute stage writing one has a plot drawing it
CURVE_TABLES = ("history.csv", "curves.csv", "frontier.csv", "convergence.csv")

CHECK = """<script>
window.__errors = []; window.__views = [];
window.addEventListener('error', e => window.__errors.push(e.message || String(e)));
window.addEventListener('unhandledrejection', e => window.__errors.push(String(e.reason)));
let realEmbed;  // keep each chart's view: vega-embed's UMD build assigns window.vegaEmbed
Object.defineProperty(window, 'vegaEmbed', {configurable: true, set(f) { realEmbed = f; }, get() {
  return realEmbed && ((el, spec, opt) => realEmbed(el, spec, opt).then(r => {
    window.__views.push([el.slice(1), r.view]); return r; }));
}});
function walk(node, f) { f(node); (node.items || []).forEach(i => walk(i, f)); }
function scale(view, name) { try { const s = view.scale(name); return s ? [s.type, s.domain()] : null; }
                             catch (e) { return null; } }
window.addEventListener('load', () => setTimeout(() => {
  const divs = [...document.querySelectorAll('body > div[id]')];
  const drawn = divs.filter(d => d.querySelector('canvas, svg'));
  const report = {};
  for (const [id, view] of window.__views) {
    let legends = [], items = 0;
    walk(view.scenegraph().root, n => {
      if (n.role === 'legend-title') legends.push(...(n.items || []).map(i => i.text));
      if ((n.marktype === 'line' || n.marktype === 'symbol') && n.role === 'mark') items += (n.items || []).length;
    });
    report[id] = {x: scale(view, 'x'), y: scale(view, 'y'), color: scale(view, 'color'), legends, items};
  }
  const p = document.createElement('p'); p.id = 'page-check';
  p.textContent = `plots ${divs.length}; drawn ${drawn.length}; errors ${window.__errors.length}` +
                  (window.__errors.length ? ': ' + window.__errors.join(' | ') : '');
  const pre = document.createElement('pre'); pre.id = 'page-report'; pre.textContent = JSON.stringify(report);
  document.body.appendChild(p); document.body.appendChild(pre);
}, 3000));
</script>"""


def plots() -> dict[str, tuple[stages.Stage, stages.Plot]]:
    """Every plot of the stage table: its id in dvc.yaml (its name, or its CSV's path) -> (stage, plot)."""
    return {plot.name or f"{s.results_dir}/{plot.file}": (s, plot) for s in stages.STAGES for plot in s.plots}


def plot_entries() -> dict[str, dict]:
    """Every plot dvc.yaml defines: id -> its properties (stage outputs' and top-level)."""
    found = {}
    for stage in SPEC["stages"].values():
        for entry in stage.get("plots", []) or []:
            (path, props), = entry.items()
            found[path] = props or {}
    for entry in SPEC.get("plots", []) or []:
        (path, props), = entry.items()
        found[path] = props or {}
    return found


def div_id(plot_id: str) -> str:
    """dvc-render's HTML id of a plot (``Renderer.remove_special_chars``)."""
    return plot_id.translate({ord(c): "_" for c in r"!@#$%^&*()[]{};,<>?\/:.|`~=_+ "})


def y_columns(plot: stages.Plot) -> list[str]:
    return list(plot.y) if isinstance(plot.y, tuple) else [plot.y]


def smoke_rows(stage: stages.Stage, plot: stages.Plot) -> list[dict]:
    """The smoke profile's copy of the plot's CSV (what the stage writes), as rows of strings."""
    with open(EXPECTED / stage.name / plot.file, newline="") as f:
        return list(csv.DictReader(f))


def number(text) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def drawn_rows(plot: stages.Plot, rows: list[dict]) -> list[dict]:
    """The rows the plot's template keeps (its metric; x and y numbers, positive on a log axis), one per y
    column, with DVC's ``field`` (the y column)."""
    out = []
    for row in rows:
        if plot.metric and row.get("metric") != plot.metric:
            continue
        for y in y_columns(plot):
            x_value, y_value = number(row[plot.x]), number(row[y])
            if x_value is None or y_value is None:
                continue
            if (plot.x_scale == "log" and x_value <= 0) or (plot.y_scale == "log" and y_value <= 0):
                continue
            out.append({**row, "field": y})
    return out


def series_names(plot: stages.Plot, rows: list[dict]) -> set[tuple]:
    return {tuple(row.get(c) for c in plot.series) for row in drawn_rows(plot, rows)}


def injected_x(plot: stages.Plot, rows: list[dict]) -> float:
    """An x beyond every drawn row's: where the fixture puts its row with an empty y."""
    top = max(number(r[plot.x]) for r in drawn_rows(plot, rows))
    return top * 10 if plot.x_scale == "log" else top + 1


# ----------------------------------------------------------------------------- what dvc.yaml declares
def test_every_plot_names_its_x_y_and_a_template_of_its_own_folder():
    """Without y, DVC draws the CSV's last column only (issue 30); each template is one scripts/dvc_stages.py
    writes (its --check: tests/unit/test_stages.py)."""
    entries = plot_entries()
    assert set(entries) == set(plots())
    for plot_id, props in entries.items():
        assert props.get("x") and props.get("y") and props.get("template"), plot_id
        assert (ROOT / ".dvc/plots" / f"{props['template']}.json").is_file(), plot_id


def test_every_curve_figure_has_its_plots():
    """Each figure that draws curves (PERM Figs. 1, 2, 4, Theorem 1, Sec. 3.3; every Charles et al. frontier and
    neural-network figure; Chayti et al.'s Figs. 1 (b)-5; Flower's equivalence) has the plots of its curves, and
    every compute stage that writes a table of curves draws it."""
    declared = plots()
    for stage, ids in CURVE_FIGURES.items():
        assert set(ids) <= set(declared), (stage, sorted(set(ids) - set(declared)))
        assert {s.name for s, _ in (declared[i] for i in ids)} == {stage}
    for s in stages.compute_stages():
        for table in set(s.results) & set(CURVE_TABLES):
            assert any(p.file == table for p in s.plots), f"{s.name} writes {table}; no plot draws it"
    assert set(CURVE_FIGURES) == {s.name for s, _ in declared.values()}


def test_every_plot_reads_columns_the_stage_writes():
    """The x, y, series and metric of each plot are in the smoke profile's copy of its CSV (the stage's columns;
    ``field`` is DVC's: the y column of a plot of several)."""
    for plot_id, (stage, plot) in plots().items():
        rows = smoke_rows(stage, plot)
        columns = set(rows[0])
        assert {plot.x, *y_columns(plot)} <= columns, plot_id
        assert set(plot.series) - {"field"} <= columns, plot_id
        assert "field" not in plot.series or isinstance(plot.y, tuple), plot_id
        assert not plot.metric or plot.metric in {r["metric"] for r in rows}, plot_id
        assert not plot.mean_over or plot.mean_over in columns, plot_id
        assert drawn_rows(plot, rows), plot_id


def test_templates_draw_series_in_colour_with_a_legend_on_the_figures_scales():
    """From the templates alone: every plot's colour is its series (a legend, titled by the columns), DVC's
    revision its dashes or shapes; x and y are the CSV's columns made numbers, empty cells filtered out before
    any mean; the scales are the figures'."""
    for plot_id, (_, plot) in plots().items():
        spec = json.loads((ROOT / ".dvc/plots" / f"{plot.template}.json").read_text())
        enc = spec["encoding"]
        assert enc["color"]["field"] == dvc_stages.SERIES and enc["color"]["legend"] is not None, plot_id
        assert enc["color"]["title"] == " | ".join(plot.series), plot_id
        dashes = [spec.get("encoding", {}), *(layer["encoding"] for layer in spec.get("layer", []))]
        assert any(e.get("strokeDash", e.get("shape", {})).get("field") == "rev" for e in dashes), plot_id
        assert (enc["x"].get("scale", {}).get("type", "linear"), enc["y"].get("scale", {}).get("type", "linear")) \
            == SCALES.get(plot_id, ("linear", "linear")), plot_id
        steps = spec["transform"]
        kinds = [next(iter(t)) for t in steps]
        filters = [i for i, t in enumerate(steps) if "filter" in t and dvc_stages.Y_NUM in t["filter"]]
        assert filters and kinds.index("calculate") < filters[0], plot_id
        assert f'toNumber(datum["{dvc_stages._Y}"])' in [t.get("calculate") for t in steps], plot_id
        assert "aggregate" not in kinds or kinds.index("aggregate") > filters[0], plot_id
        assert ("aggregate" in kinds) == bool(plot.mean_over), plot_id


# ----------------------------------------------------------------------------- what DVC renders
def _fixture_project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    proj.mkdir()
    subprocess.run([DVC, "init", "--no-scm", "-q"], cwd=proj, check=True)
    shutil.copy(ROOT / "dvc.yaml", proj / "dvc.yaml")
    shutil.copy(ROOT / ".dvc/config", proj / ".dvc/config")
    shutil.copytree(ROOT / ".dvc/plots", proj / ".dvc/plots", dirs_exist_ok=True)
    shutil.copytree(ROOT / "plots", proj / "plots")
    tables: dict[str, list[dict]] = {}
    for stage, plot in plots().values():
        path = f"{stage.results_dir}/{plot.file}"
        rows = tables.setdefault(path, smoke_rows(stage, plot))
        first = drawn_rows(plot, rows)[0]
        missing = {k: v for k, v in first.items() if k != "field"}
        missing.update({plot.x: repr(injected_x(plot, rows)), **{y: "" for y in y_columns(plot)}})
        rows.append(missing)  # an empty y: dropped by the template (never drawn, not as 0 either)
    for path, rows in tables.items():
        (proj / path).parent.mkdir(parents=True, exist_ok=True)
        with open(proj / path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return proj


def _page(proj: Path) -> Path:
    out = subprocess.run([DVC, "plots", "show"], cwd=proj, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return proj / "dvc_plots/index.html"


def _specs(page: Path) -> dict[str, dict]:
    """The page's charts: HTML id -> the Vega-Lite spec DVC filled in."""
    return {name: json.loads(s) for s, name in
            re.findall(r"var spec = (\{.*?\});\s*vegaEmbed\('#([^']+)'", page.read_text(), re.S)}


def _page_check(page: Path) -> tuple[str, dict]:
    checked = page.with_name("check.html")  # beside the page: its relative script paths resolve the same
    checked.write_text(page.read_text().replace("<head>", "<head>\n" + CHECK, 1))
    proc = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
                           "--host-resolver-rules=MAP * ~NOTFOUND",  # offline: no host resolves
                           "--virtual-time-budget=20000", "--dump-dom", checked.as_uri()],
                          capture_output=True, text=True, timeout=180, check=False)
    found = re.search(r'<p id="page-check">([^<]*)</p>', proc.stdout)
    assert found, f"no #page-check in the dumped DOM (exit {proc.returncode}): {proc.stderr[-2000:]}"
    report = re.search(r'<pre id="page-report">([^<]*)</pre>', proc.stdout)
    import html
    return found.group(1), json.loads(html.unescape(report.group(1))) if report else {}


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    if DVC is None:
        pytest.skip("dvc not installed")
    return _page(_fixture_project(tmp_path_factory.mktemp("plots")))


def test_page_loads_the_vendored_scripts_by_paths_that_resolve(page):
    html = page.read_text()
    sources = re.findall(r'<script[^>]*\ssrc="([^"]+)"', html)
    assert sources == ["../plots/vendor/vega.min.js", "../plots/vendor/vega-lite.min.js",
                       "../plots/vendor/vega-embed.min.js"]
    assert all((page.parent / s).resolve().is_file() for s in sources)
    assert "cdn.jsdelivr" not in html and not re.search(r'src="https?:', html)


def test_dvc_renders_every_plot_with_its_data_and_template(page):
    """Every plot is on the page with its template's colour, scales and number filter, and its data as DVC
    read it: the empty cells are there as DVC passes them ("", which Vega-Lite would draw as 0 if the template
    did not make them numbers and drop them)."""
    specs = _specs(page)
    assert set(specs) == {div_id(i) for i in plots()}
    for plot_id, (_, plot) in plots().items():
        spec = specs[div_id(plot_id)]
        assert spec["encoding"]["color"]["field"] == dvc_stages.SERIES, plot_id
        assert spec["encoding"]["y"].get("scale", {}).get("type", "linear") \
            == SCALES.get(plot_id, ("linear", "linear"))[1], plot_id
        y = "dvc_inferred_y_value" if isinstance(plot.y, tuple) else plot.y
        assert f'toNumber(datum["{y}"])' in [t.get("calculate") for t in spec["transform"]], plot_id
        values = spec["data"]["values"]
        rows = [v for v in values if not plot.metric or v.get("metric") == plot.metric]
        assert any(v[y] == "" for v in rows), plot_id  # the fixture's empty cell reaches the page as ""


@NEEDS_BROWSER
def test_every_plot_draws_offline_as_the_figures_do_in_a_headless_browser(page):
    """In Chromium, offline: every chart draws without a script error; no chart draws the row whose y is empty
    (its x lies beyond the x axis); the axes are the figures' scales; each series is a colour of its own, in a
    legend titled by the series' columns."""
    n = len(plot_entries())
    check, report = _page_check(page)
    assert check == f"plots {n}; drawn {n}; errors 0"
    assert set(report) == {div_id(i) for i in plots()}
    for plot_id, (stage, plot) in plots().items():
        got = report[div_id(plot_id)]
        rows = smoke_rows(stage, plot)
        x_type, y_type = SCALES.get(plot_id, ("linear", "linear"))
        assert (got["x"][0], got["y"][0]) == (x_type, y_type), plot_id
        assert got["x"][1][1] < injected_x(plot, rows), (plot_id, got["x"])  # the empty y is not drawn
        assert got["items"] > 0, plot_id
        series = series_names(plot, rows)
        assert len(got["color"][1]) == len(series), (plot_id, got["color"], series)
        assert " | ".join(plot.series) in got["legends"], (plot_id, got["legends"])  # the colours' legend


@NEEDS_BROWSER
def test_the_browser_check_fails_without_the_vendored_scripts(page, tmp_path):
    """The check above can fail: with vega-lite missing, no chart draws and the page reports the error."""
    copy = tmp_path / "proj"
    shutil.copytree(page.parents[1], copy)
    (copy / "plots/vendor/vega-lite.min.js").unlink()
    check, _ = _page_check(copy / "dvc_plots/index.html")
    assert re.fullmatch(rf"plots {len(plot_entries())}; drawn 0; errors [1-9]\d*: .*", check), check
