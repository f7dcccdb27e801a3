"""The flows tier: Prefect flows, deployments and workers against one throwaway Prefect server."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _prefect_server_for_the_tier(prefect_api):
    yield
