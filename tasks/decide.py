"""The gates' verdict as tasks: compare accuracy, then decide (both pure)."""

from __future__ import annotations

from prefect import task

from quantize_serve.gates import accuracy, decision, recovery
from quantize_serve.gates.regression import RegressionResult
from quantize_serve.gates.soak import SoakResult
from quantize_serve.gates.stress import StressResult
from quantize_serve.recipe.gates import AccuracyGate


@task(name="compare-accuracy")
def compare_accuracy(base: accuracy.AccuracyRun | BaseException, quantized: accuracy.AccuracyRun | BaseException,
                     gate: AccuracyGate) -> list[accuracy.AccuracyCheck] | BaseException:
    for run in (base, quantized):
        if isinstance(run, BaseException):
            return run  # the check could not run: decide() turns it into a failed row
    return recovery.compare_accuracy(base, quantized, gate)


@task(name="decide-release")
def decide_release(checks: list[accuracy.AccuracyCheck] | BaseException,
                   stress: StressResult | BaseException,
                   soak: SoakResult | BaseException | None = None, *,
                   soak_required: bool = False,
                   regression: RegressionResult | BaseException | None = None) -> decision.Decision:
    return decision.decide(checks, stress, soak, soak_required=soak_required, regression=regression)
