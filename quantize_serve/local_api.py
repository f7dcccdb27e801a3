"""The Prefect API of a local run (``quantize-serve run`` and ``rollback``), and the settings of every
Prefect server the product starts (that one, scripts/local_stack.py's for the demo, scripts/ui.sh's).

A local run uses Prefect's ephemeral API: a uvicorn child process with its SQLite database under
PREFECT_HOME. Its first start on a machine creates every table (Prefect's migrations): 22 s on a quiet
2-core host and over 60 s on a busy one, against Prefect's default start timeout of 20 s; a start that
timed out raised while its server went on migrating. So the run starts the API once, in the CLI's main
thread before the flow, allows it at least FIRST_START_S, and on a failure stops that server and says
on one screen what to do.

``python -m quantize_serve.local_api`` prints SERVER_ENV as ``KEY=VALUE`` lines (scripts/ui.sh).
"""

from __future__ import annotations

import os
from collections.abc import Callable, MutableMapping
from pathlib import Path

from quantize_serve.core.errors import QuantizeServeError

# Every Prefect server the product starts. The product runs offline: Prefect's telemetry service would
# log "Failed to send telemetry" as an ERROR on the run's screen at start and every 10 minutes.
SERVER_ENV = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
# The least time a Prefect server gets to answer (the ephemeral one: its start timeout, or
# PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS where larger): a first start migrates the database.
FIRST_START_S = 300


class LocalApiError(QuantizeServeError, RuntimeError):
    """Prefect's ephemeral API did not start; says where its database is and what to do."""


def offline_server_env(environ: MutableMapping[str, str] | None = None) -> MutableMapping[str, str]:
    """``environ`` (default: this process's, which Prefect hands to the servers it starts) with
    SERVER_ENV where it sets none of its own."""
    environ = os.environ if environ is None else environ
    for key, value in SERVER_ENV.items():
        environ.setdefault(key, value)
    return environ


def start_local_api(say: Callable[[str], None] = print) -> str | None:
    """Start Prefect's ephemeral API, if the run is to use it (no PREFECT_API_URL), once and before any
    flow or Prefect thread asks for it; its URL, or None for the user's own server. A first start (no
    database yet) is announced through ``say``. Raises LocalApiError, the server stopped."""
    offline_server_env()
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if settings.api.url:
        return None
    database = sqlite_file(settings.server.database.connection_url.get_secret_value())
    if database is not None and not database.exists():
        say(f"  Prefect's first start here: it creates its database, {_shown(database)} (about a minute)")
    timeout = max(FIRST_START_S, settings.server.ephemeral.startup_timeout_seconds)
    server = SubprocessASGIServer()
    try:
        server.start(timeout=timeout)
    except Exception as exc:
        exited = server.server_process.poll() if server.server_process else None
        server.stop()  # a server left starting would race the next one for the same database
        raise LocalApiError(
            failure_message(exc, timeout, exited, database=database, home=Path(settings.home))
        ) from exc
    return server.api_url


def failure_message(
    exc: BaseException, timeout_s: int, exited: int | None, *, database: Path | None, home: Path
) -> str:
    """The one screen for a local API that did not start (no database URL: it may hold a password)."""
    state = "still starting" if exited is None else f"exited with code {exited}"
    where = _shown(database) if database else "PREFECT_API_DATABASE_CONNECTION_URL's"
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return (
        f"Prefect's local API did not answer within {timeout_s} s (its server {state}; Prefect: {first})\n"
        f"  its database: {where} (PREFECT_HOME={_shown(home)})\n"
        "  fix: create the database once, `prefect server database upgrade -y` (a first start creates "
        "every table, the slow part on a small or busy machine), then run again; or allow longer, "
        f"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS={2 * timeout_s}; or use a running Prefect "
        "server, PREFECT_API_URL=http://HOST:4200/api"
    )


def sqlite_file(connection_url: str) -> Path | None:
    """The database file of a SQLite connection URL (``sqlite+aiosqlite:///PATH``); None for another."""
    scheme, _, rest = connection_url.partition(":///")
    return Path(rest) if scheme.startswith("sqlite") and rest and rest != ":memory:" else None


def _shown(path: Path) -> str:
    """``path`` with the home folder as ``~``."""
    home = Path.home()
    return f"~/{path.relative_to(home).as_posix()}" if path.is_relative_to(home) else str(path)


if __name__ == "__main__":
    print("\n".join(f"{key}={value}" for key, value in SERVER_ENV.items()))
