"""The regression gate: the candidate against the release already in production, not only its base.

A candidate that beats its base can still be worse than what the release ref (``hub.release_ref``)
serves today: a second AWQ release that recovers 0.96 and serves 10% fewer concurrent requests. So
when the ref points at a gated commit, the candidate is compared with that release on:

- accuracy: every metric of the accuracy gate, the candidate's score against production's, with
  the direction lm-eval gives (a perplexity may not rise); at most ``max_accuracy_drop`` (a fraction of
  production's score; per metric: ``metric_max_drop``) worse;
- capacity: KV tokens and max concurrency at ``max_model_len`` of the production boot, candidate /
  production at least ``min_capacity_ratio``;
- throughput: output tokens per second of ``vllm bench serve`` at the stress concurrency, candidate /
  production at least ``min_throughput_ratio``.

Production's figures are the ones recorded with it on the Hub (:class:`ReleaseResults`, written by
the release step as ``release-results.json`` in the gated commit) when they were measured under the
same :class:`MeasurementConditions` as the candidate's (:func:`condition_differences`); otherwise the
flow serves the release again with this run's settings (flows/boots.py ``serve_release``) and compares
with those figures. A host's speed on the day is no recorded condition (a busier host, another card of
the same model): a candidate whose throughput falls below the limit against production's recorded figure
is compared with production's throughput measured again on this host, beside its other recorded figures
(:func:`throughput_to_confirm`), so the gate never rejects on a slower host alone. With no release the
gate is off (:func:`regression_off`), and the report says so.

Pure functions and types (no Hub, no server): the flow composes them (tasks/regression.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field

from quantize_serve.gates.accuracy.run import AccuracyRun
from quantize_serve.gates.stress import StressResult
from quantize_serve.gates.accuracy.task_label import task_label
from quantize_serve.recipe.gates import RegressionGate
from quantize_serve.recipe.model import SERVE_FIELDS_NOT_MEASURED, Recipe

# The accuracy task fields that change a score (a recovery threshold does not).
TASK_FIELDS_MEASURED = ("task", "num_fewshot", "limit")
# Where production's figures came from: its record, all of it served again, or its record with the
# throughput measured again (throughput_to_confirm).
Source = Literal["recorded", "served again", "recorded, throughput served again"]


class MeasurementConditions(BaseModel):
    """What a release's figures depend on besides the checkpoint: equal conditions, comparable figures."""

    tasks: list[dict[str, Any]] = Field(
        description="The accuracy tasks as the recipe gives them (task, num_fewshot, limit)."
    )
    vllm_version: str | None = Field(description="vLLM of the serving environment.")
    hardware: str = Field(description="CPU and GPU model(s) of the host that measured (describe_hardware).")
    serve: dict[str, Any] = Field(description="The serve settings of the production boot.")
    stress: dict[str, Any] = Field(
        description="The stress profile (concurrency, request mix) the throughput was measured under."
    )


class RecordedMetric(BaseModel):
    task: str  # as the recipe spells it (the key that pairs runs)
    metric: str
    value: float
    higher_is_better: bool | None = None
    stderr: float | None = None


class ReleaseResults(BaseModel):
    """A release's measured figures and their conditions: the machine-readable record a gated commit
    carries, and what a later candidate is compared with."""

    conditions: MeasurementConditions
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    stress_concurrency: int | None = None
    output_throughput: float | None = Field(
        default=None, description="Output tok/s of vllm bench serve at the stress concurrency."
    )
    accuracy: list[RecordedMetric] = Field(default_factory=list)

    def metric(self, task: str, metric: str) -> RecordedMetric | None:
        return next((m for m in self.accuracy if m.task == task and m.metric == metric), None)


class RegressionRow(BaseModel):
    """One measure side by side: base, production, candidate, and the candidate's ratio to production."""

    kind: Literal["accuracy", "capacity", "throughput"]
    measure: str
    base: float | None = None
    production: float | None = None
    candidate: float | None = None
    ratio: float | None = Field(
        default=None,
        description="candidate vs production, oriented so that "
        "above 1 is better (production / candidate where lower is better)",
    )
    limit: float
    passed: bool
    reason: str


