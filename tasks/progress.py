"""The run's stages as a person follows them: a line in the run's log and an event for the terminal
(quantize_serve/core/progress.py) as each starts and ends, with its time and key figure; and the run's
marks, which move the progress artifact the UI shows and which benchmarks/ time runs by."""

from __future__ import annotations

import time
from typing import Any, TypeVar

from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.logging import get_run_logger
from prefect.states import State

from quantize_serve.capacity.measure import CapacityConfig
from quantize_serve.core import progress
from quantize_serve.core.portable import portable_path
from quantize_serve.formats.choose import FormatChoice
from quantize_serve.gates.decision import Decision
from quantize_serve.gates.regression import RegressionResult
from quantize_serve.gates.accuracy.results import AccuracyCheck, AccuracyRun
from quantize_serve.gates.soak import SoakResult
from quantize_serve.gates.stress import StressResult
from quantize_serve.hub.client import PushResult
from quantize_serve.quantize.run import QuantizeResult
from quantize_serve.report.base_reference import BaseReference
from quantize_serve.report.run_report import Release, RunReport
from quantize_serve.report.steps import RunSteps
from quantize_serve.serve_profile.search import ProfileSearchResult
from quantize_serve.validate.preflight import BaseModelRef, ValidatedRecipe

# The marks every run passes, in order: the UI's progress bar, and the "stage done: <mark>" log lines
# that benchmarks/ time a run by (the seconds between two marks).
MARKS = (
    "validated",
    "base resolved",
    "quantized",
    "base served",
    "quantized served",
    "fp8 served",
    "candidate pushed",
    "decided",
    "released",
    "reported",
)
T = TypeVar("T")
# The run's steps a stage line names (all of them, with their reasons: the run's log, report and artifact)
STEPS_SHOWN = ("base", "quantize", "compile ahead")


class Progress:
    """What a person follows: ``start(stage)`` and ``done(stage, result)`` around each stage (``done``
    returns the result), a line in the run's log and an event each; and the run's marks (``mark``, or
    ``done(..., mark=)`` where a stage ends at one)."""

    def __init__(self, recipe_name: str) -> None:
        self.id = create_progress_artifact(
            progress=0.0,
            key=f"{recipe_name}-progress",
            description=f"quantize-serve stages: {' -> '.join(MARKS)}",
        )
        self.started: dict[str, float] = {}
        self.reached = 0  # the furthest mark: a run that quantizes beside its base marks "base served" first

    def start(self, stage: str) -> None:
        self.started[stage] = time.monotonic()
        get_run_logger().info("stage %s started", stage)
        progress.publish(progress.StageStarted(stage))

    def done(self, stage: str, result: T = None, *, mark: str | None = None) -> T:
        """End ``stage`` (one that never started ran beside others: no time of its own) with the key
        figure of ``result`` (a failed gate's state or exception ends it as failed)."""
        began = self.started.pop(stage, None)
        seconds = None if began is None else time.monotonic() - began
        passed, figure = key_figure(result)
        took = "" if seconds is None else f" in {seconds:.0f} s"
        get_run_logger().info(
            "stage %s %s%s%s", stage, "done" if passed else "FAILED", took, f": {figure}" if figure else ""
        )
        progress.publish(progress.StageEnded(stage, seconds, figure, passed))
        if mark:
            self.mark(mark)
        return result

    def mark(self, name: str) -> None:
        self.reached = max(self.reached, MARKS.index(name) + 1)
        update_progress_artifact(self.id, progress=100.0 * self.reached / len(MARKS))
        get_run_logger().info("stage done: %s", name)


