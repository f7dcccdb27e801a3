"""The recipe: one typed description of a release, loaded and validated once, before heavy work.

A YAML file becomes a pydantic ``Recipe`` with ``extra="forbid"`` everywhere, so a misspelled key
fails at load time (llm-compressor's own recipes work the same way). Every rule that needs only the
recipe runs at load: rules inside one section in that section's validators, rules that span sections
in ONE model validator on ``Recipe`` (:func:`cross_section_problems`). Checks that need to look at
files (the model's ``config.json``, the calibration data) are :func:`check_model` and
:func:`check_calibration_rows`; they read small files only and never load weights.

Relative paths in a recipe file are resolved against the recipe file's folder, so a recipe means
the same thing whatever the working directory is.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import string
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from quantize_serve.errors import RecipeError, RecipeErrors

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# Flags the server wrapper owns; a recipe's extra_args must not fight over them.
RESERVED_VLLM_FLAGS = (
    "--model", "--host", "--port", "--served-model-name", "--max-model-len",
    "--gpu-memory-utilization", "--kv-cache-dtype", "--max-num-seqs", "--tensor-parallel-size",
    "--max-num-batched-tokens", "--kv-cache-memory-bytes", "--dtype", "--enforce-eager",
)
# Validators do not know the file name; parse_recipe puts it in.
RECIPE_SOURCE = "<recipe>"
# The stress test's long requests are prompt + output = max_model_len - this many tokens
# (quantize_serve.stress uses this constant).
LONG_PROMPT_MARGIN = 4
# Placeholders hub.commit_message may use (quantize_serve/release.py fills exactly these).
COMMIT_MESSAGE_FIELDS = ("method", "scheme", "base_model", "base_revision")
# Refs the pipeline owns on the Hub (quantize_serve/hub.py): every candidate is committed to the
# branch `main`, every rejection is tagged `rejected-<sha>`. The release ref may be neither.
CANDIDATE_BRANCH = "main"
REJECTION_TAG_PREFIX = "rejected-"
# A tag or branch name git (and so the Hub) accepts: no spaces or ~^:?*[\, no "..", "//" or "@{",
# not starting with "-" or "/", not ending with "/", "." or ".lock".
GIT_REF_NAME = re.compile(r"^(?![-/])(?!.*(?:\.\.|//|@\{))[A-Za-z0-9._/@+-]+(?<![/.])(?<!\.lock)$")
# Accuracy thresholds are ratios quantized / base (see quantize_serve/accuracy.py).
# default_recovery in [0.5, 1.0]: above 1.0 every metric would have to improve after quantization,
# which rejects sound releases; below 0.5 the gate passes a model that lost half its score.
DEFAULT_RECOVERY_RANGE = (0.5, 1.0)
# A per-metric override may exceed 1.0 a little (a noisy metric, or a deliberately strict check),
# never by more than 25 %: no quantized model beats its base by that much, so the gate could not pass.
METRIC_RECOVERY_MAX = 1.25
# gates.accuracy.min_samples: documents per task (inclusive).
MIN_SAMPLES_RANGE = (1, 10_000_000)
# The profile search brackets then bisects: 20 boots resolve any max_num_seqs range a GPU can hold
# (2^10 = 1,024 values in about 10 bisection steps plus bracketing). Each boot is a vLLM start plus
# a stress test, minutes on a GPU, so a larger budget is a typo, not a plan.
MAX_SEARCH_BOOTS = 20


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(Section):
    """The base model: a local folder or a Hub repo id (pinned to a commit at run time)."""

    id: str = Field(description="Local folder (e.g. ../models/tiny-llama) or Hub repo id (org/name).")
    revision: str | None = Field(default=None, description="Hub branch, tag or commit sha.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    trust_remote_code: bool = False


class CalibrationSection(Section):
    """Calibration data: a Hub dataset id or local json/jsonl/csv/parquet/text file(s)."""

    dataset: str = Field(description="Hub dataset id, or a local file / list of files.")
    files: list[str] = Field(default_factory=list, description="More local files, same format.")
    subset: str | None = Field(default=None, description="Hub dataset configuration name.")
    split: str = "train"
    text_field: str | None = Field(default=None, description="Column holding plain text.")
    messages_field: str | None = Field(
        default=None, description="Column holding chat messages, rendered with the chat template."
    )
    num_samples: PositiveInt = 256
    max_seq_len: PositiveInt = 2048
    shuffle_seed: int = 42
    batch_size: PositiveInt = Field(
        default=1,
        description="Calibration batch size (llm-compressor's; batches are truncated to their "
        "shortest sample, so keep it small unless samples have similar lengths).",
    )

    @model_validator(mode="after")
    def _one_field(self) -> CalibrationSection:
        if (self.text_field is None) == (self.messages_field is None):
            raise ValueError(
                "set exactly one of calibration.text_field (plain text column) or "
                "calibration.messages_field (chat messages column)"
            )
        return self


# quantization.scheme -> the methods that make it (llm-compressor modifiers, quantize.py):
# awq/gptq: 4-bit weights; rtn: llm-compressor's QuantizationModifier alone (round to nearest, no
# calibration of the weights: FP8_DYNAMIC); smoothquant-gptq: SmoothQuant then GPTQ (INT8 W8A8).
SCHEME_METHODS = {
    "W4A16": ("awq", "gptq"),
    "W4A16_ASYM": ("awq", "gptq"),
    "W8A8": ("smoothquant-gptq", "gptq"),
    "FP8_DYNAMIC": ("rtn",),
}
Method = Literal["awq", "gptq", "smoothquant-gptq", "rtn"]
Scheme = Literal["W4A16", "W4A16_ASYM", "W8A8", "FP8_DYNAMIC"]


def scheme_method_problem(method: str | None, scheme: str) -> str | None:
    """Why ``method`` cannot make ``scheme`` (with the fix), or None."""
    allowed = SCHEME_METHODS[scheme]
    if method is None or method in allowed:
        return None
    makes = sorted(s for s, methods in SCHEME_METHODS.items() if method in methods)
    return (f"method {method!r} does not make scheme {scheme!r} (it makes {', '.join(makes)}). Fix: use "
            f"method {' or '.join(repr(m) for m in allowed)} for {scheme}, or another scheme")


def even_group_size(value: int | None) -> int | None:
    if value is not None and value % 2:
        raise ValueError("must be even (vLLM's int4 kernels need an even group size). Fix: use an "
                         "even group size that divides the model's layer widths, e.g. 128")
    return value


class Candidate(Section):
    """One release format to compare (quantization.candidates): a scheme and the method that makes
    it, or an already-quantized checkpoint (AutoAWQ ``awq``, ``gptq`` or compressed-tensors format)
    validated as it is. Fields left out come from the quantization section."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$", description="Lowercase, digits, dashes.")
    method: Method | None = None
    scheme: Scheme | None = None
    group_size: PositiveInt | None = None
    checkpoint: str | None = Field(default=None, description="Local folder or Hub repo id of a quantized "
                                   "checkpoint of the recipe's base model.")
    revision: str | None = Field(default=None, description="Hub branch, tag or commit of `checkpoint`.")

    @field_validator("group_size")
    @classmethod
    def _even_group(cls, value: int | None) -> int | None:
        return even_group_size(value)

    @model_validator(mode="after")
    def _one_source(self) -> Candidate:
        if (self.method is None) == (self.checkpoint is None):
            raise ValueError(f"candidate {self.name!r}: set exactly one of method (quantize the base model) "
                             "or checkpoint (an already-quantized checkpoint)")
        if self.checkpoint is not None and (self.scheme or self.group_size):
            raise ValueError(f"candidate {self.name!r}: a checkpoint's scheme and group size are read from "
                             "its config.json; remove scheme/group_size")
        if self.revision is not None and self.checkpoint is None:
            raise ValueError(f"candidate {self.name!r}: revision applies to a checkpoint only; remove it")
        return self


