"""Prefect task for the accuracy gate (thin wrapper around quantize_serve.gates.accuracy.run_accuracy).

No Prefect retries: lm-eval already retries each failed request (REQUEST_ATTEMPTS, with backoff),
which covers a transient server hiccup; a failure that survives that is a dead server or a broken
task, and re-running minutes of evaluation would not fix either.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task

from quantize_serve.gates import accuracy
from quantize_serve.recipe.gates import AccuracyGate
from tasks.run_log import run_log


# log_prints off here: the flow's print-to-log patch would also catch prints aimed at a swapped
# sys.stdout, and `datasets` hashes lm-eval's document functions with dill, which finds a function's
# globals by capturing dis.dis() output that way: the disassembly landed in the run's log and the
# hash lost the globals.
@task(name="run-accuracy", log_prints=False)
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
) -> accuracy.AccuracyRun:
    log = run_log()
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
