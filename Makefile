# One entry for set-up, demo and tests. Every target sets up first (idempotent, fast when done).
SHELL := /bin/bash
PY := .venv/bin/python

.PHONY: setup demo test test-fast bench ui

setup:
	@scripts/setup.sh

demo: setup
	@scripts/demo.sh

test: setup
	@$(PY) -m pytest -v --durations=15

test-fast: setup
	@$(PY) -m pytest -m "not e2e and not flow"

bench: setup
	@for b in quantize capacity gates plan schemes; do $(PY) benchmarks/$$b.py || exit 1; done

ui:
	@scripts/ui.sh
