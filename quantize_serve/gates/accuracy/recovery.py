"""The accuracy gate's rule (docs/gates.md): per task and metric, the candidate's recovery against the
base, paired per document, decided by a sequential test that keeps the recipe's stated error rates.

:func:`compare_accuracy` turns a base run and a candidate run into one :class:`AccuracyCheck` per task
and metric; :func:`task_decided` tells the candidate's run, at each planned look, whether every metric
of a task is already decided (so it can stop scoring documents). Both use :func:`paired_metrics`: the
documents the candidate scored, joined with the base's by document, with their prompts proven equal.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from quantize_serve.gates.accuracy.documents import LOG_AGGREGATIONS, MEAN_AGGREGATIONS, aggregate, nats
from quantize_serve.gates.accuracy.paired import (
    Design,
    Paired,
    correlation,
    design,
    look_verdict,
    task_operating_point,
    task_true_pass,
    task_verdict,
)
from quantize_serve.gates.accuracy.results import (
    AccuracyCheck,
    AccuracyRun,
    MetricResult,
    TaskRun,
    format_recovery,
)
from quantize_serve.recipe.gates import AccuracyGate, AccuracyTask, ErrorRates

# The one name a task's log-likelihood metrics are gated under: word perplexity, byte perplexity and
# bits per byte are one measurement on three scales, and recovery on the log scale (total nats, base
# over candidate) is the same number for all three; on the perplexity scale it is amplified.
LOG_SCALE_METRIC = "bits_per_byte"


@dataclass
class PairedMetric:
    metric: str  # the gated name
    pair: Paired
    base: MetricResult
    quantized: MetricResult
    higher_is_better: bool
    also: list[str]  # metrics of the same measurement gated under this name (perplexities)


def paired_metrics(base: TaskRun, quantized: TaskRun) -> tuple[list[PairedMetric], list[tuple[str, str]]]:
    """The task's gated metrics as paired series, and (metric, reason) for each that cannot be paired."""
    problems: list[tuple[str, str]] = []
    keys = [k for k in base.documents if k in quantized.documents]
    extra = [k for k in quantized.documents if k not in base.documents]
    if not quantized.documents or not base.documents:
        side = "base" if not base.documents else "quantized"
        return [], [
            (
                "*",
                f"the {side} run has no per-document outcomes to pair (a result recorded before "
                "the paired gate?): serve both models again",
            )
        ]
    if extra:
        return [], [
            (
                "*",
                f"{len(extra)} documents the candidate scored are not in the base run (e.g. "
                f"{extra[0]}): the two runs drew different documents. Fix: run both with the same "
                "gates.accuracy.seed, limits and task files",
            )
        ]
    differ = [k for k in keys if base.documents[k].prompt_hash != quantized.documents[k].prompt_hash]
    if differ:
        return [], [
            (
                "*",
                f"{len(differ)} of {len(keys)} documents were scored with different prompts by base "
                f"and candidate (e.g. {differ[0]}), so they cannot be paired. Fix: serve both again in "
                "one run (a reused base result from another lm-eval or task version?)",
            )
        ]
    groups = [k.rsplit("/", 1)[0] for k in keys]  # the member task (mmlu's subject): docs/gates.md
    gated: list[PairedMetric] = []
    log_family: list[str] = []
    for metric in [*base.metrics, *(m for m in quantized.metrics if m not in base.metrics)]:
        b, q = base.metrics.get(metric), quantized.metrics.get(metric)
        if b is None or q is None:
            side = "base" if b is None else "quantized"
            problems.append((metric, f"metric missing in the {side} run"))
            continue
        aggregation = b.aggregation or q.aggregation
        direction = b.higher_is_better if b.higher_is_better is not None else q.higher_is_better
        if aggregation in LOG_AGGREGATIONS:
            log_family.append(metric)
            continue
        if aggregation not in MEAN_AGGREGATIONS:
            problems.append(
                (
                    metric,
                    f"lm-eval aggregates it as {aggregation!r} over the whole corpus, which "
                    "the paired gate cannot split per document. Fix: gate the task on a mean "
                    "(accuracy, exact match) or perplexity metric",
                )
            )
            continue
        if direction is None:
            problems.append(
                (
                    metric,
                    "lm-eval does not say whether higher is better for this metric, so "
                    "recovery has no direction; give the task's metric_list a higher_is_better",
                )
            )
            continue
        missing = [
            k
            for k in keys
            if metric not in base.documents[k].values or metric not in quantized.documents[k].values
        ]
        if missing:
            problems.append(
                (metric, f"{len(missing)} documents have no per-document value (e.g. {missing[0]})")
            )
            continue
        b_vals = [float(base.documents[k].values[metric]) for k in keys]  # type: ignore[arg-type]
        q_vals = [float(quantized.documents[k].values[metric]) for k in keys]  # type: ignore[arg-type]
        num, den = (q_vals, b_vals) if direction else (b_vals, q_vals)
        gated.append(
            PairedMetric(
                metric,
                Paired.of(num, den, groups),
                _over(b, base, keys, metric),
                _over(q, quantized, keys, metric),
                direction,
                [],
            )
        )
    if log_family:
        name = LOG_SCALE_METRIC if LOG_SCALE_METRIC in log_family else log_family[0]
        b_nats = [nats(base.documents[k].values[name]) for k in keys]
        q_nats = [nats(quantized.documents[k].values[name]) for k in keys]
        split = {}  # the split's recovery where the task's size is known (paired.py module doc)
        if base.task_docs is not None:
            certain = set(base.take_all)
            split = {"certain": [k in certain for k in keys], "population": base.task_docs - len(certain)}
        gated.append(
            PairedMetric(
                name,
                Paired.of(b_nats, q_nats, groups, **split),
                _over(base.metrics[name], base, keys, name),
                _over(quantized.metrics[name], quantized, keys, name),
                False,
                [m for m in log_family if m != name],
            )
        )
    return gated, problems


