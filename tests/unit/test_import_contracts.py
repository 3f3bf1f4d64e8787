"""The import contracts (pyproject.toml [tool.importlinter], run by `make lint`) hold for pflkit, and each of them
breaks when a copy of pflkit gets the import it forbids (so every contract can fail)."""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
LAYERS = "Layers: data below engine below eval below algorithms"
CYCLES = "No import cycles"
TESTS = "The package never imports the tests"
STOCK = "Stock Flower only"
LIBRARY = "The library (algorithms, engine, data, models, theory, eval, the run loop)"

pytestmark = pytest.mark.skipif(LINT is None, reason="import-linter (the dev extra) is not installed")


#: the stock-Flower contract's own config: it analyses flwr, so it runs only where Flower is installed
FLOWER_CONFIG = "importlinter-flower.toml"
FLOWER = importlib.util.find_spec("flwr") is not None
needs_flower = pytest.mark.skipif(not FLOWER, reason="the stock-Flower contract needs the Flower extra")


def _lint(cwd: Path, env=None, *options: str):
    return subprocess.run([LINT, *options], cwd=cwd, capture_output=True, text=True, env=env, timeout=300)


def test_pflkit_keeps_its_import_contracts():
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Contracts: 4 kept, 0 broken." in out.stdout


@needs_flower
def test_pflkit_keeps_the_stock_flower_contract():
    out = _lint(ROOT, None, "--config", FLOWER_CONFIG)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Contracts: 1 kept, 0 broken." in out.stdout


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    """A copy of pflkit's source and its contracts (pyproject.toml), for one bad import at a time."""
    tmp = tmp_path_factory.mktemp("contracts")
    shutil.copytree(ROOT / "src" / "pflkit", tmp / "src" / "pflkit", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    shutil.copy(ROOT / FLOWER_CONFIG, tmp / FLOWER_CONFIG)
    return tmp


def _verdicts(stdout: str) -> dict[str, str]:
    """{contract name: KEPT or BROKEN} from lint-imports' summary (which wraps long names over lines)."""
    summary = "".join(stdout.split("Analyzed ")[1].split("\nContracts: ")[0].splitlines()[2:])
    return {name.strip(): verdict for name, verdict in re.findall(r"(.+?) (KEPT|BROKEN)(?: \(\d+ ignored imports?\))?",
                                                                  summary)}


def _not_allowed(importer: str, imported: str) -> str:
    return f"pflkit.{importer} is not allowed to import pflkit.{imported}"


# (module given one import more, the import, the contract it breaks, what lint-imports says)
VIOLATIONS = [
    # (the library importing model_store breaks the library contract too: these layer rows import other layers)
    ("eval.py", "from pflkit.algorithms import fedavg", LAYERS, _not_allowed("eval", "algorithms")),
    ("model_store.py", "from pflkit import runner", LAYERS, _not_allowed("model_store", "runner")),
    ("runner.py", "from pflkit.flower import spec", LAYERS, _not_allowed("runner", "flower")),
    ("flower/server.py", "from pflkit.runner import run", LAYERS, _not_allowed("flower", "runner")),
    # (a library package importing a pipeline module breaks the library contract too: this cycle's edge is not one)
    ("seeds.py", "from pflkit.data import draws", CYCLES, "- .seeds -> .data (1 import)"),
    ("report.py", "from pflkit.experiments import perm", CYCLES, "- .report -> .experiments (1 import)"),
    ("flower/spec.py", "from pflkit.flower import loopback", CYCLES, "No cycles are allowed in pflkit.flower.\n"),
    ("seeds.py", "import reference", TESTS, "pflkit is not allowed to import reference"),
    # issue 53: the library knows nothing of the pipeline (its stage table, params.yaml's loader) ...
    ("data/federated.py", "from pflkit import stages", LIBRARY,
     "pflkit.data is not allowed to import pflkit.stages:\n\n-   pflkit.data.federated -> pflkit.stages"),
    ("engine/params.py", "import yaml", LIBRARY,
     "pflkit.engine is not allowed to import yaml:\n\n-   pflkit.engine.params -> yaml"),
    ("algorithms/fedavg.py", "from pflkit.config import StageConfig", LIBRARY,
     "pflkit.algorithms is not allowed to import pflkit.config"),
    ("runner.py", "import papermill", LIBRARY, "pflkit.runner is not allowed to import papermill"),
    # issue 55: Flower's internals and private constants (each was imported before: the patches it removed)
    ("flower/apps.py", "from flwr.common.constant import SUPERLINK_NODE_ID", STOCK,
     "pflkit is not allowed to import flwr.common.constant:\n\n-   pflkit.flower.apps -> flwr.common.constant"),
    ("flower/apps.py", "from flwr.superlink.grid import http_grid", STOCK,
     "pflkit is not allowed to import flwr.superlink:\n\n-   pflkit.flower.apps -> flwr.superlink"),
    ("flower/deployment.py", "from flwr.supernode import start_client_internal", STOCK,
     "pflkit is not allowed to import flwr.supernode:\n\n-   pflkit.flower.deployment -> flwr.supernode"),
    ("flower/simulation.py", "from flwr.supercore.superexec import executor", STOCK,
     "pflkit is not allowed to import flwr.supercore:\n\n-   pflkit.flower.simulation -> flwr.supercore"),
]


@pytest.mark.parametrize("module, line, contract, says", [
    v if v[2] != STOCK else pytest.param(*v, marks=needs_flower) for v in VIOLATIONS],
    ids=[f"{v[0]}: {v[1]}" for v in VIOLATIONS])
def test_each_contract_catches_the_import_it_forbids(copy, module, line, contract, says):
    path = copy / "src" / "pflkit" / module
    before = path.read_text()
    path.write_text(before + f"\n{line}  # noqa\n")
    config = ("--config", FLOWER_CONFIG) if contract == STOCK else ()
    try:  # --no-cache: each run sees the edit
        out = _lint(copy, {**os.environ, "PYTHONPATH": str(copy / "src")}, "--no-cache", *config)
    finally:
        path.write_text(before)
    assert out.returncode == 1, out.stdout + out.stderr
    verdicts = _verdicts(out.stdout)
    assert len(verdicts) == (1 if config else 4) and [k for k, v in verdicts.items() if v == "BROKEN"] == [
        next(k for k in verdicts if k.startswith(contract))], verdicts
    assert says in out.stdout, out.stdout
