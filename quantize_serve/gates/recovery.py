"""The accuracy gate's rule: recovery (quantized / base; inverted where lower is better), its ~95%
interval from lm-eval's standard errors, the sample-count check, one AccuracyCheck per task and metric
(docs/gates.md)."""

from __future__ import annotations

import math
from typing import Literal

from quantize_serve.gates.accuracy import Z_95, AccuracyCheck, AccuracyRun, MetricResult, format_recovery
from quantize_serve.recipe.gates import AccuracyGate


def compare_accuracy(base: AccuracyRun, quantized: AccuracyRun, gate: AccuracyGate) -> list[AccuracyCheck]:
    """One check per gated task and metric. Anything missing is a failed check, never a skip.

    With ``gate.min_samples`` set, a task evaluated on fewer documents (in either run) also gets a
    failed ``samples`` check (:func:`check_samples`)."""
    checks: list[AccuracyCheck] = []
    for task in gate.tasks:
        b, q = base.tasks.get(task.task), quantized.tasks.get(task.task)
        if b is None or q is None:
            side = " and ".join(s for s, r in (("base", b), ("quantized", q)) if r is None)
            checks.append(AccuracyCheck(
                task=task.task, metric="*", base=None, quantized=None, recovery=None,
                threshold=gate.default_recovery, passed=False, higher_is_better=None,
                reason=f"the task has no results in the {side} run"))
            continue
        names = list(b.metrics) + [m for m in q.metrics if m not in b.metrics]
        for metric in [*names, *(m for m in task.recovery if m not in names)]:
            threshold = task.recovery.get(metric, gate.default_recovery)
            checks.append(check_metric(task.task, metric, b.metrics.get(metric), q.metrics.get(metric),
                                       threshold, on_uncertain=gate.on_uncertain))
        if gate.min_samples is not None:
            samples = check_samples(task.task, b.num_docs, q.num_docs, gate.min_samples,
                                    gate.default_recovery)
            if samples is not None:
                checks.append(samples)
    return checks


def check_samples(task: str, base_docs: int | None, quantized_docs: int | None, min_samples: int,
                  threshold: float) -> AccuracyCheck | None:
    """The failed ``samples`` check of a task evaluated on fewer than ``min_samples`` documents
    (or on an unknown number); None when both runs saw enough."""
    counts = [n for n in (base_docs, quantized_docs) if n is not None]
    if len(counts) == 2 and min(counts) >= min_samples:
        return None
    if len(counts) < 2:
        reason = (f"lm-eval did not report how many documents task {task!r} was evaluated on, so "
                  f"gates.accuracy.min_samples = {min_samples} cannot be checked. Fix: gate a task "
                  "lm-eval counts (a single task rather than a group), or unset min_samples")
    else:
        reason = (f"task {task!r} was evaluated on {min(counts)} documents, fewer than "
                  f"gates.accuracy.min_samples = {min_samples}: too few to measure recovery. Fix: raise "
                  f"the task's limit (gates.accuracy.tasks[].limit) to at least {min_samples}, or unset it "
                  "to run the whole task; if the task has fewer documents, lower min_samples")
    return AccuracyCheck(task=task, metric="samples", base=None, quantized=None, recovery=None,
                         threshold=threshold, passed=False, higher_is_better=None, reason=reason)


def recovery_interval(recovery: float, base: MetricResult,
                      quantized: MetricResult) -> tuple[float, float] | None:
    """~95% interval on ``recovery`` from the two runs' standard errors, by the delta method.

    For a ratio r = x / y of independent estimates, se_r = r * sqrt((se_x/x)^2 + (se_y/y)^2), and the
    interval is r +- 1.96 * se_r (its lower end kept at 0 at least). It is the same for
    quantized/base and base/quantized (lower is better). Base and quantized are scored on the same
    documents, so their errors are positively correlated and the true interval is narrower: treating
    them as independent is conservative. None when either stderr is missing ("N/A", as lm-eval
    reports for perplexities) or a score is 0 (no relative error).
    """
    if base.stderr is None or quantized.stderr is None or not math.isfinite(recovery):
        return None
    if base.value <= 0 or quantized.value <= 0:
        return None
    se = recovery * math.hypot(quantized.stderr / quantized.value, base.stderr / base.value)
    return (max(0.0, recovery - Z_95 * se), recovery + Z_95 * se)