class FormatRule(Section):
    """quantization.choose: how the release is chosen among the candidates that pass every gate
    (quantize_serve/formats.py). Throughput is measured with `vllm bench serve` (random prompts that
    never repeat, so prefix caching cannot flatter a format) at ``concurrency``."""

    rule: Literal["kv_capacity", "throughput"] = Field(
        default="kv_capacity", description="kv_capacity: the most KV-cache tokens; throughput: the most "
        "output tokens/s at `concurrency`, within the TTFT/TPOT limits.")
    concurrency: PositiveInt | None = Field(default=None, description="Default: serve.max_num_seqs.")
    input_tokens: PositiveInt | None = Field(default=None, description="Default: the stress profile's mean.")
    output_tokens: PositiveInt | None = Field(default=None, description="Default: the stress profile's mean.")
    num_prompts: PositiveInt | None = Field(default=None, description="Per run. Default: 4 x concurrency.")
    repeats: int = Field(default=2, ge=1, le=10, description="Runs per candidate (the spread is the noise).")
    max_p99_ttft_ms: float | None = Field(default=None, gt=0, description="SLO: p99 time to first token.")
    max_mean_tpot_ms: float | None = Field(default=None, gt=0, description="SLO: mean time per output token.")

    @model_validator(mode="after")
    def _slo_for_throughput(self) -> FormatRule:
        if self.rule == "throughput" and self.max_p99_ttft_ms is None and self.max_mean_tpot_ms is None:
            raise ValueError("rule 'throughput' chooses the most throughput under a latency limit: set "
                             "quantization.choose.max_p99_ttft_ms and/or max_mean_tpot_ms (or use rule "
                             "'kv_capacity')")
        return self


