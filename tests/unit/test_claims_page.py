"""The claims page (reports/index.html) in a real headless browser: it loads, every image resolves, no
script error. The page reports what it saw into #page-check when it has loaded; Chromium's --dump-dom
prints the DOM after that.

Needs Chromium (Debian package `chromium`; .ci/run installs it). Without it the tests skip, unless
PFLKIT_REQUIRE_BROWSER=1 (CI sets it), where a missing browser fails.
"""
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
if BROWSER is None:
    if os.environ.get("PFLKIT_REQUIRE_BROWSER") == "1":
        raise RuntimeError("PFLKIT_REQUIRE_BROWSER=1 but no chromium on PATH: apt-get install chromium")
    pytest.skip("no chromium on PATH (apt-get install chromium)", allow_module_level=True)

_spec = importlib.util.spec_from_file_location("ledger_tests", ROOT / "tests/unit/test_claims_ledger.py")
ledger_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ledger_tests)


def page_check(page: Path) -> str:
    """What the page's own check wrote into #page-check after loading in headless Chromium."""
    proc = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
                           "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=120, check=False)
    found = re.search(r'<p id="page-check">([^<]*)</p>', proc.stdout)
    assert found, f"no #page-check in the dumped DOM (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return found.group(1)


def test_the_page_loads_with_every_image(tmp_path):
    root = ledger_tests._project(tmp_path)
    ledger_tests.claims.main(["--claims", str(root / "claims.yaml")], root=root)
    assert page_check(root / "reports/index.html") == "images 4; problems 0"


def test_a_missing_figure_is_reported(tmp_path):
    """The check above can fail: remove one figure and the page names it."""
    root = ledger_tests._project(tmp_path)
    (root / "figures/perm/fig4_emnist.png").unlink()
    ledger_tests.claims.main(["--claims", str(root / "claims.yaml")], root=root)
    assert re.fullmatch(r"images 4; problems 1: image not loaded: file://.*/figures/perm/fig4_emnist\.png",
                        page_check(root / "reports/index.html"))
