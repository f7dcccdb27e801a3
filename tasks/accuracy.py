"""Prefect task for the accuracy gate (thin wrapper around quantize_serve.accuracy.run_accuracy).

No Prefect retries: lm-eval already retries each failed request (REQUEST_ATTEMPTS, with backoff),
which covers a transient server hiccup; a failure that survives that is a dead server or a broken
task, and re-running minutes of evaluation would not fix either.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task

from quantize_serve import accuracy
from quantize_serve.recipe import AccuracyGate


@task(name="run-accuracy")
def run_accuracy(
    server_base_url: str,
    gate: AccuracyGate,
    *,
    tokenizer_dir: str,
    max_length: int,
    base_dir: Path,
    output_dir: Path,
) -> accuracy.AccuracyRun:
    return accuracy.run_accuracy(
        server_base_url,
        gate,
        tokenizer_dir=tokenizer_dir,
        max_length=max_length,
        base_dir=base_dir,
        output_dir=output_dir,
    )
