"""What the accuracy gate records: one run of lm-eval per server (per task, its metrics and every
document's outcome), and one check per task and metric of the candidate against the base."""

from __future__ import annotations

from pydantic import BaseModel, Field

from quantize_serve.gates.documents import DocOutcome


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
    looks_run: int = 1  # looks evaluated before the decision was clear
    looks_planned: int = 1


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
    # what went which way (gates/scoring.py): context requests, requests scored context-once, echo...
    scoring_counts: dict[str, int] = Field(default_factory=dict)


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
    docs_needed: int | None = None  # documents the stated min_true_pass needs at this noise

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


def format_recovery(recovery: float | None, interval: tuple[float, float] | None) -> str:
    """``0.9973 [0.981, 1.014]``; the point alone without an interval, ``n/a`` without a recovery."""
    if recovery is None:
        return "n/a"
    point = f"{recovery:.4f}"
    return point if interval is None else f"{point} [{interval[0]:.3f}, {interval[1]:.3f}]"