def _over(result: MetricResult, run: TaskRun, keys: list[str], metric: str) -> MetricResult:
    """The metric over the paired documents only (the base scored all of them; the candidate may have
    stopped at an earlier look)."""
    value = aggregate([run.documents[k].values[metric] for k in keys], result.aggregation or "mean")
    return result.model_copy(update={"value": value})


def run_looks(gate: AccuracyGate, run: TaskRun) -> tuple[float, ...]:
    """The looks ``run`` planned, as fractions of its task's limit (a run recorded without them: the gate's,
    or one look where it planned one)."""
    return tuple(run.looks or (gate.looks if run.looks_planned > 1 else (1.0,)))


def look_design(gate: AccuracyGate, task: AccuracyTask, fractions: tuple[float, ...], metrics: int) -> Design:
    """The looks' bounds for a task that gates ``metrics`` metrics, at ``fractions`` of its limit: early
    rejections of a good candidate spend a fifth of the task's share of the miss budget, split over its
    metrics."""
    miss = 1 - gate.true_pass_share(task)
    return design(fractions, gate.rates(task).max_false_pass, 1 - miss / max(metrics, 1))


def task_decided(
    base: TaskRun, quantized: TaskRun, gate: AccuracyGate, task: AccuracyTask, look: int
) -> bool:
    """At look index ``look``: every metric passes already, or one is already rejected."""
    gated, problems = paired_metrics(base, quantized)
    if problems or not gated:
        return False  # let the run finish; compare_accuracy reports the problem
    rates = gate.rates(task)
    d = look_design(gate, task, run_looks(gate, quantized), len(gated))
    return task_verdict([m.pair for m in gated], d, look, rates.bad_recovery, rates.good_recovery).decided


