# The two commands a researcher needs:
#   make reproduce   set up .venv if missing, fetch offline data, run the whole DVC pipeline
#                    (PROFILE=paper: every stage at the papers' settings, under build/paper/: the DVC pipeline
#                    pipelines/paper/dvc.yaml, cached and pushed/pulled per stage like the default's)
#   make test        set up .venv if missing, lint (ruff check), run every notebook (nbval), the
#                    smoke-result regression, unit and integration tests, on both cores (Flower's and the
#                    browser's tests skip unless the extras are installed: `make flower`, Chromium)
#   make test-extras the tests that skip without the extras (after `make flower`; CI runs it after make test)
#   make test-fast   lint and the fast unit tests (the inner loop, under 2 minutes)
#   make test-flower the Flower engines end to end (CI runs it after make test)
#   make canary      every stage of PROFILE (default paper) cut short: fails on divergence, memory above budget or
#                    any error, prints s/round and a whole-profile estimate (build/canary/<profile>/);
#                    CANARY="--short" for the few-minute form CI runs (one round, at most 10 clients per
#                    PERM image federation)
# Torch threads follow OMP_NUM_THREADS (params.yaml `threads: auto`): OMP_NUM_THREADS=2 make test.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.pflkit-installed
FLOWER_STAMP := $(VENV)/.pflkit-flower-installed
export PATH := $(abspath $(VENV))/bin:$(PATH)
export PYTHONDONTWRITEBYTECODE := 1

NBVAL := --nbval-lax --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg

.PHONY: status canary reproduce test test-fast test-extras test-flower lint test-notebooks check-lock setup flower kernel data notebooks bench validate clean

# torch==2.13.0 first: the CPU build this workplace serves locally (a bare `torch` pulls CUDA wheels)
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $@

kernel: $(STAMP)
	@$(PY) -m ipykernel install --sys-prefix --name pflkit --display-name "Python (pflkit)" >/dev/null

setup: $(STAMP) kernel

# the optional extra pflkit[flower] (Flower 1.42 + Ray): the flower_equivalence stage runs its Flower engines
# with it (without it, it runs in-process only and says so); torch stays the CPU build installed above
$(FLOWER_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,flower]'
	@touch $@

flower: setup $(FLOWER_STAMP)

data: setup
	@bash scripts/fetch_offline_data.sh

validate: setup
	$(PY) -m pflkit validate

PROFILE ?= default
reproduce: setup flower data validate
ifeq ($(PROFILE),default)
	dvc repro
else
	$(PY) -m pflkit reproduce --profile $(PROFILE)
endif

# the canary of a profile (pflkit.canary): `make canary` (paper), `make canary PROFILE=smoke CANARY=--short`.
# On every core unless OMP_NUM_THREADS says otherwise (a stage's `threads: auto` is 1 without it): it runs alone,
# the paper profile's large batched ops use a second core (a paper-CNN gradient: 437 ms on 1 thread, 247 ms on
# 2, benchmarks/results/grad_buffers.md), and the estimate it prints is then this machine's, not one core's
CANARY ?=
canary: setup data
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-$$($(PY) -c 'import os; print(os.cpu_count())')} \
	  $(PY) -m pflkit reproduce --profile $(if $(filter default,$(PROFILE)),paper,$(PROFILE)) --canary $(CANARY)

# lint first (ruff, configured in pyproject.toml); then, on both cores at once: the notebooks (nbval executes
# each one with its smoke defaults, writing build/smoke/<stage>/, which tests/regression then compares with
# the expected values within measured tolerances; one process, in order, its report printed at the end) and
# the unit and integration tests over two pytest-xdist workers (tests/conftest.py keeps Flower's in one), but
# the Flower engines' end-to-end tests (real SuperLinks, SuperNodes and Ray: six minutes of their own): `make
# test-flower`, which CI runs after `make test`
FLOWER_ENGINE_TESTS := tests/integration/test_flower.py tests/integration/test_flower_killed_runner.py
test: setup data lint
	@mkdir -p build
	@rm -rf build/smoke/cells
	@$(PY) -m pytest notebooks tests/regression $(NBVAL) > build/test-notebooks.log 2>&1 & nb=$$!; \
	$(PY) -m pytest tests/unit tests/integration -n 2 --dist loadgroup $(addprefix --ignore=,$(FLOWER_ENGINE_TESTS)); \
	rc=$$?; \
	wait $$nb; nbrc=$$?; echo "--- notebooks and the smoke-result regression (build/test-notebooks.log):"; \
	cat build/test-notebooks.log; test $$rc -eq 0 -a $$nbrc -eq 0

# (the notebooks compute every cell: the smoke cell store, build/smoke/cells, is emptied first, so a run with
# another thread count recomputes the grids rather than reading the last run's cells)
# the tests that skip in `make test` without the extras: Flower's and Ray's unit tests (after `make flower`), the
# grid cells on a two-node Ray cluster (tests/integration/test_cells_ray.py) and
# the browser's (Debian's chromium; PFLKIT_REQUIRE_BROWSER=1 makes a missing browser fail instead of skip)
EXTRA_TESTS := $(sort $(wildcard tests/unit/test_flower_*.py)) tests/unit/test_ray_start.py tests/integration/test_cells_ray.py \
	tests/unit/test_claims_page.py tests/unit/test_dvc_plots.py
test-extras: setup
	$(PY) -m pytest $(EXTRA_TESTS) -n 2 --dist loadgroup -q

# the Flower engines end to end (they skip without the extra `make flower`): deployments with TLS and node
# authentication, a dying client, the simulation engine, a killed stage runner leaving no process
test-flower: setup
	$(PY) -m pytest $(FLOWER_ENGINE_TESTS) -q

# the inner loop (under 2 minutes): lint and the unit tests not marked slow, on both cores
test-fast: setup lint
	$(PY) -m pytest tests/unit -n 2 --dist loadgroup -m "not slow" -q

# ruff check (pyflakes, pycodestyle, bugbear; settings in pyproject.toml [tool.ruff]) and the import contracts
# (lint-imports: layers, no import cycles, the package never imports the tests or their reference twins;
# pyproject.toml [tool.importlinter]; with the Flower extra, stock Flower only: importlinter-flower.toml)
lint: setup
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports
	@if $(PY) -c "import flwr" 2>/dev/null; then $(VENV)/bin/lint-imports --config importlinter-flower.toml; \
	  else echo "lint-imports: the stock-Flower contract (importlinter-flower.toml) needs the Flower extra: skipped"; fi

# the notebook regression alone (nbval + smoke results); .ci/run repeats it with 2 threads
test-notebooks: setup data
	@rm -rf build/smoke/cells
	$(PY) -m pytest notebooks tests/regression $(NBVAL)

# rebuild every notebook from its py:percent twin and store its smoke outputs (nbval references)
notebooks: setup
	$(PY) -m pflkit notebooks refresh

# what `dvc repro` would do, a few lines per pipeline (up to date / changed / not run here / never run): plain `dvc
# status` also lists every paper-pipeline output that ran on another machine as a change
status: setup
	@$(PY) scripts/pipeline_status.py

# dvc.lock must record the code and params of the tree (re-run changed stages before committing)
check-lock: setup
	$(PY) scripts/check_dvc_lock.py

bench: setup
	$(PY) benchmarks/speed.py --threads 1,2
	$(PY) benchmarks/overhead.py --threads 1
	$(PY) benchmarks/uneven.py --threads 1
	$(PY) benchmarks/threads.py

clean:
	rm -rf build .pytest_cache
