# Two entry points (the README's quick start):
#   make bench   set up a venv and run the main benchmark on data it generates itself
#   make test    set up a venv and run lint, types, the test suite and the planted-bug
#                checks (make mutants: every planted bug must make a test fail)
#
# torch is pinned to the CPU wheel found locally by pip (2.13.0+cpu); a bare `torch`
# requirement on a fresh machine can pull a multi-GB CUDA build. Override with
# `make TORCH_SPEC='torch==X'` on a GPU machine (a plain 'torch==2.13.0' is the CUDA build).
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0+cpu
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BENCH ?= latency --quick

.PHONY: setup bench test test-long lint types pytest mutants clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)" -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

bench: $(STAMP)
	$(PY) -m streambuf bench $(BENCH) --out bench-results

lint: $(STAMP)
	$(VENV)/bin/ruff check streambuf tests examples benchmarks
	$(VENV)/bin/ruff format --check streambuf tests examples benchmarks

types: $(STAMP)
	$(VENV)/bin/mypy

# Two parts: the tests that can share the machine, PYTEST_JOBS at a time (pytest-xdist;
# never more than the cores: they start worker processes of their own), then the
# `serial` ones alone (they read machine-wide memory or /dev/shm, or bound a real run's
# timing or the thread counts it tunes, which a neighbour's load would move). Exit 5 (no
# test selected: PYTEST_ARGS named tests of one part only) is not a failure.
PYTEST_JOBS ?= $(shell $(PYTHON) -c "import os; print(max(1, min(2, len(os.sched_getaffinity(0)))))")
JUNIT := build/pytest.xml build/pytest-serial.xml

pytest: $(STAMP)
	mkdir -p build
	$(PY) -m pytest -q -p no:cacheprovider -n $(PYTEST_JOBS) -m "not long and not serial" --junitxml=build/pytest.xml $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(PY) -m pytest -q -p no:cacheprovider -m "serial and not long" --junitxml=build/pytest-serial.xml $(PYTEST_ARGS) || [ $$? -eq 5 ]

# make mutants runs its own control (the targeted tests, unmutated) first; make test
# takes the control from the suite run it just made ($(JUNIT)) instead.
mutants: $(STAMP)
	$(PY) tests/mutants.py $(MUTANTS_ARGS)

# the full grids (resume chains, straggler lengths) that CI samples
test-long: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m long

test: lint types pytest
	$(PY) tests/mutants.py --control-junit $(JUNIT) $(MUTANTS_ARGS)

clean:
	rm -rf $(VENV) bench-results .mypy_cache .ruff_cache
