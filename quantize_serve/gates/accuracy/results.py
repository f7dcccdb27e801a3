"""What the accuracy gate records: one run of lm-eval per server (per task, its metrics and every
document's outcome), and one check per task and metric of the candidate against the base."""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from quantize_serve.gates.accuracy.documents import DocOutcome


class MetricResult(BaseModel):
    value: float
    stderr: float | None = None
    higher_is_better: bool | None = None  # None: lm-eval did not say
    aggregation: str | None = None  # lm-eval's aggregation ("mean", "bits_per_byte"...); None: unknown


class TaskRun(BaseModel):
    """One task of the gate as lm-eval ran it."""

    task: str  # as written in the recipe: the key that pairs base and quantized runs
    lm_eval_name: str
    num_fewshot: int
    limit: int | float | None
    num_docs: int | None  # documents evaluated
    metrics: dict[str, MetricResult]
    seconds: float
    results_path: str  # lm-eval's raw results JSON (of the last look)
    # per document ("member/doc_id"), in the gate's seeded order: what paired recovery is computed on
    documents: dict[str, DocOutcome] = Field(default_factory=dict)
    planned_docs: int | None = None  # the documents the task's draw holds (all looks)
    task_docs: int | None = None  # the documents the task holds (its members' evaluation splits)
    # the documents scored with certainty, a perplexity's longest (documents.take_all); with task_docs, the
    # rest are a sample of the others
    take_all: list[str] = Field(default_factory=list)
    looks_run: int = 1  # looks evaluated before the decision was clear
    looks_planned: int = 1
    # the looks as fractions of the task's limit, past 1.0 where it continues (gates.accuracy.continue_to);
    # None: a run recorded before, its looks the gate's
    looks: list[float] | None = None


class ScoringCheck(BaseModel):
    """One context-once path checked against lm-eval's echo path before it carried a run
    (scoring.py ``_checked``)."""

    path: str  # "first": one-token choices from the context request; "rows": the generate route's rows
    checked: int  # requests scored both ways
    over_tolerance: int  # differing by more than bf16 noise (scoring.agrees), or not lined up
    disagreed: int  # of those, beyond spread_factor x the echo path's own spread, or not lined up
    not_lined_up: int = 0  # requests whose group's responses did not line up (scored the echo way)
    largest_nats: float = 0.0  # the largest |context-once - echo| over the checked requests
    first: str = ""  # the first disagreeing (else over-tolerance) request: "(-5.3928, False) against (...)"
    first_tokens: int = 0  # its continuation's tokens
    # nats a token the echo path itself moved, the same requests sent again one at a time (another batch
    # shape); None: not measured (nothing over tolerance, or only responses that did not line up)
    echo_spread: float | None = None
    spread_factor: float = 2.0
    kept: bool  # the path carried the run

    def line(self) -> str:
        """What the check found and did, in one line (the run's log, the report)."""
        what = f"context-once ({self.path}) {'kept' if self.kept else 'turned off'}: "
        if not self.over_tolerance:
            return what + f"all {self.checked} checked requests agreed with lm-eval's echo path"
        tail = "" if self.kept else "; the run scored these requests the echo way"
        if self.echo_spread is None:
            return what + f"{self.not_lined_up} of {self.checked} checked requests did not line up" + tail
        differed = self.over_tolerance if self.kept else self.disagreed
        spread = (
            f"{self.spread_factor:g}x the echo path's own spread ({self.echo_spread:.3f} nats a token when "
            "the same requests were sent again one at a time)"
        )
        what += (
            f"{differed} of {self.checked} checked requests differed from lm-eval's echo path by more than "
            f"bf16 noise (first: {self.first} over {self.first_tokens} tokens; largest "
            f"{self.largest_nats:.3f} nats)"
        )
        if self.kept:
            return what + f", within {spread}: the server's batch-dependent numerics, not a misread row"
        lined = f"; {self.not_lined_up} did not line up" if self.not_lined_up else ""
        return (
            what + f", beyond {spread}{lined}: not the server's noise but a misread row, a shifted context "
            "boundary or a different quantity" + tail
        )


class AccuracyRun(BaseModel):
    """Every task of one accuracy gate against one server."""

    server_base_url: str
    tasks: dict[str, TaskRun]
    seconds: float
    lm_eval_version: str
    scoring: str = "echo"  # gates.accuracy.scoring as run
    # vLLM's own count over the run (/metrics): prompt tokens sent, and those it computed (not read from its
    # prefix cache); None when the server does not expose them
    prompt_tokens: int | None = None
    prompt_tokens_computed: int | None = None
    # what went which way (scoring.py): context requests, requests scored context-once, echo...
    scoring_counts: dict[str, int] = Field(default_factory=dict)
    # each context-once path's check against the echo path (scoring.py), kept or turned off
    scoring_checks: list[ScoringCheck] = Field(default_factory=list)