class QuantizationSection(Section):
    """Maps onto llm-compressor modifiers; ``llmcompressor_recipe`` takes a raw recipe instead.

    One of: ``method`` (+ ``scheme``) quantizes the base model; ``checkpoint`` validates an
    already-quantized one; ``candidates`` compares several and releases the best (``choose``)."""

    method: Method | None = None
    scheme: Scheme = "W4A16"
    group_size: PositiveInt = 128
    targets: list[str] = Field(default_factory=lambda: ["Linear"])
    ignore: list[str] = Field(default_factory=lambda: ["lm_head"])
    kv_cache_scales: bool = Field(
        default=False,
        description="Calibrate static fp8 KV-cache scales into the checkpoint (vLLM uses 1.0 without).",
    )
    dampening_frac: float = Field(default=0.01, gt=0, lt=1, description="GPTQ only.")
    smoothing_strength: float = Field(default=0.8, gt=0, lt=1, description="smoothquant-gptq only (SmoothQuant alpha).")
    checkpoint: str | None = Field(default=None, description="An already-quantized checkpoint (local folder "
                                   "or Hub repo id) of the base model, validated without re-quantizing.")
    checkpoint_revision: str | None = None
    candidates: list[Candidate] = Field(default_factory=list, description="Formats to compare; the release "
                                        "is the best that passes every gate (see choose).")
    choose: FormatRule | None = Field(default=None, description="With candidates: the rule that picks the "
                                      "release (default: most KV capacity).")
    llmcompressor_recipe: str | dict[str, Any] | list[Any] | None = Field(
        default=None,
        description="Escape hatch: a raw llm-compressor recipe (YAML text, a path, or a mapping) "
        "that runs instead of the one built from the fields above.",
    )

    @field_validator("group_size")
    @classmethod
    def _even_group(cls, value: int | None) -> int | None:
        return even_group_size(value)

    @model_validator(mode="after")
    def _one_source(self) -> QuantizationSection:
        given = [k for k in ("method", "checkpoint", "candidates") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(
                ("sets " + " and ".join(given) if given else "names no quantization") + ". Fix: set exactly one "
                "of quantization.method (quantize the base model, e.g. method: awq), quantization.checkpoint "
                "(validate an already-quantized checkpoint) or quantization.candidates (compare formats)")
        problem = scheme_method_problem(self.method, self.scheme)
        if problem:
            raise ValueError(problem)
        names = [c.name for c in self.candidates]
        if len(set(names)) != len(names):
            raise ValueError(f"candidate names repeat ({names}); give each candidate its own name")
        for c in self.candidates:
            problem = scheme_method_problem(c.method, c.scheme or self.scheme)
            if problem:
                raise ValueError(f"candidate {c.name!r}: {problem}")
        if self.candidates and self.llmcompressor_recipe is not None:
            raise ValueError("llmcompressor_recipe replaces the recipe of a single method; it cannot "
                             "apply to several candidates. Fix: remove it, or remove candidates")
        if self.choose is not None and not self.candidates:
            raise ValueError("choose picks among candidates; add quantization.candidates or remove choose")
        return self

    def candidate(self, name: str) -> QuantizationSection:
        """The section that makes one candidate alone (what the flow continues with once chosen)."""
        c = next((c for c in self.candidates if c.name == name), None)
        if c is None:
            raise KeyError(f"no candidate named {name!r} (candidates: {[c.name for c in self.candidates]})")
        shared = self.model_dump(exclude={"candidates", "choose", "method", "checkpoint", "checkpoint_revision"})
        if c.checkpoint is not None:
            return QuantizationSection(**shared, checkpoint=c.checkpoint, checkpoint_revision=c.revision)
        own = {"method": c.method, "scheme": c.scheme or self.scheme,
               **({"group_size": c.group_size} if c.group_size else {})}
        return QuantizationSection(**{**shared, **own})

    @property
    def rule(self) -> FormatRule:
        return self.choose or FormatRule()


class ProfileSearch(Section):
    """serve.search: find the largest max_num_seqs the stress profile survives, with real boots.

    See quantize_serve/profile_search.py: it starts at the planner's recommendation, brackets
    (grows or shrinks) and bisects until the largest passing and the smallest failing value are at
    most ``step`` apart, or ``max_boots`` boots are spent.
    """

    enabled: bool = True
    max_boots: PositiveInt = Field(default=6, description="vLLM boots the max_num_seqs search may spend "
                                   f"(at most {MAX_SEARCH_BOOTS}).")
    min_num_seqs: PositiveInt = Field(default=1, description="Lower end of the searched range.")
    max_num_seqs: PositiveInt | None = Field(
        default=None,
        description="Upper end of the searched range; default: the planner's max concurrency "
        "(KV tokens / max_model_len).",
    )
    step: PositiveInt = Field(
        default=4, description="Search resolution in sequences: the search stops when the largest "
        "passing and the smallest failing max_num_seqs are at most this far apart.",
    )
    max_model_len_search: bool = Field(
        default=False,
        description="Then search the largest max_model_len at the found max_num_seqs (its own "
        "max_boots; resolution: one KV block).",
    )

    @field_validator("max_boots")
    @classmethod
    def _max_boots(cls, value: int) -> int:
        if value > MAX_SEARCH_BOOTS:
            raise ValueError(
                f"is more than {MAX_SEARCH_BOOTS}: each boot is a vLLM start plus a stress test (minutes on a "
                f"GPU), and {MAX_SEARCH_BOOTS} already bisect any max_num_seqs range to one sequence. Fix: "
                f"use at most {MAX_SEARCH_BOOTS} (6 is the default), or narrow min_num_seqs..max_num_seqs")
        return value

    @model_validator(mode="after")
    def _range(self) -> ProfileSearch:
        if self.max_num_seqs is not None and self.max_num_seqs < self.min_num_seqs:
            raise ValueError(
                f"serve.search.max_num_seqs ({self.max_num_seqs}) is below serve.search.min_num_seqs "
                f"({self.min_num_seqs}); raise max_num_seqs or lower min_num_seqs"
            )
        return self


class ServeSection(Section):
    """How vLLM serves the model: the production settings the gates prove."""

    max_model_len: PositiveInt = 4096
    gpu_memory_utilization: float = Field(default=0.90, gt=0, le=1)
    max_num_seqs: PositiveInt = 256
    max_num_batched_tokens: PositiveInt | None = None
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "fp8"
    tensor_parallel_size: PositiveInt = 1
    enforce_eager: bool = False
    dtype: Literal["auto", "bfloat16", "float16"] = "auto"
    memory_budget: ByteSize | None = Field(
        default=None,
        description="CPU runs: device memory the compared configurations share; each gets "
        "KV cache = budget - its weights (what a GPU does with gpu_memory_utilization).",
    )
    extra_args: list[str] = Field(default_factory=list, description="More vLLM server flags.")
    search: ProfileSearch | None = Field(
        default=None, description="Search the largest stable max_num_seqs with real boots "
        "(quantize_serve/profile_search.py); off when absent.",
    )
    preflight: Literal["off", "measure"] = Field(
        default="off", description="measure: before the base model's weights are downloaded, boot its "
        "shape with dummy weights (config.json and tokenizer only) in the three configurations, and stop "
        "the run with vLLM's reason when the production configuration does not fit "
        "(quantize_serve/shape_capacity.py). `quantize-serve plan RECIPE --measure` does the same alone.",
    )

    @field_validator("extra_args")
    @classmethod
    def _no_reserved(cls, args: list[str]) -> list[str]:
        for arg in args:
            flag = arg.split("=", 1)[0].replace("_", "-")
            if flag in RESERVED_VLLM_FLAGS:
                raise ValueError(
                    f"{flag} is set by its own serve.* field; remove it from extra_args and set "
                    f"serve.{flag[2:].replace('-', '_')} instead"
                )
        return args

    @model_validator(mode="after")
    def _batched_tokens(self) -> ServeSection:
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"serve.max_num_batched_tokens ({self.max_num_batched_tokens}) is below "
                f"serve.max_num_seqs ({self.max_num_seqs}); raise it or lower max_num_seqs"
            )
        return self


def _metric_recovery(value: float) -> float:
    if not 0 < value <= METRIC_RECOVERY_MAX:
        raise ValueError(
            f"a per-metric recovery must be above 0 and at most {METRIC_RECOVERY_MAX} (quantized / base: "
            f"above 1.0 demands that the metric improve; above {METRIC_RECOVERY_MAX} no quantized model "
            "could pass). Fix: use e.g. 0.93, or at most 1.0 unless the metric is noisy")
    return value


