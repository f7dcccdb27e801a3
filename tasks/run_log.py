"""Where a task's log lines go: the Prefect run's logger, or stdout when a test calls ``task.fn(...)``
outside a run (there is no run logger then)."""

from __future__ import annotations

from collections.abc import Callable

from prefect.exceptions import MissingContextError
from prefect.logging import get_run_logger


def run_log() -> Callable[[str], None]:
    try:
        return get_run_logger().info
    except MissingContextError:
        return print
