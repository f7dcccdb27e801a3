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


def test_the_compile_ahead_task_waits_for_the_checkpoint_and_hears_the_base_scored_after_it_started(tmp_path):
    """compile-production-ahead gets the quantization's future and the run's Until quoted (flows/pipeline.py):
    it waits for the checkpoint inside the task, and the flow's ``base_scored()`` after its submission reaches
    the very object the task reads (a copy would keep the boot up until healthy). A failed quantization
    starts no boot."""
    import threading

    from quantize_serve.recipe.load import load_recipe
    from quantize_serve.serving.compile_ahead import Until
    from quantize_serve.validate.preflight import BaseModelRef, ValidatedRecipe
    from prefect.utilities.annotations import quote
    from tasks.compile_ahead import compile_production_ahead
    from tests.conftest import ROOT
    from tests.release_fixtures import placeholder_checkpoint

    validated = ValidatedRecipe(
        recipe=load_recipe(ROOT / "recipes/tiny-llama-awq.yaml"),
        source="recipes/tiny-llama-awq.yaml",
        recipe_sha256="0" * 64,
        calibration_fingerprint="1" * 64,
    )
    base = BaseModelRef(local_dir=str(ROOT / "models/tiny-llama"), sha="2" * 64)
    checkpoint_saved = threading.Event()

    @task
    def quantize(fail: bool):
        checkpoint_saved.wait(60)
        if fail:
            raise RuntimeError("calibration ran out of memory")
        return placeholder_checkpoint()

    @flow
    def release_like(fail: bool):
        until = Until()
        quantized = quantize.submit(fail)
        ahead = compile_production_ahead.submit(validated, base, quote(quantized), tmp_path, quote(until))
        until.base_scored()  # the base's accuracy run ends while the checkpoint is still being saved
        checkpoint_saved.set()
        return ahead.result()

    done = release_like(False)
    assert (done.outcome, done.detail) == ("skipped", "the base's accuracy run had ended: nothing to overlap")
    checkpoint_saved.clear()
    done = release_like(True)
    assert (done.outcome, done.detail) == ("skipped", "the quantization failed")
