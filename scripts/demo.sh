#!/usr/bin/env bash
# The offline demo (after `make setup`): see scripts/demo.py.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m scripts.demo
