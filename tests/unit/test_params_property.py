"""Property test of params.yaml (issue 29): whatever one mutation of a stage's values is -- a wrong type,
a number out of range, a huge or tiny number, a key deleted or added, a value wrapped in a list or a
mapping -- either the stage's validation rejects it with a message naming ``<stage>.<key>`` (or
``defaults.<key>``) in a few short lines, or the stage's smoke run completes. Never a raw traceback.

How: hypothesis (derandomized, so every machine draws the same examples) picks one of the stages whose
smoke run takes under ~3 s, one key path of its smoke values and one mutation; the mutated values become
that stage's params.yaml section (its smoke overlay removed) in a temporary params file. A rejected
config must name a key; an accepted one runs the stage's notebook code (its py:percent twin, in this
process, results under tmp) to the end. A run still going after ``RUN_BUDGET_S`` is stopped and counts
as running (a long but valid run is not a failure), and the run's address space is capped (RLIMIT_AS)
so that an allocation the validator should have refused fails as MemoryError here instead of taking
the machine's memory: the validator's memory estimate must refuse such values first. Validation is told
the machine has 2 GiB free and 2 cores (``machine``), so the verdicts are the same on every machine.
"""
from __future__ import annotations

import contextlib
import copy
import math
import os
import re
import resource
import shutil
import signal
import traceback
from pathlib import Path

import jupytext
import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pflkit import stages
from pflkit.data.vision import DatasetUnavailableError
from pflkit.runner import DivergenceError
from pflkit.config import PARAMS_ENV, RUNNER_KEYS, ConfigError, load_params, stage_values, validate_stage

ROOT = Path(__file__).resolve().parents[2]
PARAMS = load_params(ROOT / "params.yaml")
PROFILE = "smoke"
#: the stages whose smoke run is short enough to run many times (measured in-process: < 3 s each);
#: the others differ from these in scale, not in the validation rules they share
STAGES = ["perm_fig1", "perm_fig6", "perm_fig4", "perm_hetero", "perm_alpha_convergence", "charles_fig1",
          "charles_fig3", "charles_fig5", "charles_fig9", "charles_theory", "chayti_fig1", "chayti_fig2",
          "chayti_fig3", "chayti_fig5"]
#: seconds a mutated smoke run may take before it is stopped and counted as running
RUN_BUDGET_S = 4.0
#: address space a mutated run may add to this process before allocations fail (bytes)
RUN_MEMORY = 3 << 30
#: the machine validation is told it runs on, the same everywhere (the verdicts must not depend on the
#: machine): less free memory than RUN_MEMORY, so whatever the estimate lets through fits under the cap
MACHINE_MEMORY, MACHINE_CORES = 2 << 30, 2


@contextlib.contextmanager
def machine(memory: int, cores: int):
    from unittest import mock

    import pflkit.config as config
    with mock.patch.object(config, "available_memory", lambda: memory), \
            mock.patch.object(config, "cpu_cores", lambda: cores):
        yield
COMMON = ("device", "threads")  # keys every stage takes from ``defaults``


def smoke_values(stage: str) -> dict:
    values = stage_values(PARAMS, stage, PROFILE)
    return {k: v for k, v in values.items() if k not in RUNNER_KEYS and k not in COMMON}


def leaf_paths(value, prefix=()) -> list[tuple]:
    """Every key path into ``value`` (mappings by key, lists by index), inner nodes included."""
    paths = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            paths += leaf_paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            paths += leaf_paths(v, prefix + (i,))
    return paths


HUGE_INTS = [2**31, 2**63, 2**64 + 1, 2**70, 10**12]
SPECIAL_FLOATS = [1e300, -1e300, 1e-300, 5e-324, 1e20, -1.0, 0.0, 1e-12]
scalars = st.one_of(
    st.sampled_from(HUGE_INTS), st.integers(-3, 3), st.sampled_from(SPECIAL_FLOATS),
    st.floats(-1e6, 1e6, allow_nan=False), st.booleans(), st.none(),
    st.sampled_from(["", "x", "auto", "cpu", "gd", "1e3", "x" * 5000]),
)
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.sampled_from(["a", "name", "lr"]),
                                                                            scalars, max_size=2))


@st.composite
def mutations(draw):
    stage = draw(st.sampled_from(STAGES))
    base = smoke_values(stage)
    kind = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add", "wrap", "defaults"]))
    new = copy.deepcopy(base)
    paths = leaf_paths(base)
    path = draw(st.sampled_from(paths))
    *parents, last = path
    node = new
    for p in parents:
        node = node[p]
    defaults = copy.deepcopy(PARAMS["defaults"])
    if kind == "replace":
        node[last] = draw(values)
    elif kind == "delete":
        if isinstance(node, dict):
            del node[last]
        else:
            node.pop(last)
    elif kind == "add":
        (node if isinstance(node, dict) else new)["unknown_" + draw(st.sampled_from(["key", "lr", "x" * 300]))] = 1
    elif kind == "wrap":
        node[last] = draw(st.sampled_from([[node[last]], {"value": node[last]}, [node[last], node[last]]]))
    else:
        defaults[draw(st.sampled_from(COMMON))] = draw(st.one_of(
            scalars, st.sampled_from([10**5, 4096, 64, "cuda:7", "gpu"])))
    params = copy.deepcopy(PARAMS)
    params[stage] = new
    params["defaults"] = defaults
    params["profiles"][PROFILE].pop(stage, None)
    params["profiles"][PROFILE].pop("defaults", None)
    shown = defaults if kind == "defaults" else (node.get(last, "<deleted>") if isinstance(node, dict) and kind != "add"
                                                 else node)
    return Case(stage, kind, path, params, repr(shown)[:200])


