"""Task options that change what runs inside a task, checked under a real flow run."""

from __future__ import annotations

import math

import dill.detect
from prefect import flow, task

from tasks.accuracy import run_accuracy


def _uses_a_global() -> float:
    return math.pi


def _globals_dill_finds() -> list[str]:
    return sorted(dill.detect.nestedglobals(_uses_a_global))


def test_lm_eval_runs_where_dill_can_read_a_functions_globals():
    """`datasets` fingerprints lm-eval's document functions with dill, which reads a function's globals
    from dis.dis() printed into a swapped sys.stdout. Under the flow's log_prints that print went to the
    run's log instead (seen on the H200: hundreds of bytecode lines per hellaswag run). run-accuracy
    turns log_prints off; the control shows the leak it avoids."""

    @flow(log_prints=True)
    def pipeline_like(log_prints_in_task: bool) -> list[str]:
        return task(_globals_dill_finds, log_prints=log_prints_in_task)()

    assert run_accuracy.log_prints is False
    assert pipeline_like(run_accuracy.log_prints) == ["math"]
    assert pipeline_like(True) == []  # the leak: the disassembly was logged, dill saw nothing
