"""The flows tier: Prefect flows, deployments and workers against one throwaway Prefect server."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import TEST_PREFECT_HOME


@pytest.fixture(scope="session", autouse=True)
def prefect_api():
    """One throwaway Prefect server (SQLite in a temporary folder) for the flows tier.

    Stopped at session end, inside pytest, so it can never outlive the suite (an ephemeral server
    stopped from an atexit hook was seen orphaned after a run).
    """
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
    shutil.rmtree(TEST_PREFECT_HOME, ignore_errors=True)
