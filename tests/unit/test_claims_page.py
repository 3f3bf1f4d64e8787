"""The claims page (as refreshed by hand: build/claims/index.html, with the smoke column asked for; the DVC
stage's reports/index.html is the same page with links from reports/) in a real headless browser, after a
partial run (the ledger tests' ``_project``: some stages ran, some did not, one profile ran a single stage,
one profile none): it loads,
every image resolves, no script error, every link is relative and leads to a file that exists, a stage
that did not run reads "not run" with its command and has no image. The page reports what it saw into
#page-check when it has loaded; Chromium's --dump-dom prints the DOM after that.

Needs Chromium (Debian package `chromium`; .ci/run installs it). Without it the tests skip, unless
PFLKIT_REQUIRE_BROWSER=1 (CI sets it), where a missing browser fails.
"""
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from repo_files import load

BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
if BROWSER is None:
    if os.environ.get("PFLKIT_REQUIRE_BROWSER") == "1":
        raise RuntimeError("PFLKIT_REQUIRE_BROWSER=1 but no chromium on PATH: apt-get install chromium")
    pytest.skip("no chromium on PATH (apt-get install chromium)", allow_module_level=True)

ledger_tests = load("tests/unit/test_claims_ledger.py", "ledger_tests")


def dump_dom(page: Path) -> str:
    """The page's DOM after loading in headless Chromium (its own check has run by then)."""
    proc = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
                           "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=120, check=False)
    assert '<p id="page-check">' in proc.stdout, f"no #page-check in the dumped DOM (exit {proc.returncode}): " \
                                                 f"{proc.stderr[-2000:]}"
    return proc.stdout


def page_check(dom: str) -> str:
    """What the page's own check wrote into #page-check."""
    return re.search(r'<p id="page-check">([^<]*)</p>', dom).group(1)


class Links(HTMLParser):
    """Every href and src of a page, each image with the href of the link around it, and each row's text,
    images and links by its data-stage."""

    def __init__(self):
        super().__init__()
        self.urls, self.images, self.notebooks, self.headers = [], [], [], []
        self.rows: dict[str, dict] = {}
        self._href, self._row, self._th = None, None, False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.urls += [a[k] for k in ("href", "src") if k in a]
        if tag == "tr" and "data-stage" in a:
            self._row = self.rows.setdefault(a["data-stage"], {"text": "", "images": []})
        if tag == "a":
            self._href = a.get("href")
            if a.get("class") == "notebook":
                self.notebooks.append(a["href"])
        if tag == "img":
            self.images.append((a["src"], self._href))
            if self._row is not None:
                self._row["images"].append(a["src"])
        self._th = tag == "th"

    def handle_endtag(self, tag):
        if tag == "a":
            self._href = None
        if tag == "table":
            self._row = None

    def handle_data(self, data):
        if self._row is not None:
            self._row["text"] += data + " "
        if self._th:
            self.headers.append(data)


def _page(tmp_path) -> tuple[Path, Links]:
    root = ledger_tests._project(tmp_path)
    ledger_tests.claims.main(["--claims", str(root / "claims.yaml"), "--profiles", "default,smoke"], root=root)
    page = root / "build/claims/index.html"
    links = Links()
    links.feed(page.read_text())
    return page, links


def test_the_page_after_a_partial_run_loads_with_every_image_and_no_absolute_path(tmp_path):
    page, _ = _page(tmp_path)
    dom = dump_dom(page)
    assert page_check(dom) == "images 3; problems 0"  # fig1 (default, smoke) and fig5: the figures that exist
    for text in (dom, page.read_text()):
        assert "file://" not in text and str(tmp_path) not in text and "/tmp/" not in text


def test_every_link_is_relative_and_leads_to_a_file(tmp_path):
    page, links = _page(tmp_path)
    assert len(links.urls) == 15  # 3 images, their 3 links and 3 SVGs, 6 notebook pages
    for url in links.urls:
        parts = urlsplit(url)
        assert not parts.scheme and not parts.netloc and not url.startswith("/"), url
        assert (page.parent / unquote(parts.path)).resolve().is_file(), url


def test_thumbnails_open_the_full_figure(tmp_path):
    _, links = _page(tmp_path)
    assert links.images == [("../../figures/perm/fig1_synthetic.png",) * 2,
                            ("../smoke/figures/perm/fig1_synthetic.png",) * 2,
                            ("../../figures/perm/fig5_alpha_heatmap.png",) * 2]
    assert "../../figures/perm/fig1_synthetic.svg" in links.urls
    assert 'width="420"' in (tmp_path / "build/claims/index.html").read_text()


def test_notebook_links_open_html_renderings_that_exist(tmp_path):
    page, links = _page(tmp_path)
    assert links.notebooks == ["html/default/perm/fig1_synthetic.html", "html/default/perm/fig1_synthetic_plot.html",
                               "html/smoke/perm/fig1_synthetic.html", "html/default/perm/fig4_emnist.html",
                               "html/default/perm/fig5_alpha_heatmap.html",
                               "html/default/perm/fig5_alpha_heatmap_plot.html"]
    assert not [u for u in links.urls if u.endswith(".ipynb")]  # never the raw notebook JSON
    rendered = page.parent / "html/default/perm/fig4_emnist.html"
    assert "executed reports/perm/fig4_emnist" in rendered.read_text()
    inner = Links()
    inner.feed(rendered.read_text())
    assert inner.urls == ["../notebook.css"] and (rendered.parent / inner.urls[0]).is_file()


def test_a_stage_not_run_reads_not_run_with_its_command_and_no_image(tmp_path):
    _, links = _page(tmp_path)
    assert [h for h in links.headers if h.endswith("profile")] == ["default profile", "smoke profile"]  # not paper
    fig6, fig4 = links.rows["perm_fig6"], links.rows["perm_fig4"]
    assert fig6["images"] == [] and fig4["images"] == []
    assert " ".join(fig6["text"].split()).count("not run run dvc repro perm_fig6_plot") == 1
    assert ("not run run python -m pflkit reproduce --profile smoke --stages perm_fig6,perm_fig6_plot"
            in " ".join(fig6["text"].split()))
    # perm_fig4 ran, its plot stage did not: its verdict, and the figure's command instead of an image
    assert "figure fig4_emnist not drawn: run dvc repro perm_fig4_plot" in " ".join(fig4["text"].split())
    assert "does not hold" in fig4["text"]


def test_the_page_works_moved(tmp_path):
    """Every link relative: the project moved elsewhere shows the same page, every image loading."""
    (tmp_path / "a").mkdir()
    page, _ = _page(tmp_path / "a")
    shutil.move(tmp_path / "a", tmp_path / "b")
    assert page_check(dump_dom(tmp_path / "b/build/claims/index.html")) == "images 3; problems 0"


def test_a_missing_figure_is_reported(tmp_path):
    """The check above can fail: a figure removed after the page was written is named, as the page links it."""
    page, _ = _page(tmp_path)
    (tmp_path / "figures/perm/fig5_alpha_heatmap.png").unlink()
    assert page_check(dump_dom(page)) == ("images 3; problems 1: image not loaded: "
                                          "../../figures/perm/fig5_alpha_heatmap.png")