class AccuracyTask(Section):
    task: str = Field(description="lm-eval task name, or a path to a task YAML.")
    num_fewshot: int = Field(default=0, ge=0)
    limit: PositiveInt | float | None = Field(default=None, description="Docs per task (int or fraction).")
    recovery: dict[str, Annotated[float, AfterValidator(_metric_recovery)]] = Field(
        default_factory=dict, description="Per-metric recovery threshold overrides "
        f"(0 < recovery <= {METRIC_RECOVERY_MAX}).",
    )

    @field_validator("limit")
    @classmethod
    def _limit(cls, value: int | float | None) -> int | float | None:
        if isinstance(value, float) and not 0 < value <= 1:
            raise ValueError("a limit is a whole number of documents (at least 1) or a fraction of the "
                             "task in (0, 1]. Fix: write e.g. 500 (documents) or 0.25 (a quarter)")
        return value


class AccuracyGate(Section):
    tasks: list[AccuracyTask] = Field(default_factory=list)
    default_recovery: float = Field(
        default=0.95, description="Recovery (quantized / base) every metric must reach unless its task "
        f"overrides it; between {DEFAULT_RECOVERY_RANGE[0]} and {DEFAULT_RECOVERY_RANGE[1]}.")
    batch_size: PositiveInt = 8
    num_concurrent: PositiveInt = 4
    on_uncertain: Literal["warn", "fail"] = Field(
        default="warn", description="What a check whose ~95% recovery interval crosses its threshold "
        "does (lower end below it while the point passes, or upper end above it while the point fails): "
        "'warn' keeps the point decision and carries a warning to the report and decision; 'fail' fails "
        "the check. See docs/gates.md.")
    min_samples: int | None = Field(
        default=None, description="Fewest documents a task must be evaluated on; a task with fewer fails "
        f"the gate (raise its limit). Unset: no minimum. Between {MIN_SAMPLES_RANGE[0]} and "
        f"{MIN_SAMPLES_RANGE[1]}.")

    @field_validator("min_samples")
    @classmethod
    def _min_samples(cls, value: int | None) -> int | None:
        lo, hi = MIN_SAMPLES_RANGE
        if value is not None and not lo <= value <= hi:
            raise ValueError(
                f"must be between {lo} and {hi} documents per task (or unset for no minimum). Fix: use "
                "e.g. 200; the recovery interval narrows with the square root of the documents evaluated")
        return value

    @model_validator(mode="after")
    def _limits_reach_min_samples(self) -> AccuracyGate:
        """A whole-number limit below min_samples would fail the gate on every run: say so at load."""
        if self.min_samples is None:
            return self
        problems = [
            RecipeError(RECIPE_SOURCE, f"gates.accuracy.tasks.{i}.limit", t.limit,
                        f"evaluates {t.limit} documents, fewer than gates.accuracy.min_samples "
                        f"({self.min_samples}), so the accuracy gate would fail on every run",
                        f"raise the limit to at least {self.min_samples} (or unset it: the whole task), "
                        "or lower gates.accuracy.min_samples")
            for i, t in enumerate(self.tasks)
            if isinstance(t.limit, int) and t.limit < self.min_samples
        ]
        if problems:
            raise RecipeErrors(problems)
        return self

    @field_validator("default_recovery")
    @classmethod
    def _default_recovery(cls, value: float) -> float:
        lo, hi = DEFAULT_RECOVERY_RANGE
        if not lo <= value <= hi:
            raise ValueError(
                f"must be between {lo} and {hi}: above {hi} every metric would have to improve after "
                f"quantization, below {lo} a model that lost half its score passes. Fix: use e.g. 0.95 "
                f"(llm-compressor's default); give a noisy metric its own tasks[].recovery (up to "
                f"{METRIC_RECOVERY_MAX}) instead")
        return value


class StressProfile(Section):
    """The batched traffic the release promises to survive."""

    concurrency: PositiveInt | None = Field(
        default=None, description="Target concurrency; defaults to serve.max_num_seqs."
    )
    num_requests: PositiveInt = 64
    max_duration_s: float = Field(default=600, gt=0)
    prompt_tokens: list[PositiveInt] = Field(default_factory=lambda: [32, 128, 512])
    output_tokens: list[PositiveInt] = Field(default_factory=lambda: [16, 64, 128])
    long_prompt_share: float = Field(default=0.1, ge=0, le=1)
    overlong_prompts: int = Field(default=2, ge=0)
    max_preemptions: int = Field(default=0, ge=0)
    request_timeout_s: float = Field(default=120, gt=0)


MIN_SOAK_SAMPLES = 5  # samples after warm-up that a memory trend is fitted to; fewer fit noise

# gates.soak bounds: (lowest, highest, why). Inclusive; the message names the field, value and range.
SOAK_BOUNDS: dict[str, tuple[float, float, str]] = {
    "duration_s": (10, 86_400, "a shorter soak cannot tell a leak from allocator noise; a longer one is "
                   "production monitoring, not a release gate"),
    "warmup_s": (0, 86_400, "the start left out of the trend while pools, caches and kernels settle"),
    "sample_interval_s": (0.2, 600, "each sample reads /health, /metrics and the process tree, so faster "
                          "sampling measures the sampler; slower leaves too few points to fit"),
    "concurrency": (1, 4_096, "requests kept in flight the whole time"),
    "max_memory_growth_mib_per_min": (0.1, 10_240, "below 0.1 MiB/min is allocator noise; above 10 GiB/min "
                                      "a leak kills the server before any trend is needed"),
    "max_preemptions_after_warmup": (0, 1_000_000, "a count of preemptions"),
    "request_timeout_s": (1, 3_600, "seconds one request may take"),
}


