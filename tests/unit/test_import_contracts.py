"""The import contracts (pyproject.toml [tool.importlinter], run by `make lint`) hold for pflkit, and the same
kind of contract breaks on a package that imports across its layers the wrong way (so the check can fail)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = shutil.which("lint-imports", path=str(Path(sys.executable).parent))

pytestmark = pytest.mark.skipif(LINT is None, reason="import-linter (the dev extra) is not installed")


def _lint(cwd: Path, env=None):
    return subprocess.run([LINT], cwd=cwd, capture_output=True, text=True, env=env, timeout=300)


def test_pflkit_keeps_its_import_contracts():
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Contracts: 2 kept, 0 broken." in out.stdout


def test_a_lower_layer_importing_a_higher_one_breaks_the_contract(tmp_path):
    pkg = tmp_path / "src" / "toy"
    for name, body in {"__init__": "", "data": "from toy import algorithms\n", "algorithms": "from toy import data\n",
                       "flower": "from toy import algorithms\n"}.items():
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / f"{name}.py").write_text(body)
    (tmp_path / ".importlinter").write_text("[importlinter]\nroot_package = toy\n\n[importlinter:contract:1]\n"
                                            "name = layers\ntype = layers\nlayers =\n    toy.flower\n"
                                            "    toy.algorithms\n    toy.data\n")
    out = _lint(tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path / "src")})
    assert out.returncode == 1
    assert "toy.data is not allowed to import toy.algorithms" in out.stdout