def compare_accuracy(base: AccuracyRun, quantized: AccuracyRun, gate: AccuracyGate) -> list[AccuracyCheck]:
    """One check per gated task and metric. Anything missing is a failed check, never a skip.

    With ``gate.min_samples`` set, a task evaluated on fewer documents also gets a failed ``samples``
    check (:func:`check_samples`)."""
    checks: list[AccuracyCheck] = []
    # (check index, its task's point, the task's first check, its widest_bad but for docs, good and share)
    points: list[tuple[int, TaskPoint, bool, Callable[..., float | None]]] = []
    for task in gate.tasks:
        rates = gate.rates(task)
        b, q = base.tasks.get(task.task), quantized.tasks.get(task.task)
        if b is None or q is None:
            side = " and ".join(s for s, r in (("base", b), ("quantized", q)) if r is None)
            checks.append(
                AccuracyCheck(
                    task=task.task,
                    metric="*",
                    base=None,
                    quantized=None,
                    recovery=None,
                    threshold=rates.bad_recovery,
                    passed=False,
                    higher_is_better=None,
                    reason=f"the task has no results in the {side} run",
                )
            )
            continue
        gated, problems = paired_metrics(b, q)
        checks += [
            AccuracyCheck(
                task=task.task,
                metric=metric,
                base=_value(b, metric),
                quantized=_value(q, metric),
                recovery=None,
                threshold=rates.bad_recovery,
                passed=False,
                higher_is_better=None,
                reason=reason,
            )
            for metric, reason in problems
        ]
        look = max(q.looks_run - 1, 0)
        d = look_design(gate, task, run_looks(gate, q), len(gated))
        verdicts = [look_verdict(m.pair, d, look, rates.bad_recovery, rates.good_recovery) for m in gated]
        stopped_by = next((m.metric for m, v in zip(gated, verdicts) if v.decided and not v.passed), None)
        share = gate.true_pass_share(task)
        joint = task_point(gated, d, q, rates, share) if gated else None
        widen = functools.partial(widest_bad, gated, d, bad=rates.bad_recovery)
        for i, (m, verdict) in enumerate(zip(gated, verdicts)):
            check = check_metric(
                task.task,
                m,
                verdict.passed,
                rates,
                d,
                look,
                q,
                share=share,
                metrics=len(gated),
                undecided_because=None if verdict.decided else stopped_by,
            )
            if joint is not None:
                points.append((len(checks), joint, i == 0, widen))
            checks.append(check)
        if gate.min_samples is not None:
            samples = check_samples(
                task.task, b.num_docs, q.planned_docs or q.num_docs, gate.min_samples, rates.bad_recovery
            )
            if samples is not None:
                checks.append(samples)
    # a task short of its share warns only where the release falls short of its stated rate: a task's share
    # is the plan, and a task with room to spare carries one without
    tasks = {id(point): point for _, point, _, _ in points}
    short = len(tasks) < len(gate.tasks) or math.prod(p.true_pass for p in tasks.values()) < (
        gate.error_rates.min_true_pass
    )
    for index, point, first, widen in points:
        warns = first and short
        if warns and point.true_pass < point.share and not point.reachable:  # the remedy names the zone
            docs = point.task_docs or point.planned
            point = dataclasses.replace(point, widest_bad=widen(docs, point.good, share=point.share))
        checks[index] = point.on(checks[index], first=warns)
    return checks