class SoakGate(Section):
    """gates.soak: sustained traffic for a long time against the production boot (off when absent).

    Catches the failure that comes hours into production: memory that keeps growing (RSS of the
    server's process tree; GPU memory through NVML on GPU hosts) and a scheduler that keeps
    preempting after warm-up. See quantize_serve/soak.py. Prompts come from the stress test's
    generator; their sizes default to gates.stress's.
    """

    duration_s: float = Field(default=3600, description="How long the sustained traffic runs.")
    warmup_s: float = Field(default=300, description="The start left out of the memory trend and the "
                            "preemption count (allocator pools, caches and kernels settle).")
    sample_interval_s: float = Field(default=10, description="Seconds between samples of /metrics, RSS "
                                     "and GPU memory.")
    concurrency: int | None = Field(default=None, description="Requests in flight the whole time; "
                                    "defaults to serve.max_num_seqs.")
    prompt_tokens: list[PositiveInt] | None = Field(default=None, min_length=1, description="Prompt "
                                                    "sizes drawn from; defaults to gates.stress.prompt_tokens.")
    output_tokens: list[PositiveInt] | None = Field(default=None, min_length=1, description="Output "
                                                    "sizes drawn from; defaults to gates.stress.output_tokens.")
    max_memory_growth_mib_per_min: float = Field(default=10, description="Largest allowed least-squares "
                                                 "slope of memory after warm-up (RSS, and GPU memory where "
                                                 "NVML sees it); 10 MiB/min is 0.6 GiB an hour.")
    max_preemptions_after_warmup: int = Field(default=0, description="Preemptions "
                                              "(vllm:num_preemptions_total) allowed after warm-up.")
    request_timeout_s: float = Field(default=120, description="Seconds one request may take.")

    @field_validator(*SOAK_BOUNDS)
    @classmethod
    def _in_bounds(cls, value: float | None, info: ValidationInfo) -> float | None:
        lo, hi, why = SOAK_BOUNDS[info.field_name]
        if value is not None and not lo <= value <= hi:
            raise ValueError(f"must be between {lo:g} and {hi:g} ({why}); set gates.soak.{info.field_name} "
                             "inside that range")
        return value

    @model_validator(mode="after")
    def _enough_samples(self) -> SoakGate:
        if self.warmup_s >= self.duration_s:
            raise ValueError(f"gates.soak.warmup_s ({self.warmup_s:g}) is not below gates.soak.duration_s "
                             f"({self.duration_s:g}), so nothing would be measured; lower warmup_s or raise "
                             "duration_s")
        samples = int((self.duration_s - self.warmup_s) / self.sample_interval_s)
        if samples < MIN_SOAK_SAMPLES:
            raise ValueError(f"gates.soak gives {samples} sample(s) after warm-up ((duration_s {self.duration_s:g}"
                             f" - warmup_s {self.warmup_s:g}) / sample_interval_s {self.sample_interval_s:g}); "
                             f"a memory trend needs at least {MIN_SOAK_SAMPLES}: raise duration_s or lower "
                             "warmup_s or sample_interval_s")
        return self


class GatesSection(Section):
    accuracy: AccuracyGate = Field(default_factory=AccuracyGate)
    stress: StressProfile = Field(default_factory=StressProfile)
    soak: SoakGate | None = Field(default=None, description="Sustained-traffic memory and preemption "
                                  "gate on the production boot (quantize_serve/soak.py); off when absent.")


