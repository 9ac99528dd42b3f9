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

pytest: $(STAMP)
	mkdir -p build
	$(PY) -m pytest -q -p no:cacheprovider --junitxml=build/pytest.xml $(PYTEST_ARGS)

# make mutants runs its own control (the targeted tests, unmutated) first; make test
# takes the control from the suite run it just made (build/pytest.xml) instead.
mutants: $(STAMP)
	$(PY) tests/mutants.py $(MUTANTS_ARGS)

# the full grids (resume chains, straggler lengths) that CI samples
test-long: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m long

test: lint types pytest
	$(PY) tests/mutants.py --control-junit build/pytest.xml $(MUTANTS_ARGS)

clean:
	rm -rf $(VENV) bench-results .mypy_cache .ruff_cache
