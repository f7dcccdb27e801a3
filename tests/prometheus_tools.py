"""Prometheus's binaries for the alert tests: Debian's package ``prometheus`` (with ``promtool``), which
``make setup`` installs (scripts/setup.sh). Where one is missing the test fails, except on a GPU host,
whose air-gapped set-up has no apt: there it skips, saying so."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import GPU_MEMORY


def prometheus_tool(name: str) -> str:
    """The path of ``name`` (promtool or prometheus); missing: a skip on a GPU host, else a failure."""
    path = shutil.which(name)
    if path:
        return path
    why = f"{name} is not installed (Debian's package prometheus brings it; `make setup` installs it)"
    if GPU_MEMORY:
        pytest.skip(f"{why}: this GPU host has no apt, so its set-up leaves it out")
    pytest.fail(f"{why}: run `make setup` as root, or apt-get install prometheus")
