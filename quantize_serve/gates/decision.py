"""The promotion decision: a pure function of what was measured and the recipe's thresholds.

One row per check with its reason. A check that could not run (its stage raised, or it has no
data) is a failed row, never a skip: a release is promoted only on evidence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import BaseModel

from quantize_serve.gates.accuracy.results import AccuracyCheck
from quantize_serve.gates.regression import RegressionResult
from quantize_serve.gates.soak import SoakResult
from quantize_serve.gates.stress import StressResult
from quantize_serve.gates.accuracy.task_label import task_label


class CheckRow(BaseModel):
    check: str
    passed: bool
    reason: str
    off: bool = False  # a check that did not apply (the regression gate with no release yet): shown as "off"


class Decision(BaseModel):
    passed: bool
    checks: list[CheckRow]

    @property
    def reasons(self) -> list[str]:
        """The failed checks' reasons (what a rejection records)."""
        return [f"{c.check}: {c.reason}" for c in self.checks if not c.passed]

    def markdown(self) -> str:
        rows = ["| check | result | reason |", "|---|---|---|"]
        rows += [
            f"| {c.check} | {'off' if c.off else 'pass' if c.passed else '**FAIL**'} | {c.reason} |"
            for c in self.checks
        ]
        return "\n".join(rows)


def decide(
    accuracy: list[AccuracyCheck] | BaseException | None,
    stress: StressResult | BaseException | None,
    soak: SoakResult | BaseException | None = None,
    *,
    soak_required: bool = False,
    regression: RegressionResult | BaseException | None = None,
    task_labels: Mapping[str, str] | None = None,
) -> Decision:
    """soak_required: the recipe sets gates.soak, so a soak that did not run is a failed row.
    ``regression``: the comparison with production (gates/regression.py), or why it was off.
    ``task_labels``: each accuracy task as the recipe spells it -> how its rows name it (lm-eval's name)."""
    rows = accuracy_rows(accuracy, task_labels) + [stress_row(stress)]
    if soak_required or soak is not None:
        rows.append(soak_row(soak))
    rows += regression_rows(regression)
    return Decision(passed=all(r.passed for r in rows), checks=rows)


def accuracy_rows(
    accuracy: list[AccuracyCheck] | BaseException | None, task_labels: Mapping[str, str] | None = None
) -> list[CheckRow]:
    if isinstance(accuracy, BaseException):
        return [CheckRow(check="accuracy", passed=False, reason=f"could not run: {_first_line(accuracy)}")]
    if not accuracy:
        return [
            CheckRow(
                check="accuracy",
                passed=False,
                reason="no accuracy result: add tasks under gates.accuracy.tasks",
            )
        ]
    rows = []
    for c in accuracy:
        reason = c.reason
        if c.recovery is not None:
            flips = f", {c.flip_rate:.1%} flipped" if c.flip_rate is not None else ""
            reason += (
                f" (base {c.base:.4g}, quantized {c.quantized:.4g}; {c.docs_text}{flips}"
                f"{'; ' + c.rates_text if c.rates_text else ''})"
            )
            if c.warning:
                reason += f"; warning: {c.warning}"
        rows.append(
            CheckRow(
                check=f"accuracy {task_label(c.task, task_labels)} {c.metric}", passed=c.passed, reason=reason
            )
        )
    return rows


def _failed_row(
    check: str, result: StressResult | SoakResult | BaseException | None, not_run: str
) -> CheckRow | None:
    """The failed row of a load gate that raised, did not run, or failed; None when it passed."""
    if isinstance(result, BaseException):
        return CheckRow(check=check, passed=False, reason=f"could not run: {_first_line(result)}")
    if result is None:
        return CheckRow(check=check, passed=False, reason=not_run)
    if result.failures:
        return CheckRow(check=check, passed=False, reason="; ".join(result.failures))
    return None


def stress_row(stress: StressResult | BaseException | None) -> CheckRow:
    failed = _failed_row("stress", stress, "the stress test did not run")
    if failed:
        return failed
    usage = f"{stress.peak_kv_cache_usage:.0%}" if stress.peak_kv_cache_usage is not None else "n/a"
    return CheckRow(
        check="stress",
        passed=True,
        reason=(
            f"{stress.completed}/{stress.requests - stress.overlong_expected} requests completed with the "
            f"requested tokens at concurrency up to {max(stress.concurrency_steps, default=0)}, "
            f"{stress.rejected_overlong}/{stress.overlong_expected} over-long prompts rejected with 400, "
            f"{stress.preemptions} preemptions, peak KV usage {usage}, no 5xx, no timeouts"
        ),
    )


def soak_row(soak: SoakResult | BaseException | None) -> CheckRow:
    failed = _failed_row("soak", soak, "the soak test did not run (gates.soak is set)")
    if failed:
        return failed
    f = soak.figures
    gpu = "" if f.gpu_slope_mib_per_min is None else f", GPU memory {f.gpu_slope_mib_per_min:+.1f} MiB/min"
    return CheckRow(
        check="soak",
        passed=True,
        reason=(
            f"{soak.traffic.completed} requests over {soak.measured_s:g} s at concurrency "
            f"{soak.concurrency}: RSS {f.rss_slope_mib_per_min:+.1f} MiB/min after the {soak.warmup_s:g} s "
            f"warm-up{gpu} (limit {soak.max_memory_growth_mib_per_min:g}), {f.preemptions_after_warmup} "
            "preemptions after warm-up, no failed requests"
        ),
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def regression_rows(result: RegressionResult | BaseException | None) -> list[CheckRow]:
    """The decision's rows: one per kind (accuracy, capacity, throughput), or one ``off`` row."""
    if isinstance(result, BaseException):
        return [CheckRow(check="regression", passed=False, reason=f"could not run: {_first_line(result)}")]
    if result is None:
        return []
    if result.off:
        return [CheckRow(check="regression", passed=True, off=True, reason=f"off: {result.off}")]
    rows = []
    where = f"vs {result.release_ref} {(result.production_sha or '')[:12]} ({result.source})"
    for kind in ("accuracy", "capacity", "throughput"):
        mine = [r for r in result.rows if r.kind == kind]
        if not mine:
            continue
        failed = [r for r in mine if not r.passed]
        if failed:
            reason = "; ".join(f"{r.measure}: {r.reason}" for r in failed)
        elif kind == "accuracy":
            worst = min(mine, key=lambda r: r.ratio if r.ratio is not None else math.inf)
            reason = f"{len(mine)} metrics no worse than allowed; closest: {worst.measure}: {worst.reason}"
        else:
            reason = "; ".join(f"{r.measure}: {r.reason}" for r in mine)
        rows.append(CheckRow(check=f"regression {kind}", passed=not failed, reason=f"{reason} [{where}]"))
    return rows
