"""The gates' verdict as tasks: compare accuracy, then decide (both pure)."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from quantize_serve.gates import decision
from quantize_serve.gates.accuracy import recovery
from quantize_serve.gates.accuracy import run as accuracy
from quantize_serve.gates.regression import RegressionResult
from quantize_serve.gates.soak import SoakResult
from quantize_serve.gates.stress import StressResult
from quantize_serve.recipe.gates import AccuracyGate
from quantize_serve.report.provenance import task_labels
from quantize_serve.validate.preflight import ValidatedRecipe


@task(name="compare-accuracy")
def compare_accuracy(
    base: accuracy.AccuracyRun | BaseException,
    quantized: accuracy.AccuracyRun | BaseException,
    gate: AccuracyGate,
) -> list[accuracy.AccuracyCheck] | BaseException:
    for run in (base, quantized):
        if isinstance(run, BaseException):
            return run  # the check could not run: decide() turns it into a failed row
    return recovery.compare_accuracy(base, quantized, gate)


def accuracy_task_labels(validated: ValidatedRecipe) -> dict[str, str]:
    """How rows name the recipe's accuracy tasks: lm-eval's names, never the recipe's task paths."""
    r = validated.recipe
    return task_labels([t.task for t in r.gates.accuracy.tasks], base_dir=Path(r.base_dir))


@task(name="decide-release")
def decide_release(
    validated: ValidatedRecipe,
    checks: list[accuracy.AccuracyCheck] | BaseException,
    stress: StressResult | BaseException,
    soak: SoakResult | BaseException | None = None,
    *,
    soak_required: bool = False,
    regression: RegressionResult | BaseException | None = None,
) -> decision.Decision:
    return decision.decide(
        checks,
        stress,
        soak,
        soak_required=soak_required,
        regression=regression,
        task_labels=accuracy_task_labels(validated),
    )
