"""The Prefect API of `quantize-serve run` (quantize_serve/local_api.py): started once before the flow, with
Prefect's telemetry off; a start that fails is one screen and leaves no server behind
(tests/flows/test_cli.py: the first run on a machine that never ran Prefect)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml

from quantize_serve import local_api
from quantize_serve.cli import main
from quantize_serve.recipe.load import apply_overrides
from tests.conftest import ROOT, SERVING_OVERRIDES
from tests.unit.malformed_recipes import recipe_data


def runnable_recipe(folder: Path) -> Path:
    """The shipped recipe as this host serves it (tests/conftest.py), paths re-pointed from ``folder``."""
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(apply_overrides(recipe_data(folder), SERVING_OVERRIDES, source="test")))
    return path


def test_the_run_starts_prefects_api_with_telemetry_off_and_a_failed_start_is_one_screen(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """`quantize-serve run` with no PREFECT_API_URL starts Prefect's server itself, before the flow. Here
    that server can never answer (its SQLite file would sit under a regular file): the run ends at once,
    exit 1, with one screen naming the database and the fix, and the server it started is stopped. The
    environment Prefect handed that server, read by Prefect's own settings as the server reads them, has
    telemetry off although the caller's environment said nothing about it."""
    from prefect.server.api import server as prefect_server
    from prefect.settings import (
        PREFECT_API_DATABASE_CONNECTION_URL,
        PREFECT_API_URL,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        Settings,
        temporary_settings,
    )

    recipe = runnable_recipe(tmp_path)
    (tmp_path / "a-file").write_text("")
    database = tmp_path / "a-file" / "prefect.db"
    monkeypatch.delenv("PREFECT_SERVER_ANALYTICS_ENABLED", raising=False)  # tests/conftest.py sets it
    monkeypatch.setattr(local_api, "FIRST_START_S", 2)
    started: list[tuple[subprocess.Popen, dict[str, str]]] = []
    popen = subprocess.Popen

    def recorded(*args, **kwargs):
        proc = popen(*args, **kwargs)
        if "uvicorn" in (kwargs.get("args") or ()):  # Prefect's server, as server.py starts it
            started.append((proc, dict(kwargs["env"])))
        return proc

    monkeypatch.setattr(prefect_server.subprocess, "Popen", recorded)
    # a fresh process's servers: none started yet (a test before this one in the same worker may have one)
    servers: dict = {}
    monkeypatch.setattr(prefect_server.SubprocessASGIServer, "_instances", servers)
    with temporary_settings(
        {
            PREFECT_API_URL: None,  # the ephemeral API, whatever ran before in this process
            PREFECT_API_DATABASE_CONNECTION_URL: f"sqlite+aiosqlite:///{database}",
            PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 1,
        }
    ):
        rc = main(["run", str(recipe)])
    monkeypatch.undo()  # Popen back before anything else runs
    out = capsys.readouterr()
    text = out.out + out.err
    assert rc == 1, text
    assert "Prefect's local API did not answer within 2 s" in out.err, text
    assert str(database) in out.err and "prefect server database upgrade -y" in out.err, text
    assert "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=4" in out.err, text
    assert "Traceback" not in text and len(out.err.splitlines()) <= 6, text
    assert started, "no Prefect server was started"
    assert all(proc.poll() is not None for proc, _ in started), "a Prefect server was left running"
    assert None not in servers  # a later start begins afresh
    for _, env in started:
        with mock.patch.dict(os.environ, env, clear=True):
            assert Settings().server.analytics_enabled is False


def test_a_users_own_server_is_used_as_it_is(monkeypatch) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        assert local_api.start_local_api(say=pytest.fail) is None


def test_every_prefect_server_the_product_starts_takes_its_settings_from_one_place() -> None:
    """scripts/local_stack.py (`make demo`) and scripts/ui.sh (`make ui`) set the servers' settings from
    local_api.SERVER_ENV, which turns telemetry off."""
    assert local_api.SERVER_ENV["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    printed = subprocess.run(
        [sys.executable, "-m", "quantize_serve.local_api"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert printed.stdout.split() == [f"{k}={v}" for k, v in local_api.SERVER_ENV.items()], printed.stderr
    for script in ("scripts/local_stack.py", "scripts/ui.sh"):
        text = (ROOT / script).read_text()
        assert "PREFECT_SERVER_ANALYTICS_ENABLED" not in text and "local_api" in text, script


def test_a_users_environment_keeps_its_own_value() -> None:
    assert local_api.offline_server_env({"PREFECT_SERVER_ANALYTICS_ENABLED": "true"}) == {
        "PREFECT_SERVER_ANALYTICS_ENABLED": "true"
    }
    assert local_api.offline_server_env({}) == local_api.SERVER_ENV


def test_the_database_file_is_named_for_sqlite_only() -> None:
    assert local_api.sqlite_file("sqlite+aiosqlite:///home/u/.prefect/prefect.db") == Path(
        "home/u/.prefect/prefect.db"
    )
    assert local_api.sqlite_file("sqlite+aiosqlite:////srv/prefect.db") == Path("/srv/prefect.db")
    assert local_api.sqlite_file("postgresql+asyncpg://user:secret@db:5432/prefect") is None
