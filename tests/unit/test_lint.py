"""The repository passes ``ruff check`` (settings in pyproject.toml [tool.ruff]; ``make lint``)."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_check_is_clean():
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]' installs it)")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", ".", "--output-format", "concise", "--no-cache"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"ruff check found problems (fix them, or see make lint):\n{proc.stdout}{proc.stderr}"