class HubSection(Section):
    """Where the release goes. The token never comes from here: environment or a Prefect Secret."""

    repo_id: str
    private: bool = True
    release_ref: str = "production"
    release_ref_kind: Literal["tag", "branch"] = "tag"
    commit_message: str = "quantize-serve: {method} {scheme} of {base_model}@{base_revision}"
    token_env: str = "HF_TOKEN"
    token_secret_block: str | None = Field(
        default=None, description="Name of a Prefect Secret block holding the token."
    )

    @field_validator("repo_id")
    @classmethod
    def _repo_id(cls, value: str) -> str:
        if not REPO_ID.match(value):
            raise ValueError("not a Hub repo id. Fix: write it as 'org/name', e.g. your-org/Llama-3-8B-AWQ")
        return value

    @field_validator("release_ref")
    @classmethod
    def _release_ref(cls, value: str) -> str:
        if value == CANDIDATE_BRANCH:
            raise ValueError(
                f"'{CANDIDATE_BRANCH}' is the branch every candidate is committed to (a tag of that name "
                "would make the revision ambiguous), so promotion could not point it at a gated commit. "
                "Fix: name the release ref something else, e.g. production")
        if value.startswith(REJECTION_TAG_PREFIX):
            raise ValueError(
                f"names starting with '{REJECTION_TAG_PREFIX}' are the tags this pipeline writes on "
                f"rejected candidates ({REJECTION_TAG_PREFIX}<sha>). Fix: name the release ref something "
                "else, e.g. production")
        if not GIT_REF_NAME.match(value):
            raise ValueError(
                "not a valid tag or branch name. Fix: use letters, digits, '.', '_', '-' and '/', e.g. "
                "production or release/v1")
        return value

    @field_validator("commit_message")
    @classmethod
    def _commit_message(cls, value: str) -> str:
        allowed = ", ".join("{" + f + "}" for f in COMMIT_MESSAGE_FIELDS)
        try:
            names = [name for _, name, _, _ in string.Formatter().parse(value) if name is not None]
        except ValueError as exc:
            raise ValueError(f"is not a valid message template ({exc}). Fix: write literal braces as "
                             f"{{{{ and }}}}; placeholders are {allowed}") from None
        unknown = [n or "{}" for n in names if n not in COMMIT_MESSAGE_FIELDS]
        if unknown:
            raise ValueError(f"unknown placeholder(s) {', '.join(unknown)}. Fix: use only {allowed}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _no_token(cls, data: Any) -> Any:
        if isinstance(data, dict) and "token" in data:
            raise RecipeError(
                RECIPE_SOURCE, "hub.token", "<hidden>",
                "a token never goes in a recipe file (recipes are committed and shared)",
                "remove hub.token and set the environment variable named by hub.token_env "
                "(default HF_TOKEN) or hub.token_secret_block")
        return data


class Recipe(BaseModel):
    """A whole release: what to quantize, how to serve it, what it must pass, where it goes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$", description="Lowercase, digits, dashes.")
    model: ModelSection
    calibration: CalibrationSection
    quantization: QuantizationSection
    serve: ServeSection = Field(default_factory=ServeSection)
    gates: GatesSection = Field(default_factory=GatesSection)
    hub: HubSection | None = None
    approval: Literal["auto", "manual"] = "auto"
    base_dir: str = Field(
        default=".", description="Folder that relative paths resolve against (the recipe's folder)."
    )

    def path(self, value: str) -> Path:
        """Resolve a recipe path against the recipe's folder."""
        p = Path(value).expanduser()
        return p if p.is_absolute() else (Path(self.base_dir) / p).resolve()

    def is_local(self, value: str) -> bool:
        """Does a model-like recipe value (model.id, a checkpoint) name a local folder, not a Hub repo?"""
        return looks_local(value) or self.path(value).exists()

    @property
    def model_is_local(self) -> bool:
        return self.is_local(self.model.id)

    @property
    def calibration_is_local(self) -> bool:
        d = self.calibration.dataset
        return looks_local(d) or self.path(d).exists() or Path(d).suffix in DATA_FORMATS

    def calibration_files(self) -> list[Path]:
        return [self.path(f) for f in [self.calibration.dataset, *self.calibration.files]]

    def fingerprint(self) -> str:
        """sha256 of the canonical recipe (paths as written): identical inputs, identical key."""
        payload = self.model_dump(mode="json", exclude={"base_dir"})
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()

    @model_validator(mode="after")
    def _cross_section(self) -> Recipe:
        problems = cross_section_problems(self)
        if problems:
            raise RecipeErrors(problems)
        return self


def cross_section_problems(recipe: Recipe) -> list[RecipeError]:
    """Every rule that spans sections and needs only the recipe (no files), checked at load.

    Each of these used to surface only after quantizing and booting vLLM. One problem per rule,
    naming the field to change; the source is filled in by :func:`parse_recipe`.
    """
    problems: list[RecipeError] = []

    def problem(field: str, value: object, text: str, fix: str) -> None:
        problems.append(RecipeError(RECIPE_SOURCE, field, value, text, fix))

    serve, stress = recipe.serve, recipe.gates.stress
    search = serve.search if serve.search is not None and serve.search.enabled else None
    limit = serve.max_model_len
    # The stress test (quantize_serve/stress.py plan_traffic) sends every prompt size with every
    # output size, and long requests of prompt + output = max_model_len - LONG_PROMPT_MARGIN.
    longest_in, longest_out = max(stress.prompt_tokens), max(stress.output_tokens)
    if longest_in + longest_out > limit:
        problem("gates.stress.prompt_tokens", stress.prompt_tokens,
                f"the longest prompt ({longest_in}) plus the longest output ({longest_out}) is "
                f"{longest_in + longest_out} tokens, over serve.max_model_len ({limit}); the stress test "
                "would fail on requests the server must refuse",
                f"keep max(prompt_tokens) + max(output_tokens) <= {limit}: lower gates.stress.prompt_tokens "
                "or gates.stress.output_tokens, or raise serve.max_model_len")
    elif limit - longest_out - LONG_PROMPT_MARGIN < 1:
        problem("gates.stress.output_tokens", stress.output_tokens,
                f"leaves no room for the stress test's long prompts (max_model_len {limit} - longest output "
                f"{longest_out} - {LONG_PROMPT_MARGIN} tokens of margin)",
                f"keep max(output_tokens) below {limit - LONG_PROMPT_MARGIN}, or raise serve.max_model_len")
    # vLLM runs at most max_num_seqs requests at once and queues the rest: a stress concurrency
    # above it would report a batch size the server never ran.
    if stress.concurrency is not None:
        if search is None and stress.concurrency > serve.max_num_seqs:
            problem("gates.stress.concurrency", stress.concurrency,
                    f"is above serve.max_num_seqs ({serve.max_num_seqs}); vLLM runs at most max_num_seqs "
                    "requests at once and queues the rest, so the gate would not test the concurrency it "
                    "reports",
                    f"set gates.stress.concurrency to at most {serve.max_num_seqs} (or leave it unset: it "
                    "defaults to serve.max_num_seqs), or raise serve.max_num_seqs")
        elif search is not None and search.max_num_seqs is not None and stress.concurrency > search.max_num_seqs:
            problem("gates.stress.concurrency", stress.concurrency,
                    f"is above serve.search.max_num_seqs ({search.max_num_seqs}); no max_num_seqs the "
                    "search can choose runs that many requests at once",
                    "leave gates.stress.concurrency unset (the gates then run at the max_num_seqs the search "
                    f"finds) or set it to at most {search.max_num_seqs}")
    rule = recipe.quantization.choose
    if rule is not None:
        if rule.concurrency is not None and search is None and rule.concurrency > serve.max_num_seqs:
            problem("quantization.choose.concurrency", rule.concurrency,
                    f"is above serve.max_num_seqs ({serve.max_num_seqs}); vLLM would queue the extra requests "
                    "and the throughput would be measured at a concurrency it never ran",
                    f"set it to at most {serve.max_num_seqs}, or raise serve.max_num_seqs")
        if rule.input_tokens and rule.output_tokens and rule.input_tokens + rule.output_tokens > limit:
            problem("quantization.choose.input_tokens", rule.input_tokens,
                    f"plus output_tokens ({rule.output_tokens}) is {rule.input_tokens + rule.output_tokens} "
                    f"tokens, over serve.max_model_len ({limit}); the server would refuse every request",
                    f"keep input_tokens + output_tokens <= {limit}")
    return problems


DATA_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}

FIXES = {
    "extra_forbidden": "remove the key or check its spelling against the recipe reference in README.md",
    "literal_error": "use one of the allowed values",
    "missing": "add the field (see the recipe reference in README.md)",
    "int_parsing": "use a whole number",
    "int_from_float": "use a whole number",
    "float_parsing": "use a number",
    "bool_parsing": "use true or false",
    "string_type": "use text (quote it if YAML reads it as something else)",
    "list_type": "write a list, e.g. [a, b]",
    "dict_type": "write a mapping: keys indented under it",
    "model_type": "write a mapping: keys indented under it",
    "model_attributes_type": "write a mapping: keys indented under it",
    "string_pattern_mismatch": "use lowercase letters, digits and dashes",
    "byte_size": "write a size such as 8MiB or 80GB",
}
BOUND_FIXES = {"greater_than": "above {gt}", "greater_than_equal": "of at least {ge}",
               "less_than": "below {lt}", "less_than_equal": "of at most {le}"}


def looks_local(value: str) -> bool:
    return value.startswith(("/", "./", "../", "~")) or not REPO_ID.match(value)