@dataclass(frozen=True)
class TaskPoint:
    """What the gate achieves for one task's decision, every metric it gates together (docs/gates.md)."""

    true_pass: float  # the chance to pass a candidate at good_recovery on every metric
    share: float  # the task's planned share of the release's min_true_pass
    docs_needed: int | None  # documents the share needs at this noise (None: none up to MAX_DOCS)
    planned: int
    good: float
    task_docs: int | None = None  # the documents the task holds (None: not known)
    flip_rate: float | None = None  # the largest of its 0/1 metrics'
    # where the task cannot hold docs_needed: the highest bad_recovery whose share its task_docs reach
    widest_bad: float | None = None

    @property
    def reachable(self) -> bool:
        """Whether some limit this task can take reaches the share."""
        return self.docs_needed is not None and (self.task_docs is None or self.docs_needed <= self.task_docs)

    def remedy(self) -> str:
        if self.reachable:
            held = f" (it holds {self.task_docs})" if self.task_docs else ""
            lower = " (or state a lower min_true_pass)"
            return f"raise the task's limit to {self.docs_needed} documents{held}{lower}"
        noise = (
            f"{self.flip_rate:.1%} of documents flipped"
            if self.flip_rate is not None
            else "this paired noise"
        )
        have = f"its {self.task_docs} documents" if self.task_docs else "any number of documents"
        widen = (
            f"bad_recovery {self.widest_bad:g} reaches it on {have}"
            if self.widest_bad is not None
            else "no bad_recovery above 0 reaches it"
        )
        return (
            f"the task cannot show this rate: at {noise}, {have} are too few. Gate another task with more "
            f"documents, or state a wider indifference zone: {widen} (or state a lower min_true_pass)"
        )

    def on(self, check: AccuracyCheck, *, first: bool) -> AccuracyCheck:
        """``check`` with the task's figures; the first check of the task carries its warning."""
        update: dict = {
            "task_true_pass": self.true_pass,
            "task_share": self.share,
            "task_docs_needed": self.docs_needed,
        }
        if first and self.true_pass < self.share:
            update["warning"] = (
                f"{self.planned} documents at this paired noise pass a candidate at {self.good:g} on every "
                f"metric of the task only {self.true_pass:.1%} of the time, below the task's "
                f"{self.share:.1%} share of the release's stated true pass: {self.remedy()}"
            )
        return check.model_copy(update=update)


def metric_noise(pair: Paired, bad: float) -> tuple[float, float, float]:
    """What the operating point needs of a metric: its statistic's sd at bad (the hypothesis' variance),
    its denominator's mean, and the spread of num - bad den at the candidate's point (both clustered)."""
    return pair.score_sd(bad), float(pair.den.mean()), pair.sd_at(bad) * pair.design_effect(bad) ** 0.5


def task_noise(pairs: list[Paired], bad: float) -> tuple[list, np.ndarray | None]:
    """What task_operating_point needs of a task's metrics at ``bad``: each one's metric_noise, and the
    correlation of their statistics (None for one metric)."""
    return [metric_noise(p, bad) for p in pairs], correlation(pairs, bad) if len(pairs) > 1 else None


def widest_bad(
    gated: list[PairedMetric], d: Design, docs: int, good: float, bad: float, share: float
) -> float | None:
    """The highest bad_recovery (to 0.001, at most ``bad``) at which ``docs`` documents pass a candidate at
    ``good`` with the task's ``share``; None when none above 0 does."""

    def reaches(b: float) -> bool:
        noise, corr = task_noise([m.pair for m in gated], b)
        return task_true_pass(d, docs, noise, corr, bad=b, good=good) >= share

    lo, hi = 0.001, bad  # the true pass grows as bad falls (a wider zone): reaches(hi) is False here
    if not reaches(lo):
        return None
    while hi - lo > 0.0005:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if reaches(mid) else (lo, mid)
    return math.floor(lo * 1000) / 1000


def task_point(
    gated: list[PairedMetric], d: Design, quantized: TaskRun, rates: ErrorRates, share: float
) -> TaskPoint:
    """The task's joint rates: its metrics' statistics correlated as their per-document differences."""
    planned = round((quantized.planned_docs or gated[0].pair.docs) / d.fractions[-1])  # the limit's
    noise, corr = task_noise([m.pair for m in gated], rates.bad_recovery)
    good, bad = rates.good_recovery, rates.bad_recovery
    point = task_operating_point(d, planned, noise, corr, bad=bad, good=good, min_true_pass=share)
    flips = [m.pair.flip_rate for m in gated if m.pair.flip_rate is not None]
    return TaskPoint(
        point.true_pass,
        share,
        point.docs_needed,
        planned,
        good,
        quantized.task_docs,
        max(flips, default=None),
    )


