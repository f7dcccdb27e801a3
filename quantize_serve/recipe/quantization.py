"""The recipe's ``quantization`` section: a method and scheme, an existing checkpoint, or candidates
to choose from by measurement (and the rule that chooses)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    PositiveInt,
    field_validator,
    model_validator,
)

from quantize_serve.recipe.section import Method, Scheme, Section

# quantization.scheme -> the methods that make it (llm-compressor modifiers, quantize.py):
# awq/gptq: 4-bit weights; rtn: llm-compressor's QuantizationModifier alone (round to nearest, no
# calibration of the weights: FP8_DYNAMIC); smoothquant-gptq: SmoothQuant then GPTQ (INT8 W8A8).
SCHEME_METHODS = {
    "W4A16": ("awq", "gptq"),
    "W4A16_ASYM": ("awq", "gptq"),
    "W8A8": ("smoothquant-gptq", "gptq"),
    "FP8_DYNAMIC": ("rtn",),
}


def scheme_method_problem(method: str | None, scheme: str) -> str | None:
    """Why ``method`` cannot make ``scheme`` (with the fix), or None."""
    allowed = SCHEME_METHODS[scheme]
    if method is None or method in allowed:
        return None
    makes = sorted(s for s, methods in SCHEME_METHODS.items() if method in methods)
    return (
        f"method {method!r} does not make scheme {scheme!r} (it makes {', '.join(makes)}). Fix: use "
        f"method {' or '.join(repr(m) for m in allowed)} for {scheme}, or another scheme"
    )


def even_group_size(value: int | None) -> int | None:
    if value is not None and value % 2:
        raise ValueError(
            "must be even (vLLM's int4 kernels need an even group size). Fix: use an "
            "even group size that divides the model's layer widths, e.g. 128"
        )
    return value


class Candidate(Section):
    """One release format to compare (quantization.candidates): a scheme and the method that makes
    it, or an already-quantized checkpoint (AutoAWQ ``awq``, ``gptq`` or compressed-tensors format)
    validated as it is. Fields left out come from the quantization section."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$", description="Lowercase, digits, dashes.")
    method: Method | None = Field(default=None, description="As quantization.method.")
    scheme: Scheme | None = Field(default=None, description="As quantization.scheme. Unset: quantization's.")
    group_size: PositiveInt | None = Field(
        default=None, description="As quantization.group_size. Unset: quantization's."
    )
    checkpoint: str | None = Field(
        default=None,
        description="Local folder or Hub repo id of a quantized checkpoint of the recipe's base model.",
    )
    revision: str | None = Field(default=None, description="Hub branch, tag or commit of `checkpoint`.")

    @field_validator("group_size")
    @classmethod
    def _even_group(cls, value: int | None) -> int | None:
        return even_group_size(value)

    @model_validator(mode="after")
    def _one_source(self) -> Candidate:
        if (self.method is None) == (self.checkpoint is None):
            raise ValueError(
                f"candidate {self.name!r}: set exactly one of method (quantize the base model) "
                "or checkpoint (an already-quantized checkpoint)"
            )
        if self.checkpoint is not None and (self.scheme or self.group_size):
            raise ValueError(
                f"candidate {self.name!r}: a checkpoint's scheme and group size are read from "
                "its config.json; remove scheme/group_size"
            )
        if self.revision is not None and self.checkpoint is None:
            raise ValueError(f"candidate {self.name!r}: revision applies to a checkpoint only; remove it")
        return self


class FormatRule(Section):
    """quantization.choose: how the release is chosen among the candidates that pass every gate
    (quantize_serve/formats/choose.py). Throughput is measured with `vllm bench serve` (random prompts that
    never repeat, so prefix caching cannot flatter a format) at ``concurrency``."""

    rule: Literal["kv_capacity", "throughput"] = Field(
        default="kv_capacity",
        description="kv_capacity: the most KV-cache tokens; throughput: the most "
        "output tokens/s at `concurrency`, within the TTFT/TPOT limits.",
    )
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
            raise ValueError(
                "rule 'throughput' chooses the most throughput under a latency limit: set "
                "quantization.choose.max_p99_ttft_ms and/or max_mean_tpot_ms (or use rule "
                "'kv_capacity')"
            )
        return self