def parse_recipe(data: Any, *, source: str = RECIPE_SOURCE, base_dir: Path | None = None) -> Recipe:
    """Validate a mapping into a Recipe, translating pydantic's errors into ours."""
    if data is None:
        raise RecipeError(source, "<file>", "", "the recipe is empty (or holds only comments)",
                          "start from a shipped recipe, e.g. recipes/tiny-llama-awq.yaml")
    if not isinstance(data, dict):
        raise RecipeError(source, "<top level>", type(data).__name__, "a recipe is a mapping",
                          "start the file with keys such as name:, model:, calibration:")
    if base_dir is not None:
        data = {**data, "base_dir": str(base_dir)}
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeErrors(translate_errors(source, exc.errors())) from None


def apply_overrides(data: Any, overrides: dict[str, Any], *, source: str) -> dict[str, Any]:
    """A copy of the recipe mapping with each dotted key set to its value (``serve.max_num_seqs``,
    ``gates.accuracy.tasks``, ``gates.accuracy.tasks.0.limit``): a deployment's parameters adapt
    a shipped recipe without a copy of the file. The result is validated like the file itself, so a
    misspelled key gets the same error, did-you-mean included."""
    import copy

    data = copy.deepcopy(data) if isinstance(data, dict) else {}
    for dotted, value in overrides.items():
        node: Any = data
        keys = str(dotted).split(".")
        for i, key in enumerate(keys):
            last = i == len(keys) - 1
            if isinstance(node, list) and key.isdigit() and int(key) < len(node):
                index: Any = int(key)
            elif isinstance(node, dict) and key:
                index = key
            else:
                where = ".".join(keys[:i]) or "<top level>"
                raise RecipeError(
                    source, f"overrides.{dotted}", value, f"{where} has no entry {key!r} to set",
                    "name a recipe field with dots (serve.max_num_seqs), list items by index "
                    "(gates.accuracy.tasks.0.limit)")
            if last:
                node[index] = value
            else:
                if isinstance(node, dict) and not isinstance(node.get(index), (dict, list)):
                    node[index] = {}
                node = node[index]
    return data


def load_recipe(path: str | Path, overrides: dict[str, Any] | None = None) -> Recipe:
    """Read and validate a recipe file (with ``overrides`` applied, see apply_overrides). Fails on
    the first read, before anything heavy."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(str(path), "<file>", str(path), "no such recipe file",
                          "pass the path of a YAML recipe, e.g. recipes/tiny-llama-awq.yaml")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RecipeError(str(path), "<file>", str(path), "not a UTF-8 text file",
                          "pass the path of a YAML recipe, e.g. recipes/tiny-llama-awq.yaml") from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        raise yaml_error(str(path), text, exc) from None
    except yaml.YAMLError as exc:
        raise RecipeError(str(path), "<yaml>", str(exc).splitlines()[0], "not valid YAML",
                          "fix the YAML syntax at the line shown") from None
    if overrides:
        data = apply_overrides(data, overrides, source=str(path))
    return parse_recipe(data, source=str(path), base_dir=path.resolve().parent)


def yaml_error(source: str, text: str, exc: yaml.MarkedYAMLError) -> RecipeError:
    """The line, the column and the offending line of a YAML syntax error."""
    mark = exc.problem_mark or exc.context_mark
    if mark is None:
        return RecipeError(source, "<yaml>", "", f"not valid YAML: {exc.problem or exc}",
                           "fix the YAML syntax")
    lines = text.splitlines()
    offending = lines[mark.line] if mark.line < len(lines) else ""
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    context = ""
    if exc.context and exc.context_mark is not None and exc.context_mark.line != mark.line:
        context = f" ({exc.context} at line {exc.context_mark.line + 1})"
    return RecipeError(source, "<yaml>", offending, f"not valid YAML at {where}: {exc.problem}{context}",
                       f"fix {where}: indent with spaces (not tabs) so nested keys line up, end every key "
                       "with ':', close every quote and bracket")


def translate_errors(source: str, errors: list[dict[str, Any]]) -> list[RecipeError]:
    """pydantic's errors as ours: field, value, problem, fix.

    An unknown key gets "did you mean ...?" (difflib against the keys its section allows), and the
    "Field required" of the key it stands for is dropped: a misspelled section is one mistake, not
    two. Errors raised as RecipeError(s) by our validators keep their own field and fix.
    """
    missing = {tuple(e["loc"]) for e in errors if e["type"] == "missing"}
    meant: dict[tuple[Any, ...], str | None] = {}
    for e in errors:
        if e["type"] == "extra_forbidden" and e["loc"]:
            *parent, key = e["loc"]
            guess = _closest(str(key), _allowed_keys(tuple(parent)))
            meant[tuple(e["loc"])] = guess
    stands_for = {(*loc[:-1], guess) for loc, guess in meant.items() if guess is not None}
    out: list[RecipeError] = []
    for e in errors:
        loc = tuple(e["loc"])
        if e["type"] == "missing" and loc in stands_for:
            continue
        if e["type"] == "extra_forbidden" and loc in meant:
            out.append(_unknown_key(source, e, meant[loc]))
            continue
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, RecipeErrors):
            out.extend(err.with_source(source) for err in cause.errors)
        elif isinstance(cause, RecipeError):
            out.append(cause.with_source(source))
        else:
            out.append(_translate(source, e))
    return out


def _translate(source: str, err: dict[str, Any]) -> RecipeError:
    field = ".".join(str(p) for p in err["loc"]) or "<top level>"
    kind, ctx = err["type"], err.get("ctx") or {}
    msg = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    value = err.get("input")
    fix = FIXES.get(kind, "see the problem above")
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        fix = f"use one of {ctx.get('expected') or msg.split('Input should be ', 1)[-1]}"
        guess = _closest(str(value), choices) if isinstance(value, str) else None
        if guess:
            msg += f"; did you mean {guess!r}?"
    elif kind in BOUND_FIXES:
        fix = "use a value " + BOUND_FIXES[kind].format(**ctx)
    elif kind in ("value_error", "assertion_error"):
        msg, fix = _split_fix(msg)
    if isinstance(value, dict):
        value = "{...}"
    return RecipeError(source, field, value, msg, fix)


def _unknown_key(source: str, err: dict[str, Any], guess: str | None) -> RecipeError:
    *parent, key = err["loc"]
    field = ".".join(str(p) for p in err["loc"])
    value = "{...}" if isinstance(err.get("input"), dict) else err.get("input")
    if guess is not None:
        return RecipeError(source, field, value, f"unknown key; did you mean {guess!r}?",
                           f"rename {str(key)!r} to {guess!r}")
    allowed = _allowed_keys(tuple(parent))
    where = ".".join(str(p) for p in parent) or "the top level"
    return RecipeError(source, field, value, "unknown key",
                       f"remove it; {where} allows: {', '.join(allowed)}" if allowed else FIXES["extra_forbidden"])


def _split_fix(message: str) -> tuple[str, str]:
    """A validator's message as (problem, fix): "<problem>. Fix: <fix>", else the last "; <fix>"
    outside parentheses, else the whole message (which then says what to do itself)."""
    if " Fix: " in message:
        problem, fix = message.split(" Fix: ", 1)
        return problem.rstrip(". "), fix
    depth, cut = 0, -1
    for i, ch in enumerate(message):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth == 0 and message.startswith("; ", i):
            cut = i
    if cut > 0:
        return message[:cut], message[cut + 2:]
    return message, "see the problem above"


def _closest(word: str, choices: list[str]) -> str | None:
    found = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not found:  # a different case is the same word to a reader ("Quantization", "AWQ")
        found = [c for c in choices if c.lower() == word.lower()]
    return found[0] if found else None


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys the recipe allows at ``loc`` (a pydantic error location, list indexes included)."""
    model: type[BaseModel] | None = Recipe
    for part in loc:
        if model is None:
            return []
        if isinstance(part, int):
            continue  # an item of a list of sections: same section type
        info = model.model_fields.get(str(part))
        model = _section_type(info.annotation) if info is not None else None
    if model is None:
        return []
    return [k for k in model.model_fields if k != "base_dir"]


