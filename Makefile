# One entry for set-up, demo and tests. Every target sets up first (idempotent, fast when done).
# Set-up picks the device itself (an NVIDIA GPU -> cuda, else cpu); variables, given to make or in the
# environment (scripts/setup.sh says more):
#   QS_DEVICE=cpu|cuda      override the device
#   QS_WHEELHOUSE=DIR       install from DIR alone, no package index (scripts/gpu/prepare_wheels.sh makes it)
#   QS_SETUP_DRY_RUN=1      print what set-up would install and from where, change nothing
#   PORT=4213               the port of `make ui` (default 4200)
SHELL := /bin/bash
PY := .venv/bin/python

.PHONY: setup demo test test-fast bench ui

setup:
	@scripts/setup.sh

demo: setup
	@scripts/demo.sh

# Lint first (ruff, pinned in requirements/pipeline.txt; rules in pyproject.toml): a finding fails the target.
test: setup
	@$(PY) -m ruff check . && $(PY) -m ruff format --check .
	@$(PY) -m pytest -v -n auto --durations=15 --durations-json=.cache/test_durations.json

test-fast: setup
	@$(PY) -m ruff check . && $(PY) -m ruff format --check .
	@$(PY) -m pytest tests/unit

bench: setup
	@for b in quantize capacity gates plan schemes; do $(PY) benchmarks/$$b.py || exit 1; done

ui:
	@scripts/ui.sh
