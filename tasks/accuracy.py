"""Prefect task for the accuracy gate (thin wrapper around quantize_serve.gates.accuracy.run.run_accuracy).

No Prefect retries: lm-eval already retries each failed request (REQUEST_ATTEMPTS, with backoff),
which covers a transient server hiccup; a failure that survives that is a dead server or a broken
task, and re-running minutes of evaluation would not fix either.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from quantize_serve.core import ahead
from quantize_serve.core.settings import get_settings
from quantize_serve.gates.accuracy import run as accuracy
from quantize_serve.recipe.gates import AccuracyGate
from tasks.run_log import run_log


def prepare_accuracy(gate: AccuracyGate, base_dir: Path) -> Future[accuracy.Prepared] | None:
    """accuracy.prepare_run (lm-eval's imports, the task files, its task index) started now as work ahead
    (core/ahead.py), as a server boots: the boot's seconds, where the accuracy run would spend them after it.
    Its errors (a task file) are raised by the run that takes it. None with QS_PREPARE_BOOTS=false: the run
    does it."""
    return ahead.start(accuracy.prepare_run, gate, base_dir) if get_settings().prepare_boots else None


# log_prints off here: the flow's print-to-log patch would also catch prints aimed at a swapped
# sys.stdout, and `datasets` hashes lm-eval's document functions with dill, which finds a function's
# globals by capturing dis.dis() output that way: the disassembly landed in the run's log and the
# hash lost the globals.
# NO_CACHE: a live server's scores are never a cached result (and ``prepared`` is no input to hash)
@task(name="run-accuracy", log_prints=False, cache_policy=NO_CACHE)
def run_accuracy(
    server_base_url: str,
    gate: AccuracyGate,
    *,
    tokenizer_dir: str,
    max_length: int,
    base_dir: Path,
    output_dir: Path,
    num_concurrent: int | None = None,
    paired_with: accuracy.AccuracyRun | None = None,
    reuse_rows: bool = False,
    prepared: Future[accuracy.Prepared] | None = None,
    kv_cache_tokens: int | None = None,
) -> accuracy.AccuracyRun:
    log = run_log()
    ahead.settle()  # its own preparation, if any, and all other work ahead: they import what lm-eval does
    done = prepared.result() if prepared else None
    if done:
        log(f"lm-eval's imports and task index prepared while the server booted ({done.seconds:.0f} s)")
    result = accuracy.run_accuracy(
        server_base_url,
        gate,
        tokenizer_dir=tokenizer_dir,
        max_length=max_length,
        base_dir=base_dir,
        output_dir=output_dir,
        num_concurrent=num_concurrent,
        paired_with=paired_with,
        reuse_rows=reuse_rows,
        log=log,
        prepared=done,
        kv_cache_tokens=kv_cache_tokens,
    )
    for run in result.tasks.values():  # a line per task for a person following the run
        looks = f" (look {run.looks_run} of {run.looks_planned})" if run.looks_planned > 1 else ""
        log(
            f"lm-eval {run.lm_eval_name}: {run.num_docs} of {run.planned_docs} documents{looks} "
            f"in {run.seconds:.0f} s: " + ", ".join(f"{k} {m.value:.4g}" for k, m in run.metrics.items())
        )
    if result.prompt_tokens_computed is not None:
        computed, sent = result.prompt_tokens_computed, result.prompt_tokens
        log(f"vLLM computed {computed:,} of the {sent:,} prompt tokens sent")
    if result.scoring_counts:
        log(
            f"lm-eval scoring ({result.scoring}): "
            + ", ".join(f"{k} {v}" for k, v in result.scoring_counts.items())
        )
    return result