def _section_type(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _section_type(arg)
        if found is not None:
            return found
    return None


def show_path(path: Path) -> str:
    """A path as a person wants it in a message: relative to the working directory when inside it."""
    try:
        return os.path.relpath(path) if Path(path).resolve().is_relative_to(Path.cwd()) else str(path)
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------------------------
# Checks that look at files (small reads only: config.json and the calibration data).
# --------------------------------------------------------------------------------------------


def read_model_config(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / "config.json").read_text())


def check_model(recipe: Recipe, model_dir: Path, *, source: str) -> dict[str, Any]:
    """Check the recipe against the base model's config.json; return the config."""
    if not (model_dir / "config.json").is_file():
        raise RecipeError(source, "model.id", recipe.model.id,
                          f"no model folder with a config.json at {show_path(model_dir)}",
                          "point model.id at a Hugging Face model folder (relative paths resolve "
                          "against the recipe's folder) or at a Hub repo id such as org/name")
    config = read_model_config(model_dir)
    check_model_config(recipe, config, source=source)
    return config


def grouped_sizes(q: QuantizationSection) -> list[tuple[str, int]]:
    """(field, group size) of every 4-bit scheme the section quantizes (checkpoints bring their own)."""
    if q.candidates:
        return [(f"quantization.candidates[{i}].group_size" if c.group_size else "quantization.group_size",
                 c.group_size or q.group_size)
                for i, c in enumerate(q.candidates) if c.method and (c.scheme or q.scheme).startswith("W4")]
    return [("quantization.group_size", q.group_size)] if q.method and q.scheme.startswith("W4") else []


def check_model_config(recipe: Recipe, config: dict[str, Any], *, source: str) -> None:
    """Check the recipe against the base model's parsed config.json (a local or a Hub model)."""
    errors: list[RecipeError] = []
    q = recipe.quantization
    hidden = int(config.get("hidden_size", 0))
    intermediate = int(config.get("intermediate_size", 0))
    heads = int(config.get("num_attention_heads", 1))
    head_dim = int(config.get("head_dim") or hidden // max(heads, 1))
    # in_features of the quantized linears: q/k/v/gate/up take hidden, o takes heads*head_dim,
    # down takes intermediate. Each must split into whole groups.
    dims = {"hidden_size": hidden, "intermediate_size": intermediate,
            "num_attention_heads*head_dim": heads * head_dim}
    for field, group_size in grouped_sizes(q):  # 8-bit schemes are per channel: no groups
        bad = {k: v for k, v in dims.items() if v and v % group_size}
        if bad and q.llmcompressor_recipe is None:
            divisors = sorted({g for g in (32, 64, 128) if all(v % g == 0 for v in dims.values() if v)})
            errors.append(RecipeError(
                source, field, group_size,
                f"does not divide the model's {', '.join(f'{k}={v}' for k, v in bad.items())}",
                f"use a group size that divides them: {divisors or 'none of 32/64/128 does'}"))
    max_pos = config.get("max_position_embeddings")
    if max_pos and recipe.serve.max_model_len > int(max_pos):
        errors.append(RecipeError(
            source, "serve.max_model_len", recipe.serve.max_model_len,
            f"exceeds the model's max_position_embeddings ({max_pos})",
            f"set serve.max_model_len to at most {max_pos}"))
    tp = recipe.serve.tensor_parallel_size
    if heads % tp:
        errors.append(RecipeError(
            source, "serve.tensor_parallel_size", tp,
            f"does not divide num_attention_heads ({heads})",
            "use a tensor_parallel_size that divides the number of attention heads"))
    if errors:
        raise RecipeErrors(errors) if len(errors) > 1 else errors[0]


def check_calibration_rows(recipe: Recipe, columns: list[str], num_rows: int, *, source: str) -> None:
    """The named field exists and there are enough rows (both numbers in the message)."""
    c = recipe.calibration
    field_name, field_key = (
        (c.text_field, "calibration.text_field") if c.text_field else (c.messages_field, "calibration.messages_field")
    )
    if field_name not in columns:
        raise RecipeError(source, field_key, field_name,
                          f"the calibration data {c.dataset!r} has no such field (it has: {', '.join(columns)})",
                          f"set {field_key} to one of: {', '.join(columns)}")
    if num_rows < c.num_samples:
        raise RecipeError(source, "calibration.num_samples", c.num_samples,
                          f"the calibration data {c.dataset!r} (split {c.split!r}) has only {num_rows} rows",
                          f"lower calibration.num_samples to at most {num_rows} or add data")