class QuantizationSection(Section):
    """Maps onto llm-compressor modifiers; ``llmcompressor_recipe`` takes a raw recipe instead.

    One of: ``method`` (+ ``scheme``) quantizes the base model; ``checkpoint`` validates an
    already-quantized one; ``candidates`` compares several and releases the best (``choose``)."""

    method: Method | None = Field(
        default=None,
        description="Quantize the base model with: awq or gptq (W4A16, W4A16_ASYM), smoothquant-gptq or "
        "gptq (W8A8), rtn (FP8_DYNAMIC).",
    )
    scheme: Scheme = Field(default="W4A16", description="The quantized format (llm-compressor's scheme).")
    group_size: PositiveInt = Field(
        default=128, description="Weights per quantization group of the 4-bit schemes (even)."
    )
    targets: list[str] = Field(
        default_factory=lambda: ["Linear"], description="Modules llm-compressor quantizes."
    )
    ignore: list[str] = Field(
        default_factory=lambda: ["lm_head"],
        description="Modules left unquantized: names, or `re:` regular expressions.",
    )
    kv_cache_scales: bool = Field(
        default=False,
        description="Calibrate static fp8 KV-cache scales into the checkpoint (vLLM uses 1.0 without).",
    )
    dampening_frac: float = Field(default=0.01, gt=0, lt=1, description="GPTQ only.")
    n_grid: int = Field(
        default=5,
        ge=4,
        le=100,
        description="awq only: AWQModifier.n_grid, the points of the smoothing-scale grid search per "
        "mapping. Each point is a forward pass of the mapping's parent module over all the calibration "
        "data: where AWQ spends its time. 5 by measurement "
        "(benchmarks/results/release-time/quantize_speed.json); "
        "llm-compressor's default, used before, is 20.",
    )
    duo_scaling: bool | Literal["both"] = Field(
        default=True,
        description="awq only: AWQModifier.duo_scaling, the scales from activations and weights (true, "
        "llm-compressor's default), activations alone (false), or half the grid each way (both). The grid "
        "has n_grid points in every mode.",
    )
    smoothing_strength: float = Field(
        default=0.8, gt=0, lt=1, description="smoothquant-gptq only (SmoothQuant alpha)."
    )
    checkpoint: str | None = Field(
        default=None,
        description="An already-quantized checkpoint (local folder "
        "or Hub repo id) of the base model, validated without re-quantizing.",
    )
    checkpoint_revision: str | None = Field(
        default=None, description="Hub branch, tag or commit of `checkpoint`."
    )
    candidates: list[Candidate] = Field(
        default_factory=list,
        description="Formats to compare; the release is the best that passes every gate (see choose).",
    )
    choose: FormatRule | None = Field(
        default=None,
        description="With candidates: the rule that picks the release (default: most KV capacity).",
    )
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
                ("sets " + " and ".join(given) if given else "names no quantization")
                + ". Fix: set exactly one "
                "of quantization.method (quantize the base model, e.g. method: awq), quantization.checkpoint "
                "(validate an already-quantized checkpoint) or quantization.candidates (compare formats)"
            )
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
            raise ValueError(
                "llmcompressor_recipe replaces the recipe of a single method; it cannot "
                "apply to several candidates. Fix: remove it, or remove candidates"
            )
        if self.choose is not None and not self.candidates:
            raise ValueError("choose picks among candidates; add quantization.candidates or remove choose")
        return self

    def candidate(self, name: str) -> QuantizationSection:
        """The section that makes one candidate alone (what the flow continues with once chosen)."""
        c = next((c for c in self.candidates if c.name == name), None)
        if c is None:
            raise KeyError(f"no candidate named {name!r} (candidates: {[c.name for c in self.candidates]})")
        shared = self.model_dump(
            exclude={"candidates", "choose", "method", "checkpoint", "checkpoint_revision"}
        )
        if c.checkpoint is not None:
            return QuantizationSection(**shared, checkpoint=c.checkpoint, checkpoint_revision=c.revision)
        own = {
            "method": c.method,
            "scheme": c.scheme or self.scheme,
            **({"group_size": c.group_size} if c.group_size else {}),
        }
        return QuantizationSection(**{**shared, **own})

    @property
    def rule(self) -> FormatRule:
        return self.choose or FormatRule()
