"""`dvc plots show`: every plot dvc.yaml defines draws every method, offline, in a real headless browser.

A scratch DVC project gets this repository's dvc.yaml, .dvc/config (plots.html_template), .dvc/plots/ templates
and plots/ (the template page and the vendored vega, vega-lite and vega-embed), and a small fixture CSV for
every plot; `dvc plots show` writes dvc_plots/index.html, which Chromium opens with every host unresolvable.
A check script (added to a copy of the page, beside it) reports how many plots drew a chart and any script
error into #page-check; Chromium's --dump-dom prints it.

Needs dvc and Chromium (Debian package `chromium`); without Chromium the browser tests skip, unless
PFLKIT_REQUIRE_BROWSER=1 (CI sets it).
"""
import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pflkit import stages

ROOT = Path(__file__).resolve().parents[2]
BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
DVC = shutil.which("dvc", path=str(Path(sys.executable).parent)) or shutil.which("dvc")
SPEC = yaml.safe_load((ROOT / "dvc.yaml").read_text())

CHECK = """<script>
window.__errors = [];
window.addEventListener('error', e => window.__errors.push(e.message || String(e)));
window.addEventListener('unhandledrejection', e => window.__errors.push(String(e.reason)));
window.addEventListener('load', () => setTimeout(() => {
  const divs = [...document.querySelectorAll('body > div[id]')];
  const drawn = divs.filter(d => d.querySelector('canvas, svg'));
  const p = document.createElement('p'); p.id = 'page-check';
  p.textContent = `plots ${divs.length}; drawn ${drawn.length}; errors ${window.__errors.length}` +
                  (window.__errors.length ? ': ' + window.__errors.join(' | ') : '');
  document.body.appendChild(p);
}, 3000));
</script>"""


def plot_entries() -> dict[str, dict]:
    """Every plot dvc.yaml defines: file -> its properties (stage outputs' and top-level)."""
    found = {}
    for stage in SPEC["stages"].values():
        for entry in stage.get("plots", []) or []:
            (path, props), = entry.items()
            found[path] = props or {}
    for entry in SPEC.get("plots", []) or []:
        (path, props), = entry.items()
        found[path] = props or {}
    return found


def test_every_plot_names_its_y_columns():
    """Without y, DVC draws the CSV's last column only (issue 30: one method of seven)."""
    for path, props in plot_entries().items():
        assert props.get("x") and props.get("y"), path


def test_wide_plots_list_every_method_the_default_profile_runs():
    """The method columns of a wide curve table are those of the methods params.yaml runs, plus the
    majority-class baseline (curves() pivots history.csv by method)."""
    from pflkit.experiments.curves import METHODS
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    wide = {s.name: p for s in stages.compute_stages() for p in s.plots if p.wide}
    assert set(wide) == {"perm_fig1", "perm_hetero"}
    for name, plot in wide.items():
        expected = {METHODS[m].name for m in params[name]["methods"]} | {"Majority class"}
        assert set(plot.y) == expected, name
        recorded = ROOT / "results" / name / plot.file  # the pipeline's run, where this checkout has it
        if recorded.is_file():
            assert set(recorded.read_text().splitlines()[0].split(",")[1:]) == expected


def _fixture_project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    proj.mkdir()
    subprocess.run([DVC, "init", "--no-scm", "-q"], cwd=proj, check=True)
    shutil.copy(ROOT / "dvc.yaml", proj / "dvc.yaml")
    shutil.copy(ROOT / ".dvc/config", proj / ".dvc/config")
    shutil.copytree(ROOT / ".dvc/plots", proj / ".dvc/plots", dirs_exist_ok=True)
    shutil.copytree(ROOT / "plots", proj / "plots")
    for path, props in plot_entries().items():
        ys = props["y"] if isinstance(props["y"], list) else [props["y"]]
        labelled = props.get("template") == "lines_by_label"
        rows = []
        for series in ("a", "b") if labelled else ("",):
            for i in range(4):
                row = {props["x"]: i, **{y: round(0.1 * i + 0.05 * k + (0.3 if series == "b" else 0), 3)
                                         for k, y in enumerate(ys)}}
                rows.append({**row, "label": series, "panel": "p"} if labelled else row)
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


def _page_check(page: Path) -> str:
    checked = page.with_name("check.html")  # beside the page: its relative script paths resolve the same
    checked.write_text(page.read_text().replace("<head>", "<head>\n" + CHECK, 1))
    proc = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
                           "--host-resolver-rules=MAP * ~NOTFOUND",  # offline: no host resolves
                           "--virtual-time-budget=20000", "--dump-dom", checked.as_uri()],
                          capture_output=True, text=True, timeout=180, check=False)
    found = re.search(r'<p id="page-check">([^<]*)</p>', proc.stdout)
    assert found, f"no #page-check in the dumped DOM (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return found.group(1)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    if DVC is None:
        pytest.skip("dvc not installed")
    return _page(_fixture_project(tmp_path_factory.mktemp("plots")))


def test_page_loads_the_vendored_scripts_by_paths_that_resolve_and_draws_every_method(page):
    html = page.read_text()
    sources = re.findall(r'<script[^>]*\ssrc="([^"]+)"', html)
    assert sources == ["../plots/vendor/vega.min.js", "../plots/vendor/vega-lite.min.js",
                       "../plots/vendor/vega-embed.min.js"]
    assert all((page.parent / s).resolve().is_file() for s in sources)
    assert "cdn.jsdelivr" not in html and not re.search(r'src="https?:', html)
    specs = dict((name, json.loads(s)) for s, name in
                 re.findall(r"var spec = (\{.*?\});\s*vegaEmbed\('#([^']+)'", html, re.S))
    assert len(specs) == len(plot_entries())
    for stage in stages.compute_stages():
        for plot in (p for p in stage.plots if p.wide):  # DVC draws one line per y column (dashed by column)
            spec = specs[re.sub(r"[/.]", "_", f"{stage.results_dir}/{plot.file}")]
            assert spec["encoding"]["strokeDash"]["scale"]["domain"] == list(plot.y)


@pytest.mark.skipif(BROWSER is None and os.environ.get("PFLKIT_REQUIRE_BROWSER") != "1",
                    reason="no chromium on PATH (apt-get install chromium)")
def test_every_plot_draws_offline_in_a_headless_browser(page):
    n = len(plot_entries())
    assert _page_check(page) == f"plots {n}; drawn {n}; errors 0"


@pytest.mark.skipif(BROWSER is None and os.environ.get("PFLKIT_REQUIRE_BROWSER") != "1",
                    reason="no chromium on PATH (apt-get install chromium)")
def test_the_browser_check_fails_without_the_vendored_scripts(page, tmp_path):
    """The check above can fail: with vega-lite missing, no chart draws and the page reports the error."""
    copy = tmp_path / "proj"
    shutil.copytree(page.parents[1], copy)
    (copy / "plots/vendor/vega-lite.min.js").unlink()
    check = _page_check(copy / "dvc_plots/index.html")
    assert re.fullmatch(rf"plots {len(plot_entries())}; drawn 0; errors [1-9]\d*: .*", check), check