class Case:
    def __init__(self, stage, kind, path, params, shown):
        self.stage, self.kind, self.path, self.params, self.shown = stage, kind, path, params, shown

    def __repr__(self):  # what hypothesis prints for a failing example: the mutation, not the whole file
        return f"Case({self.stage}, {self.kind}, {'.'.join(map(str, self.path))} -> {self.shown})"


class _Budget(BaseException):
    """Raised in the run when its time budget is spent (a BaseException: no ``except Exception`` eats it)."""


@contextlib.contextmanager
def _limits():
    def stop(*_):
        raise _Budget()
    old_handler = signal.signal(signal.SIGALRM, stop)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    used = _address_space()
    resource.setrlimit(resource.RLIMIT_AS, (min(hard, used + RUN_MEMORY) if hard != resource.RLIM_INFINITY
                                            else used + RUN_MEMORY, hard))
    signal.setitimer(signal.ITIMER_REAL, RUN_BUDGET_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


_CODE: dict[str, str] = {}


def stage_code(stage: str) -> str:
    if stage not in _CODE:
        nb = jupytext.read(ROOT / stages.get(stage).notebook)
        _CODE[stage] = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    return _CODE[stage]


def run_smoke(stage: str, params_file: Path, out: str) -> None:
    code = stage_code(stage).replace("results_dir = None", f"results_dir = {out!r}")
    old = os.environ.get(PARAMS_ENV)
    os.environ[PARAMS_ENV] = str(params_file)
    threads = torch.get_num_threads()
    try:
        with _limits():
            exec(compile(code, stage, "exec"), {"__name__": "__pflkit_smoke__"})
    except _Budget:
        pass  # still running: a long valid run
    finally:
        torch.set_num_threads(threads)
        if old is None:
            os.environ.pop(PARAMS_ENV, None)
        else:
            os.environ[PARAMS_ENV] = old


@pytest.mark.slow  # 25 s: in make test, not in make test-fast
@pytest.mark.filterwarnings("ignore")
@settings(max_examples=int(os.environ.get("PFLKIT_PROPERTY_EXAMPLES", "400")), deadline=None, derandomize=True,
          database=None, suppress_health_check=list(HealthCheck), print_blob=True)
@given(case=mutations())
def test_a_mutated_params_file_is_rejected_naming_a_key_or_runs(case, tmp_path_factory):
    stage, kind, path, params = case.stage, case.kind, case.path, case.params
    try:
        with machine(MACHINE_MEMORY, MACHINE_CORES):
            validate_stage(params, stage, PROFILE)
    except ConfigError as exc:
        text = str(exc)
        lines = text.splitlines()
        assert all(re.match(rf"({re.escape(stage)}|defaults)[.:]", line) for line in lines), text[:500]
        assert len(lines) <= 10 and max(map(len, lines)) <= 600, text[:2000]
        return
    tmp = tmp_path_factory.mktemp("mutated")
    # the run's outputs: a folder of its own inside the project (path settings such as perm_fig4.alpha_file
    # must lie inside the stage's output folders, which lie inside the project), removed afterwards
    results = f"build/property/{tmp.name}/{stage}"
    section = params[stage]
    if isinstance(section.get("alpha_file"), str):
        section["alpha_file"] = section["alpha_file"].replace(f"build/{PROFILE}/{stage}", results, 1)
    params_file = tmp / "params.yaml"
    params_file.write_text(yaml.safe_dump(params, sort_keys=False, width=math.inf))
    try:
        with machine(MACHINE_MEMORY, MACHINE_CORES):  # the run validates again (from_namespace)
            run_smoke(stage, params_file, results)
    except (DivergenceError, DatasetUnavailableError):
        pass  # a verdict, not a crash: it names method, round, seed and lr (test_divergence.py), or the dataset,
        # what was tried and the remedy (availability is the machine's, not the config's: test_vision.py)
    except MemoryError:
        pytest.fail(f"{stage} {kind} {path}: accepted by validation, then ran out of memory (the validator's "
                    f"memory estimate should refuse it)")
    except Exception:  # noqa: BLE001 -- any other error after validation is the failure this test looks for
        pytest.fail(f"{stage} {kind} {path}: accepted by validation, then failed:\n{traceback.format_exc()[-3000:]}")
    finally:
        shutil.rmtree(ROOT / "build" / "property", ignore_errors=True)  # with the checkpoints a curve stage keeps