def uncertainty_warning(recovery: float, interval: tuple[float, float] | None, threshold: float) -> str:
    """The warning of a check whose interval crosses the threshold ("" when it does not, or has none):
    the point passes but the lower end is below the threshold, or the point fails but the upper end
    is above it. Either way the sample is too small to tell which side the model is on."""
    if interval is None:
        return ""
    low, high = interval
    crosses = (recovery >= threshold > low) if recovery >= threshold else (high > threshold)
    if not crosses:
        return ""
    return (f"recovery {format_recovery(recovery, interval)} crosses the threshold {threshold}: too few "
            "samples to be sure; raise limit (gates.accuracy.tasks[].limit)")


def check_metric(task: str, metric: str, base: MetricResult | None, quantized: MetricResult | None,
                 threshold: float, *, on_uncertain: Literal["warn", "fail"] = "warn") -> AccuracyCheck:
    """Recovery of one metric; every way it cannot be computed is a failed check with its reason.

    Passed when the point recovery >= threshold. When its interval (:func:`recovery_interval`)
    crosses the threshold the check carries a warning; ``on_uncertain="fail"`` also fails it."""
    direction = next((r.higher_is_better for r in (base, quantized)
                      if r is not None and r.higher_is_better is not None), None)

    def failed(reason: str, recovery: float | None = None) -> AccuracyCheck:
        return AccuracyCheck(task=task, metric=metric, base=base.value if base else None,
                             quantized=quantized.value if quantized else None, recovery=recovery,
                             threshold=threshold, passed=False, higher_is_better=direction, reason=reason)

    if base is None or quantized is None:
        missing = " and ".join(s for s, r in (("base", base), ("quantized", quantized)) if r is None)
        hint = " (a per-metric recovery override names a metric lm-eval did not report?)" if (
            base is None and quantized is None) else ""
        return failed(f"metric missing in the {missing} run{hint}")
    if direction is None:
        return failed("lm-eval does not say whether higher is better for this metric, so recovery "
                      "has no direction; give the task's metric_list a higher_is_better")
    b, q = base.value, quantized.value
    if not (math.isfinite(b) and math.isfinite(q)):
        return failed(f"not a finite number (base {b}, quantized {q})")
    if b < 0 or q < 0:
        return failed(f"recovery is a ratio of non-negative scores; got base {b}, quantized {q}")
    numerator, denominator = (q, b) if direction else (b, q)
    if b == q:
        recovery = 1.0
    elif denominator == 0:
        recovery = math.inf  # the quantized model is strictly better than a zero
    else:
        recovery = numerator / denominator
    interval = recovery_interval(recovery, base, quantized)
    warning = uncertainty_warning(recovery, interval, threshold)
    passed = recovery >= threshold
    relation = ">=" if passed else "<"
    formula = "quantized/base" if direction else "base/quantized (lower is better)"
    note = " (both 0: this task does not measure the model)" if b == q == 0 else ""
    reason = f"recovery {formula} = {format_recovery(recovery, interval)} {relation} {threshold}{note}"
    if warning and on_uncertain == "fail":
        if passed:
            reason += "; failed: the interval crosses the threshold and gates.accuracy.on_uncertain is 'fail'"
        passed = False
    return AccuracyCheck(task=task, metric=metric, base=b, quantized=q, recovery=recovery,
                         threshold=threshold, passed=passed, higher_is_better=direction,
                         reason=reason, recovery_interval=interval, warning=warning)