class AccuracyCheck(BaseModel):
    """One gated metric of one task: quantized vs base, paired per document (docs/gates.md)."""

    task: str
    metric: str
    base: float | None
    quantized: float | None
    recovery: float | None
    threshold: float  # bad_recovery: the gate passes a candidate this bad at most max_false_pass of the time
    passed: bool
    higher_is_better: bool | None
    reason: str
    # ~95% paired interval on the recovery (the Fieller interval); None when unbounded or not computed
    recovery_interval: tuple[float, float] | None = None
    # set when this run could not reach the stated error rates (too few documents for the noise seen)
    warning: str = ""
    good_recovery: float | None = None
    max_false_pass: float | None = None
    min_true_pass: float | None = None
    docs: int | None = None  # documents paired
    planned_docs: int | None = None
    look: int | None = None  # the look the decision was taken at (1-based)
    looks: int | None = None
    flip_rate: float | None = None  # 0/1 metrics: share of documents whose outcome flipped
    paired_sd: float | None = None  # per-document sd of the paired difference at recovery 1
    false_pass: float | None = None  # achieved: the chance this run's design passes a candidate at threshold
    true_pass: float | None = None  # achieved: the chance it passes one at good_recovery
    docs_needed: int | None = None  # documents this metric alone needs for its part of the task's share
    # the task's decision, every metric it gates together (recovery.py TaskPoint): the chance to pass a
    # candidate at good_recovery on all of them, the task's share of the release's min_true_pass, and the
    # documents that share needs at this noise
    task_true_pass: float | None = None
    task_share: float | None = None
    task_docs_needed: int | None = None

    @property
    def recovery_text(self) -> str:
        """The recovery as the report, card and decision show it: ``0.9973 [0.981, 1.014]``."""
        return format_recovery(self.recovery, self.recovery_interval)

    @property
    def rates_text(self) -> str:
        """The error rates achieved: ``false pass 4.9% at 0.93, true pass 97.1% at 0.99``."""
        if self.false_pass is None or self.true_pass is None:
            return ""
        return (
            f"false pass {self.false_pass:.1%} at <= {self.threshold:g}, true pass {self.true_pass:.1%} "
            f"at >= {self.good_recovery:g}"
        )

    @property
    def docs_text(self) -> str:
        """``380 of 500 docs, look 3 of 4``."""
        if self.docs is None:
            return ""
        look = f", look {self.look} of {self.looks}" if self.looks and self.looks > 1 else ""
        return f"{self.docs} of {self.planned_docs or self.docs} docs{look}"


def release_rates(checks: list[AccuracyCheck]) -> str:
    """The release's decision in one line: the chance a candidate at good_recovery on every gated metric of
    every task passes (the product of the tasks', which score disjoint documents), against the stated
    rate; the false-pass side holds per task. Empty without the tasks' figures."""
    tasks: dict[str, AccuracyCheck] = {}
    for c in checks:
        if c.task_true_pass is not None:
            tasks.setdefault(c.task, c)
    if not tasks or any(c.task_true_pass is None for c in checks if c.recovery is not None):
        return ""
    true_pass = math.prod(c.task_true_pass or 0.0 for c in tasks.values())
    first = next(iter(tasks.values()))
    stated = first.min_true_pass or 0.0
    false_pass = max(c.false_pass or 0.0 for c in checks if c.task in tasks)
    # the tasks below their share, where the release falls short (recovery.compare_accuracy warns the same)
    short = (
        [t for t, c in tasks.items() if (c.task_true_pass or 0) < (c.task_share or 0)]
        if true_pass < stated
        else []
    )
    tail = f"; short of it: {', '.join(short)} (too few documents)" if short else ""
    return (
        f"The release: a candidate at >= its tasks' good recovery on every gated metric of the {len(tasks)} "
        f"task(s) passes {true_pass:.1%} of the time with these documents (stated >= {stated:.0%}{tail}); "
        f"one at <= a task's bad recovery on any metric of it passes at most {false_pass:.1%}."
    )


def format_recovery(recovery: float | None, interval: tuple[float, float] | None) -> str:
    """``0.9973 [0.981, 1.014]``; the point alone without an interval, ``n/a`` without a recovery."""
    if recovery is None:
        return "n/a"
    point = f"{recovery:.4f}"
    return point if interval is None else f"{point} [{interval[0]:.3f}, {interval[1]:.3f}]"


def scoring_notes(runs: dict[str, object]) -> list[str]:
    """The run report's lines on context-once scoring: each check that found more than bf16 noise, by run
    (``runs``: name -> its AccuracyRun, or what stopped it)."""
    return [
        f"{name}: {check.line()}"
        for name, run in runs.items()
        if isinstance(run, AccuracyRun)
        for check in run.scoring_checks
        if check.over_tolerance or not check.kept
    ]
