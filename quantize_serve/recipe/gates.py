"""The recipe's ``gates`` section: accuracy (tasks, stated error rates, looks), stress, soak, and the
regression gate against the release already in production."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from quantize_serve.core.errors import RecipeError, RecipeErrors
from quantize_serve.recipe.section import (
    DEFAULT_LOOKS,
    MIN_SAMPLES_RANGE,
    RECIPE_SOURCE,
    RECOVERY_RANGE,
    Section,
)


def _recovery_point(value: float | None) -> float | None:
    lo, hi = RECOVERY_RANGE
    if value is not None and not lo <= value <= hi:
        raise ValueError(
            f"must be between {lo} and {hi} (a true recovery, quantized / base). Fix: use "
            "e.g. 0.93 for bad_recovery and 0.99 for good_recovery"
        )
    return value


def _false_pass(value: float | None) -> float | None:
    if value is not None and not 0.001 <= value <= 0.25:
        raise ValueError(
            "must be between 0.001 and 0.25 (a probability of passing a bad release). Fix: use e.g. 0.05"
        )
    return value


def _true_pass(value: float | None) -> float | None:
    if value is not None and not 0.5 <= value <= 0.999:
        raise ValueError(
            "must be between 0.5 and 0.999 (a probability of passing a good release). Fix: use e.g. 0.95"
        )
    return value


class ErrorRates(Section):
    """The accuracy gate's promise for one task, as two operating points (docs/gates.md).

    A candidate whose true recovery (quantized / base, on the task's whole population of documents) is
    ``bad_recovery`` or less passes with probability at most ``max_false_pass``; one whose true
    recovery is ``good_recovery`` or more passes with probability at least ``min_true_pass`` when
    the task has the documents that need (the report says what each run achieved)."""

    bad_recovery: float = Field(
        default=0.93,
        description="A candidate at or below this true recovery is "
        "a bad release: it passes at most max_false_pass of the time.",
    )
    max_false_pass: float = Field(default=0.05, description="Largest chance to pass a bad release.")
    good_recovery: float = Field(
        default=0.99,
        description="A candidate at or above this true recovery is "
        "a good release: it passes at least min_true_pass of the time.",
    )
    min_true_pass: float = Field(
        default=0.95,
        description="Smallest chance to pass a good release, one at good_recovery on every gated metric "
        "of every task: each of the gate's T tasks is planned for min_true_pass^(1/T) (reached when the "
        "tasks have enough documents; the report warns if not).",
    )

    _points = field_validator("bad_recovery", "good_recovery")(_recovery_point)
    _false = field_validator("max_false_pass")(_false_pass)
    _true = field_validator("min_true_pass")(_true_pass)

    @model_validator(mode="after")
    def _ordered(self) -> ErrorRates:
        if self.good_recovery <= self.bad_recovery:
            raise ValueError(
                f"good_recovery ({self.good_recovery}) must be above bad_recovery "
                f"({self.bad_recovery}): no test tells two equal recoveries apart. Fix: e.g. "
                "bad_recovery 0.93, good_recovery 0.99"
            )
        return self


class ErrorRatesOverride(Section):
    """A task's own error rates; a field left out takes gates.accuracy.error_rates'."""

    bad_recovery: float | None = Field(default=None, description="Unset: the gate's.")
    max_false_pass: float | None = Field(default=None, description="Unset: the gate's.")
    good_recovery: float | None = Field(default=None, description="Unset: the gate's.")
    min_true_pass: float | None = Field(default=None, description="Unset: the gate's.")

    _points = field_validator("bad_recovery", "good_recovery")(_recovery_point)
    _false = field_validator("max_false_pass")(_false_pass)
    _true = field_validator("min_true_pass")(_true_pass)

    def over(self, defaults: ErrorRates) -> ErrorRates:
        return ErrorRates(**{**defaults.model_dump(), **self.model_dump(exclude_none=True)})


RETIRED_ACCURACY_FIELDS = {
    "default_recovery": "the gate no longer decides on a point recovery: it states its error rates. Fix: "
    "remove default_recovery; set gates.accuracy.error_rates (bad_recovery, "
    "max_false_pass, good_recovery, min_true_pass; defaults 0.93, 0.05, 0.99, 0.95). A "
    "point threshold t maps roughly to bad_recovery t - 0.02",
    "on_uncertain": "the paired test decides with its interval, so there is nothing left to warn about. Fix: "
    "remove on_uncertain; set gates.accuracy.error_rates.max_false_pass to say how sure the "
    "gate must be",
}


class AccuracyTask(Section):
    task: str = Field(description="lm-eval task name, or a path to a task YAML.")
    num_fewshot: int = Field(default=0, ge=0, description="Few-shot examples per document (lm-eval's).")
    limit: PositiveInt | float | None = Field(
        default=None,
        description="Docs per task (int or fraction; for a group such as mmlu, per member "
        "task). Drawn at random (seeded), not the first ones.",
    )
    error_rates: ErrorRatesOverride | None = Field(
        default=None, description="This task's error rates, over gates.accuracy.error_rates."
    )

    @model_validator(mode="before")
    @classmethod
    def _retired(cls, data: object) -> object:
        if isinstance(data, dict) and "recovery" in data:
            raise ValueError(
                f"recovery = {data['recovery']!r}: per-metric point thresholds are retired; the gate states "
                "its error rates. Fix: replace it with error_rates: {bad_recovery: <threshold - 0.02>} on "
                "this task (the stated rates apply to every metric of the task)"
            )
        return data

    @field_validator("limit")
    @classmethod
    def _limit(cls, value: int | float | None) -> int | float | None:
        if isinstance(value, float) and not 0 < value <= 1:
            raise ValueError(
                "a limit is a whole number of documents (at least 1) or a fraction of the "
                "task in (0, 1]. Fix: write e.g. 500 (documents) or 0.25 (a quarter)"
            )
        return value


class AccuracyGate(Section):
    tasks: list[AccuracyTask] = Field(
        default_factory=list, description="The lm-eval tasks the candidate is scored on against the base."
    )
    error_rates: ErrorRates = Field(
        default_factory=ErrorRates,
        description="The gate's stated error rates for every task (a task's "
        "error_rates overrides them). See docs/gates.md.",
    )
    looks: list[float] = Field(
        default_factory=lambda: list(DEFAULT_LOOKS),
        min_length=1,
        description="The planned looks, as "
        "fractions of each task's documents; the candidate's evaluation stops at the first look where "
        "every metric's decision is already clear. [1.0]: no early stop.",
    )
    continue_to: float = Field(
        default=1.0,
        ge=1.0,
        le=4.0,
        description="How far a candidate still undecided at a task's limit is scored on, as a multiple of "
        "the limit (capped at the documents the task holds): looks go on at the same spacing, under bounds "
        "that keep the stated rates over every look, so a borderline candidate is measured more instead of "
        "decided by chance at the limit. The base scores that many documents. 1.0: decide at the limit. "
        "See docs/gates.md.",
    )
    seed: int = Field(
        default=1234,
        ge=0,
        description="Seeds the random draw and order of each task's "
        "documents (and their few-shot examples): the same seed, the same documents.",
    )
    scoring: Literal["context-once", "echo"] = Field(
        default="context-once",
        description="How loglikelihood requests reach vLLM. context-once: each distinct context "
        "computed once (mmlu's four choices in one request; on vLLM's V2 model runner, multi-token "
        "choices over the cached context), each path checked against echo before it carries a run "
        "(gates/accuracy/scoring.py). echo: lm-eval's local-completions, one full prompt per choice.",
    )
    batch_size: PositiveInt = Field(default=8, description="lm-eval's batch size.")
    num_concurrent: PositiveInt | None = Field(
        default=None,
        description="lm-eval's concurrent requests to the server. Unset: the server's "
        "serve.max_num_seqs, so lm-eval keeps every sequence slot of the server busy (the scores do not "
        "depend on it; the time does).",
    )
    min_samples: int | None = Field(
        default=None,
        description="Fewest documents a task must be evaluated on; a task with fewer fails "
        f"the gate (raise its limit). Unset: no minimum. Between {MIN_SAMPLES_RANGE[0]} and "
        f"{MIN_SAMPLES_RANGE[1]}.",
    )

    @model_validator(mode="before")
    @classmethod
    def _retired(cls, data: object) -> object:
        if isinstance(data, dict):
            for name, why in RETIRED_ACCURACY_FIELDS.items():
                if name in data:
                    raise ValueError(f"{name} = {data[name]!r}: {why}")
        return data

    def rates(self, task: AccuracyTask) -> ErrorRates:
        """The error rates stated for ``task``."""
        return task.error_rates.over(self.error_rates) if task.error_rates else self.error_rates

    def task_looks(self, room: float) -> tuple[float, ...]:
        """A task's looks as fractions of its limit: the planned ones, then, where ``continue_to`` and the
        task's ``room`` (the documents it holds over its limit's) allow, more at the same spacing up to
        the smaller of the two."""
        looks, last = list(self.looks), min(self.continue_to, room)
        step = min(b - a for a, b in zip([0.0, *looks], looks))
        while last > 1.0 and looks[-1] + step < last - 1e-9:
            looks.append(round(looks[-1] + step, 6))
        if last > looks[-1] + 1e-9:
            looks.append(round(last, 6))
        return tuple(looks)

    def true_pass_share(self, task: AccuracyTask) -> float:
        """The true-pass rate ``task`` is planned for: its share of the release's min_true_pass (every task
        must pass, on disjoint documents: the release's rate is the product of the tasks')."""
        return self.rates(task).min_true_pass ** (1 / len(self.tasks))

    @field_validator("looks")
    @classmethod
    def _looks(cls, value: list[float]) -> list[float]:
        if not all(a < b for a, b in zip([0.0, *value], value)) or value[-1] != 1.0 or len(value) > 10:
            raise ValueError(
                f"{value}: looks are increasing fractions of the documents in (0, 1], the last "
                "one 1.0, at most 10. Fix: e.g. [0.25, 0.5, 0.75, 1.0], or [1.0] for no early stop"
            )
        return value

    @field_validator("min_samples")
    @classmethod
    def _min_samples(cls, value: int | None) -> int | None:
        lo, hi = MIN_SAMPLES_RANGE
        if value is not None and not lo <= value <= hi:
            raise ValueError(
                f"must be between {lo} and {hi} documents per task (or unset for no minimum). Fix: use "
                "e.g. 200; the recovery interval narrows with the square root of the documents evaluated"
            )
        return value

    @model_validator(mode="after")
    def _task_rates_ordered(self) -> AccuracyGate:
        """A task's override merged over the gate's rates must still be a pair of ordered points."""
        problems = []
        for i, t in enumerate(self.tasks):
            if t.error_rates is None:
                continue
            merged = {**self.error_rates.model_dump(), **t.error_rates.model_dump(exclude_none=True)}
            if merged["good_recovery"] <= merged["bad_recovery"]:
                problems.append(
                    RecipeError(
                        RECIPE_SOURCE,
                        f"gates.accuracy.tasks.{i}.error_rates",
                        t.error_rates.model_dump(exclude_none=True),
                        f"gives good_recovery {merged['good_recovery']} not above bad_recovery "
                        f"{merged['bad_recovery']} (with gates.accuracy.error_rates)",
                        "state a good_recovery above the bad_recovery",
                    )
                )
        if problems:
            raise RecipeErrors(problems)
        return self

    @model_validator(mode="after")
    def _limits_reach_min_samples(self) -> AccuracyGate:
        """A whole-number limit below min_samples would fail the gate on every run: say so at load."""
        if self.min_samples is None:
            return self
        problems = [
            RecipeError(
                RECIPE_SOURCE,
                f"gates.accuracy.tasks.{i}.limit",
                t.limit,
                f"evaluates {t.limit} documents, fewer than gates.accuracy.min_samples "
                f"({self.min_samples}), so the accuracy gate would fail on every run",
                f"raise the limit to at least {self.min_samples} (or unset it: the whole task), "
                "or lower gates.accuracy.min_samples",
            )
            for i, t in enumerate(self.tasks)
            if isinstance(t.limit, int) and t.limit < self.min_samples
        ]
        if problems:
            raise RecipeErrors(problems)
        return self


class StressGate(Section):
    """The batched traffic the release promises to survive."""

    concurrency: PositiveInt | None = Field(
        default=None, description="Target concurrency; defaults to serve.max_num_seqs."
    )
    num_requests: PositiveInt = Field(default=64, description="Valid requests sent.")
    max_duration_s: float = Field(default=600, gt=0, description="Longest the traffic may take.")
    prompt_tokens: list[PositiveInt] = Field(
        default_factory=lambda: [32, 128, 512], description="Prompt sizes, each sent with every output size."
    )
    output_tokens: list[PositiveInt] = Field(
        default_factory=lambda: [16, 64, 128], description="Output sizes (max_tokens, with ignore_eos)."
    )
    long_prompt_share: float = Field(
        default=0.1, ge=0, le=1, description="Share of requests whose prompt + output fills max_model_len."
    )
    overlong_prompts: int = Field(
        default=2, ge=0, description="Prompts over max_model_len that must get a clean HTTP 400."
    )
    max_preemptions: int = Field(
        default=0, ge=0, description="Preemptions (vllm:num_preemptions_total) allowed."
    )
    request_timeout_s: float = Field(default=120, gt=0, description="Seconds one request may take.")


# gates.soak bounds: (lowest, highest, why). Inclusive; the message names the field, value and range.
SOAK_BOUNDS: dict[str, tuple[float, float, str]] = {
    "duration_s": (
        10,
        86_400,
        "a shorter soak cannot tell a leak from allocator noise; a longer one is "
        "production monitoring, not a release gate",
    ),
    "warmup_s": (0, 86_400, "the start left out of the trend while pools, caches and kernels settle"),
    "sample_interval_s": (
        0.2,
        600,
        "each sample reads /health, /metrics and the process tree, so faster "
        "sampling measures the sampler; slower leaves too few points to fit",
    ),
    "concurrency": (1, 4_096, "requests kept in flight the whole time"),
    "max_memory_growth_mib_per_min": (
        0.1,
        10_240,
        "below 0.1 MiB/min is allocator noise; above 10 GiB/min "
        "a leak kills the server before any trend is needed",
    ),
    "max_preemptions_after_warmup": (0, 1_000_000, "a count of preemptions"),
    "request_timeout_s": (1, 3_600, "seconds one request may take"),
}
MIN_SOAK_SAMPLES = 5  # samples after warm-up that a memory trend is fitted to; fewer fit noise


class SoakGate(Section):
    """gates.soak: sustained traffic for a long time against the production boot (off when absent).

    Catches the failure that comes hours into production: memory that keeps growing (RSS of the
    server's process tree; GPU memory through NVML on GPU hosts) and a scheduler that keeps
    preempting after warm-up. See quantize_serve/gates/soak.py. Prompts come from the stress test's
    generator; their sizes default to gates.stress's.
    """

    duration_s: float = Field(default=3600, description="How long the sustained traffic runs.")
    warmup_s: float = Field(
        default=300,
        description="The start left out of the memory trend and the "
        "preemption count (allocator pools, caches and kernels settle).",
    )
    sample_interval_s: float = Field(
        default=10, description="Seconds between samples of /metrics, RSS and GPU memory."
    )
    concurrency: int | None = Field(
        default=None, description="Requests in flight the whole time; defaults to serve.max_num_seqs."
    )
    prompt_tokens: list[PositiveInt] | None = Field(
        default=None,
        min_length=1,
        description="Prompt sizes drawn from; defaults to gates.stress.prompt_tokens.",
    )
    output_tokens: list[PositiveInt] | None = Field(
        default=None,
        min_length=1,
        description="Output sizes drawn from; defaults to gates.stress.output_tokens.",
    )
    max_memory_growth_mib_per_min: float = Field(
        default=10,
        description="Largest allowed least-squares "
        "slope of memory after warm-up (RSS, and GPU memory where "
        "NVML sees it); 10 MiB/min is 0.6 GiB an hour.",
    )
    max_preemptions_after_warmup: int = Field(
        default=0, description="Preemptions (vllm:num_preemptions_total) allowed after warm-up."
    )
    request_timeout_s: float = Field(default=120, description="Seconds one request may take.")

    @field_validator(*SOAK_BOUNDS)
    @classmethod
    def _in_bounds(cls, value: float | None, info: ValidationInfo) -> float | None:
        lo, hi, why = SOAK_BOUNDS[info.field_name]
        if value is not None and not lo <= value <= hi:
            raise ValueError(
                f"must be between {lo:g} and {hi:g} ({why}); set gates.soak.{info.field_name} "
                "inside that range"
            )
        return value

    @model_validator(mode="after")
    def _enough_samples(self) -> SoakGate:
        if self.warmup_s >= self.duration_s:
            raise ValueError(
                f"gates.soak.warmup_s ({self.warmup_s:g}) is not below gates.soak.duration_s "
                f"({self.duration_s:g}), so nothing would be measured; lower warmup_s or raise "
                "duration_s"
            )
        samples = int((self.duration_s - self.warmup_s) / self.sample_interval_s)
        if samples < MIN_SOAK_SAMPLES:
            raise ValueError(
                f"gates.soak gives {samples} sample(s) after warm-up ((duration_s {self.duration_s:g}"
                f" - warmup_s {self.warmup_s:g}) / sample_interval_s {self.sample_interval_s:g}); "
                f"a memory trend needs at least {MIN_SOAK_SAMPLES}: raise duration_s or lower "
                "warmup_s or sample_interval_s"
            )
        return self


# gates.regression bounds: (lowest, highest, why); inclusive.
REGRESSION_BOUNDS: dict[str, tuple[float, float, str]] = {
    "max_accuracy_drop": (
        0.0,
        0.5,
        "a fraction of production's score (0.02 = 2%); above half the score the gate would pass anything",
    ),
    "min_capacity_ratio": (
        0.1,
        2.0,
        "candidate / production KV tokens and max concurrency; 1.0 = no "
        "fewer concurrent requests than production serves",
    ),
    "min_throughput_ratio": (
        0.1,
        2.0,
        "candidate / production output tokens per second at the stress "
        "concurrency; throughput is noisy, so leave some room below 1.0",
    ),
}


class RegressionGate(Section):
    """gates.regression: the candidate against the release the release ref (hub.release_ref) serves now.

    On by default. It applies when hub.release_ref already points at a gated commit of the repo: the
    candidate must then be no worse than that release, on every metric of the accuracy gate, on KV
    tokens and max concurrency, and on throughput at the stress concurrency. The release's results are
    the ones recorded with it on the Hub (release-results.json) when they were measured under the same
    conditions (tasks, vLLM version, hardware, serve settings, stress profile); otherwise the release is
    served again in this run, with this recipe's settings. A candidate whose throughput falls below
    min_throughput_ratio of the recorded figure is compared with production's throughput measured again
    in this run (a slower host is no regression). With no release yet (a first release, or no
    hub section) the gate is off and the report says so. See quantize_serve/gates/regression.py.
    """

    enabled: bool = Field(
        default=True,
        description="Compare with the release in production (when there "
        "is one). false: compare with the base model only.",
    )
    max_accuracy_drop: float = Field(
        default=0.02,
        description="Largest drop of any accuracy metric against production, as a fraction "
        "of production's score (lower-is-better metrics such as perplexity: a rise of that fraction). "
        "0.02: at most 2% worse on every metric; 0: no worse at all.",
    )
    metric_max_drop: dict[str, float] = Field(
        default_factory=dict,
        description="Per-metric overrides of max_accuracy_drop, by metric name as "
        "lm-eval reports it (e.g. {word_perplexity: 0.03}).",
    )
    min_capacity_ratio: float = Field(
        default=1.0,
        description="Smallest candidate / production ratio of KV tokens and of max "
        "concurrency at max_model_len (the production boot of each). 1.0: no fewer tokens or requests.",
    )
    min_throughput_ratio: float | None = Field(
        default=0.8,
        description="Smallest candidate / production ratio of output tokens per second at the "
        "stress concurrency (vllm bench serve during the stress test). 0.8: at most 20% slower; two runs of "
        "one checkpoint differed by up to ~13% on an H200, so a tighter limit rejects equal releases. null: "
        "throughput is not compared, for a host where it is noise (a CPU shared with other work: two runs "
        "differed 4x on a 2-core machine running two test lanes).",
    )

    @field_validator(*REGRESSION_BOUNDS)
    @classmethod
    def _in_bounds(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is None and info.field_name == "min_throughput_ratio":
            return None  # not compared
        lo, hi, why = REGRESSION_BOUNDS[info.field_name]
        if not lo <= value <= hi:
            raise ValueError(
                f"must be between {lo:g} and {hi:g} ({why}); set gates.regression.{info.field_name} "
                "inside that range"
            )
        return value

    @field_validator("metric_max_drop")
    @classmethod
    def _metric_drops(cls, value: dict[str, float]) -> dict[str, float]:
        lo, hi, why = REGRESSION_BOUNDS["max_accuracy_drop"]
        bad = {k: v for k, v in value.items() if not lo <= v <= hi}
        if bad:
            raise ValueError(f"{bad}: each drop must be between {lo:g} and {hi:g} ({why}); fix those entries")
        return value

    def max_drop(self, metric: str) -> float:
        return self.metric_max_drop.get(metric, self.max_accuracy_drop)


class GatesSection(Section):
    accuracy: AccuracyGate = Field(default_factory=AccuracyGate)
    stress: StressGate = Field(default_factory=StressGate)
    regression: RegressionGate = Field(
        default_factory=RegressionGate,
        description="The candidate against the release in production "
        "(hub.release_ref); on by default, off while no release exists (quantize_serve/gates/regression.py).",
    )
    soak: SoakGate | None = Field(
        default=None,
        description="Sustained-traffic memory and preemption "
        "gate on the production boot (quantize_serve/gates/soak.py); off when absent.",
    )