def _value(run: TaskRun, metric: str) -> float | None:
    result = run.metrics.get(metric)
    return result.value if result else None


def check_metric(
    task: str,
    m: PairedMetric,
    passed: bool,
    rates: ErrorRates,
    d: Design,
    look: int,
    quantized: TaskRun,
    *,
    share: float,
    metrics: int = 1,
    undecided_because: str | None = None,
) -> AccuracyCheck:
    """The check of one paired metric, with the error rates this run's documents achieve for it alone
    (its documents needed: for its part, ``1/metrics``, of the task's miss budget ``1 - share``)."""
    pair = m.pair
    sd = pair.sd_at(1.0)
    planned = quantized.planned_docs or pair.docs
    point = task_operating_point(
        d,
        round(planned / d.fractions[-1]),  # the limit's
        [metric_noise(pair, rates.bad_recovery)],
        None,
        bad=rates.bad_recovery,
        good=rates.good_recovery,
        min_true_pass=1 - (1 - share) / metrics,
    )
    interval = pair.interval()
    interval = (float(interval[0]), float(interval[1])) if interval else None
    recovery = pair.recovery
    formula = (
        "quantized/base"
        if m.higher_is_better
        else "base/quantized nats (log scale)"
        if m.also or m.base.aggregation in LOG_AGGREGATIONS
        else "base/quantized (lower is better)"
    )
    line = f"{rates.bad_recovery:g} at {rates.max_false_pass:.0%} false pass"
    if undecided_because:
        passed = False
        verdict = f"undecided when {undecided_because} stopped the task"
    else:
        verdict = f"shown above {line}" if passed else f"not shown above {line}"
    reason = f"recovery {formula} = {format_recovery(recovery, interval)}: {verdict}"
    if m.also:
        reason += f" ({', '.join(m.also)}: the same measurement)"
    return AccuracyCheck(
        task=task,
        metric=m.metric,
        base=m.base.value,
        quantized=m.quantized.value,
        recovery=recovery,
        threshold=rates.bad_recovery,
        passed=passed,
        higher_is_better=m.higher_is_better,
        reason=reason,
        recovery_interval=interval,
        good_recovery=rates.good_recovery,
        max_false_pass=rates.max_false_pass,
        min_true_pass=rates.min_true_pass,
        docs=pair.docs,
        planned_docs=planned,
        look=look + 1,
        looks=len(d.fractions),
        flip_rate=pair.flip_rate,
        paired_sd=sd,
        false_pass=point.false_pass,
        true_pass=point.true_pass,
        docs_needed=point.docs_needed,
    )


def check_samples(
    task: str, base_docs: int | None, quantized_docs: int | None, min_samples: int, threshold: float
) -> AccuracyCheck | None:
    """The failed ``samples`` check of a task evaluated on fewer than ``min_samples`` documents
    (or on an unknown number); None when both runs saw enough."""
    counts = [n for n in (base_docs, quantized_docs) if n is not None]
    if len(counts) == 2 and min(counts) >= min_samples:
        return None
    if len(counts) < 2:
        reason = (
            f"lm-eval did not report how many documents task {task!r} was evaluated on, so "
            f"gates.accuracy.min_samples = {min_samples} cannot be checked. Fix: gate a task "
            "lm-eval counts (a single task rather than a group), or unset min_samples"
        )
    else:
        reason = (
            f"task {task!r} was evaluated on {min(counts)} documents, fewer than "
            f"gates.accuracy.min_samples = {min_samples}: too few to measure recovery. Fix: raise "
            f"the task's limit (gates.accuracy.tasks[].limit) to at least {min_samples}, or unset it "
            "to run the whole task; if the task has fewer documents, lower min_samples"
        )
    return AccuracyCheck(
        task=task,
        metric="samples",
        base=None,
        quantized=None,
        recovery=None,
        threshold=threshold,
        passed=False,
        higher_is_better=None,
        reason=reason,
    )
