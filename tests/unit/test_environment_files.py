"""environment.yml (conda) and pyproject.toml (pip) must declare the same packages and bounds."""
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _norm(spec: str) -> tuple[str, str]:
    m = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(.*)", spec)
    return m.group(1).lower().replace("_", "-"), m.group(2).replace(" ", "")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    pip_specs = project["dependencies"] + extras["dev"] + extras["flower"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda_pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert dict(map(_norm, pip_specs)) == dict(map(_norm, conda_pip))
    assert dict(map(_norm, pip_specs))["torch"] == ">=2.4"


def test_flower_is_an_extra_not_a_core_dependency():
    """pflkit runs (and `make test` passes) without Flower: flwr is only in the extra `flower`."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = lambda specs: {_norm(s)[0].split("[")[0] for s in specs}  # noqa: E731
    assert "flwr" not in names(project["dependencies"]) | names(project["optional-dependencies"]["dev"])
    assert names(project["optional-dependencies"]["flower"]) == {"flwr"}


def test_ci_runs_the_readme_test_command_first_with_nothing_installed():
    """.ci/run's first command is README's test command as a new user types it (threads pinned): no extra (make
    flower, Chromium) is installed and no variable that changes a test's verdict is set before it."""
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"^make test\b", readme, re.M)
    assert command, "README shows no `make test` command"
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [ln for ln in lines if ln and not ln.startswith("#") and not ln.startswith(("set ", "cd "))]
    assert commands[0] == "OMP_NUM_THREADS=1 make test", commands[:3]
    later = "\n".join(commands[1:])
    for extra in ("make flower", "apt-get install", "PFLKIT_REQUIRE_BROWSER=1", "make test-extras"):
        assert extra in later, extra