def key_figure(result: Any) -> tuple[bool, str]:
    """(passed, the one figure a person wants from this stage)."""
    if isinstance(result, State):  # a gate run with return_state=True
        result = result.result(raise_on_failure=False)
    if isinstance(result, BaseException):
        lines = str(result).strip().splitlines()
        return False, f"{type(result).__name__}: {lines[0] if lines else ''}"
    if isinstance(result, ValidatedRecipe):
        r = result.recipe
        q = r.quantization
        what = (
            f"checkpoint {portable_path(q.checkpoint) if r.is_local(q.checkpoint) else q.checkpoint}"
            if q.checkpoint
            else f"{q.method} {q.scheme}, {r.calibration.num_samples} calibration samples"
        )
        note = result.host_note()  # a recipe setting this host does not apply (serve.memory_budget on a GPU)
        return True, f"{r.name}: {what}" + (f"; {note}" if note else "")
    if isinstance(result, BaseModelRef):
        return True, f"{result.repo_id or portable_path(result.local_dir)} at {result.sha[:12]}"
    if isinstance(result, QuantizeResult):
        size = f"{result.base_bytes / 1e6:,.1f} MB -> {result.quantized_bytes / 1e6:,.1f} MB"
        if result.source_checkpoint or result.cached:
            return True, f"{'existing' if result.source_checkpoint else 'reused'} checkpoint, {size}"
        tokens = f"{result.calibration_tokens:,} calibration tokens, " if result.calibration_tokens else ""
        return True, tokens + size
    if isinstance(result, CapacityConfig):
        return True, result.figure()  # measured (vLLM's own line), derived from what, or reused
    if isinstance(result, BaseReference):
        return True, (
            f"measured by run {result.run_id[:8]}: {result.capacity.kv_cache_tokens:,} KV tokens, "
            f"{len(result.accuracy.tasks)} accuracy tasks"
        )
    if isinstance(result, AccuracyRun):
        docs = sum(t.num_docs or 0 for t in result.tasks.values())
        return True, f"{len(result.tasks)} tasks, {docs:,} documents"
    if isinstance(result, StressResult):
        usage = "n/a" if result.peak_kv_cache_usage is None else f"{result.peak_kv_cache_usage:.0%}"
        figure = (
            f"{result.completed}/{result.requests - result.overlong_expected} requests completed, "
            f"{result.rejected_overlong}/{result.overlong_expected} over-long rejected, peak KV {usage}"
        )
        return result.passed, figure if result.passed else f"{figure}; {'; '.join(result.failures)}"
    if isinstance(result, SoakResult):
        return result.passed, "; ".join(
            result.failures
        ) or f"{result.traffic.completed} requests, memory flat"
    if isinstance(result, list) and all(isinstance(c, AccuracyCheck) for c in result):
        return accuracy_figure(result)
    if isinstance(result, RegressionResult):
        if result.off:
            return True, f"off: {result.off}"
        failed = sum(not r.passed for r in result.rows)
        return (
            not failed,
            f"{len(result.rows) - failed} of {len(result.rows)} figures no worse than production",
        )
    if isinstance(result, Decision):
        failed = [c.check for c in result.checks if not c.passed]
        return result.passed, "passed" if result.passed else f"failed: {', '.join(failed)}"
    if isinstance(result, PushResult):
        same = "" if result.created_commit else " (unchanged)"
        return True, f"{result.repo_id}@{result.commit_sha[:12]}{same}"
    if isinstance(result, Release):
        where = (
            f"{result.ref} -> {(result.commit_sha or '')[:12]}"
            if result.status == "promoted"
            else f"tag {result.rejection_tag}"
            if result.rejection_tag
            else ""
        )
        return result.status != "rejected", f"{result.status}{': ' + where if where else ''}"
    if isinstance(result, FormatChoice):
        return result.winner is not None, f"releases {result.winner}" if result.winner else "no format passed"
    if isinstance(result, ProfileSearchResult):
        found = result.found
        return found is not None, (
            f"max_num_seqs {found.max_num_seqs} in {result.boots} boots" if found else result.stop_reason
        )
    if isinstance(result, RunReport):
        return True, f"{portable_path(result.report_dir)}/report.md"
    if isinstance(result, RunSteps):
        return True, "; ".join(f"{s.name} {s.choice}" for s in result.steps if s.name in STEPS_SHOWN)
    return True, ""


def accuracy_figure(checks: list[AccuracyCheck]) -> tuple[bool, str]:
    passed = sum(c.passed for c in checks)
    measured = [c for c in checks if c.recovery is not None]
    lowest = min(measured, key=lambda c: c.recovery or 0.0) if measured else None
    worst = f", lowest recovery {lowest.recovery_text}" if lowest else ""
    return passed == len(checks), f"{passed} of {len(checks)} metrics pass{worst}"
