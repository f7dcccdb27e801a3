"""Prefect task for the stress gate (thin wrapper; never retried or cached: it measures a live server)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from quantize_serve.gates import stress
from quantize_serve.recipe.gates import StressGate
from quantize_serve.recipe.model import ServeSection
from quantize_serve.serving.server import RunningServer
from tasks.run_log import run_log


@task(name="run-stress-test", cache_policy=NO_CACHE)
def run_stress_test(
    server: RunningServer,
    profile: StressGate,
    serve: ServeSection,
    *,
    tokenizer_dir: str,
    output_dir: Path,
    server_process_alive: Callable[[], bool] | None = None,
) -> stress.StressResult:
    """Run the profile against the live server; the result's ``failures`` say why it did not pass."""
    log = run_log()
    return stress.run_stress_test(
        server,
        profile,
        serve,
        tokenizer_dir=tokenizer_dir,
        output_dir=Path(output_dir),
        server_process_alive=server_process_alive,
        log=log,
    )