class RegressionResult(BaseModel):
    """The comparison with production, or why there was none (``off``)."""

    off: str = Field(default="", description="why the gate did not apply (no release yet, disabled, no hub)")
    release_ref: str | None = None
    production_sha: str | None = None
    source: Source | None = None
    differences: list[str] = Field(
        default_factory=list,
        description="why production was served again: the conditions that differ from its recorded ones, "
        "or its recorded throughput the candidate's fell below",
    )
    rows: list[RegressionRow] = Field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    def markdown(self) -> str:
        """The side-by-side table (report.md, the card)."""
        if self.off:
            return f"Regression gate off: {self.off}."
        why = "; ".join(self.differences or ["no figures recorded with it"])
        head = f"Against the release at `{self.release_ref}` (`{(self.production_sha or '')[:12]}`), its " + {
            "recorded": "figures as recorded with it on the Hub (same conditions).",
            "recorded, throughput served again": "figures as recorded with it on the Hub (same conditions), "
            f"its throughput measured again in this run ({why}).",
        }.get(self.source or "", f"served again in this run with this run's settings ({why}).")
        lines = [
            head,
            "",
            "| measure | base | production | candidate | candidate vs production | limit | result |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for r in self.rows:
            lines.append(
                f"| {r.measure} | {_num(r.base)} | {_num(r.production)} | {_num(r.candidate)} | "
                f"{'n/a' if r.ratio is None else f'x{r.ratio:.4f}'} | >= x{r.limit:.2f} | "
                f"{'pass' if r.passed else '**FAIL**'} |"
            )
        return "\n".join(lines)


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if float(v).is_integer() and abs(v) >= 100 else f"{v:.4g}"


# --------------------------------------------------------------------------------------------
# Conditions
# --------------------------------------------------------------------------------------------


def measurement_conditions(
    recipe: Recipe, *, vllm_version: str | None, hardware: str
) -> MeasurementConditions:
    """The conditions a run of ``recipe`` measures under on this host."""
    serve = recipe.serve.model_dump(mode="json", exclude=set(SERVE_FIELDS_NOT_MEASURED))
    tasks = [
        t.model_dump(mode="json", include=set(TASK_FIELDS_MEASURED)) for t in recipe.gates.accuracy.tasks
    ]
    stress = recipe.gates.stress.model_dump(mode="json")
    stress["concurrency"] = recipe.serve.concurrency(stress["concurrency"])
    return MeasurementConditions(
        tasks=tasks, vllm_version=vllm_version, hardware=hardware, serve=serve, stress=stress
    )


def condition_differences(recorded: MeasurementConditions, now: MeasurementConditions) -> list[str]:
    """What differs between the conditions production was measured under and this run's (empty: its
    recorded figures compare with the candidate's as they are)."""
    out = []
    if recorded.tasks != now.tasks:
        out.append(f"accuracy tasks {_tasks(recorded.tasks)} -> {_tasks(now.tasks)}")
    if recorded.vllm_version != now.vllm_version:
        out.append(f"vLLM {recorded.vllm_version} -> {now.vllm_version}")
    if recorded.hardware != now.hardware:
        out.append(f"hardware {recorded.hardware!r} -> {now.hardware!r}")
    for section, old, new in (
        ("serve", recorded.serve, now.serve),
        ("gates.stress", recorded.stress, now.stress),
    ):
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                out.append(f"{section}.{key} {old.get(key)!r} -> {new.get(key)!r}")
    return out


def _tasks(tasks: list[dict[str, Any]]) -> str:
    return "[" + ", ".join(task_label(str(t.get("task"))) for t in tasks) + "]"


# --------------------------------------------------------------------------------------------
# A run's figures
# --------------------------------------------------------------------------------------------


def recorded_metrics(run: AccuracyRun | BaseException | None) -> list[RecordedMetric]:
    if not isinstance(run, AccuracyRun):
        return []
    return [
        RecordedMetric(
            task=t.task, metric=name, value=m.value, higher_is_better=m.higher_is_better, stderr=m.stderr
        )
        for t in run.tasks.values()
        for name, m in t.metrics.items()
        if math.isfinite(m.value)
    ]


def release_results(
    conditions: MeasurementConditions,
    *,
    accuracy: AccuracyRun | BaseException | None,
    kv_cache_tokens: int | None,
    max_concurrency: float | None,
    stress: StressResult | BaseException | None,
) -> ReleaseResults:
    """One served release's figures (what failed to run is left out: the comparison fails on it)."""
    throughput = stress.throughput if isinstance(stress, StressResult) else None
    return ReleaseResults(
        conditions=conditions,
        kv_cache_tokens=kv_cache_tokens,
        max_concurrency=max_concurrency,
        stress_concurrency=(
            throughput.max_concurrency
            if throughput and throughput.max_concurrency
            else conditions.stress.get("concurrency")
        ),
        output_throughput=throughput.output_throughput if throughput else None,
        accuracy=recorded_metrics(accuracy),
    )


def throughput_to_confirm(
    recorded: ReleaseResults, candidate: ReleaseResults, gate: RegressionGate
) -> str | None:
    """Why production's throughput is measured again on this host before the gate compares it: the
    candidate's fell below ``min_throughput_ratio`` of production's recorded figure. None: nothing to
    confirm (throughput not compared, or not measured, or within the limit)."""
    limit, was, now = gate.min_throughput_ratio, recorded.output_throughput, candidate.output_throughput
    if limit is None or not was or now is None or now / was >= limit:
        return None
    return (
        f"the candidate's {_num(now)} output tok/s is x{now / was:.3f} of production's recorded {_num(was)}, "
        f"below {limit:.2f}: a host's speed on the day is no recorded condition"
    )


def with_throughput_of(recorded: ReleaseResults, served: ReleaseResults) -> ReleaseResults:
    """Production's recorded figures, its throughput as measured again (:func:`throughput_to_confirm`)."""
    return recorded.model_copy(
        update={
            "output_throughput": served.output_throughput,
            "stress_concurrency": served.stress_concurrency,
        }
    )


# --------------------------------------------------------------------------------------------
# The comparison
# --------------------------------------------------------------------------------------------


def regression_off(why: str, *, release_ref: str | None = None) -> RegressionResult:
    return RegressionResult(off=why, release_ref=release_ref)


def compare_with_production(
    candidate: ReleaseResults,
    production: ReleaseResults,
    gate: RegressionGate,
    *,
    base: ReleaseResults | None = None,
    release_ref: str,
    production_sha: str,
    source: Source,
    differences: list[str] | None = None,
    task_labels: Mapping[str, str] | None = None,
) -> RegressionResult:
    """One row per accuracy metric, KV tokens, max concurrency and throughput; each passes or fails
    with its reason. A figure production has and the candidate lacks (its stage failed) is a failure.
    ``task_labels``: how the rows name each accuracy task (gates/accuracy/task_label.py)."""
    rows: list[RegressionRow] = []
    for p in production.accuracy:
        c = candidate.metric(p.task, p.metric)
        b = base.metric(p.task, p.metric) if base else None
        rows.append(_accuracy_row(p, c, b, gate.max_drop(p.metric), task_label(p.task, task_labels)))
    for p in candidate.accuracy:  # measured now, not with production: nothing to compare with
        if production.metric(p.task, p.metric) is None:
            rows.append(
                RegressionRow(
                    kind="accuracy",
                    measure=f"{task_label(p.task, task_labels)} {p.metric}",
                    candidate=p.value,
                    limit=1 - gate.max_drop(p.metric),
                    passed=False,
                    reason="production has no figure for this metric; serve it again "
                    "(its recorded conditions should have differed)",
                )
            )
    rows.append(
        _ratio_row(
            "capacity",
            "KV tokens",
            production.kv_cache_tokens,
            candidate.kv_cache_tokens,
            base.kv_cache_tokens if base else None,
            gate.min_capacity_ratio,
            "gates.regression.min_capacity_ratio",
        )
    )
    rows.append(
        _ratio_row(
            "capacity",
            "max concurrency",
            production.max_concurrency,
            candidate.max_concurrency,
            base.max_concurrency if base else None,
            gate.min_capacity_ratio,
            "gates.regression.min_capacity_ratio",
        )
    )
    concurrency = candidate.stress_concurrency or production.stress_concurrency
    if gate.min_throughput_ratio is not None:  # null: throughput is not compared
        rows.append(
            _ratio_row(
                "throughput",
                f"output tok/s @ concurrency {concurrency}",
                production.output_throughput,
                candidate.output_throughput,
                None,
                gate.min_throughput_ratio,
                "gates.regression.min_throughput_ratio",
            )
        )
    return RegressionResult(
        release_ref=release_ref,
        production_sha=production_sha,
        source=source,
        differences=differences or [],
        rows=rows,
    )


def _accuracy_row(p: Any, c: Any, b: Any, max_drop: float, task: str) -> RegressionRow:
    measure, limit = f"{task} {p.metric}", 1 - max_drop
    row = {
        "kind": "accuracy",
        "measure": measure,
        "production": p.value,
        "candidate": c.value if c else None,
        "base": b.value if b else None,
        "limit": limit,
    }
    if c is None:
        return RegressionRow(
            **row,
            passed=False,
            reason="the candidate has no figure (its accuracy run failed "
            "or lm-eval did not report this metric)",
        )
    lower = (p.higher_is_better is False) or (c.higher_is_better is False)
    num, den = (p.value, c.value) if lower else (c.value, p.value)
    ratio = 1.0 if num == den else (math.inf if den == 0 else num / den)
    passed = ratio >= limit
    side = "lower is better" if lower else "higher is better"
    return RegressionRow(
        **row,
        ratio=ratio,
        passed=passed,
        reason=(
            f"candidate {c.value:.4g} vs production {p.value:.4g} ({side}): x{ratio:.4f} "
            f"{'>=' if passed else '<'} {limit:.2f} (at most {max_drop:.0%} worse)"
        ),
    )


def _ratio_row(
    kind: str,
    measure: str,
    production: float | None,
    candidate: float | None,
    base: float | None,
    limit: float,
    field: str,
) -> RegressionRow:
    row = {
        "kind": kind,
        "measure": measure,
        "production": production,
        "candidate": candidate,
        "base": base,
        "limit": limit,
    }
    if production is None or candidate is None:
        missing = " and ".join(
            s for s, v in (("production", production), ("the candidate", candidate)) if v is None
        )
        return RegressionRow(**row, passed=False, reason=f"not measured for {missing}")
    ratio = candidate / production if production else math.inf
    passed = ratio >= limit
    return RegressionRow(
        **row,
        ratio=ratio,
        passed=passed,
        reason=(
            f"candidate {_num(candidate)} vs production {_num(production)}: x{ratio:.3f} "
            f"{'>=' if passed else '<'} {limit:.2f} ({field})"
        ),
    )
