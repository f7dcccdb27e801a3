"""The planner's table: base, W4A16 and W4A16 + fp8 KV side by side with their gains, the smallest TP
that fits a configuration, and the table as text (``quantize-serve plan``). With the recipe's
``serve.kv_offload``, the production configuration's host-memory tier beside its row
(capacity/host_tier.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from quantize_serve.capacity.host_tier import HostTier, plan_host_tier
from quantize_serve.capacity.planner import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    GPU_MEMORY_BYTES,
    TP_SIZES,
    CapacityPlan,
    GiB,
    KVCacheDtype,
    ModelShape,
    PlanMode,
    plan_capacity,
)
from quantize_serve.recipe.model import KVOffloadSection
from quantize_serve.serving.boot import Boot


class ConfigGain(BaseModel):
    """What a configuration gains over the ``base`` (bf16 weights, 16-bit KV) row."""

    extra_kv_cache_bytes: int
    extra_kv_tokens: int
    kv_tokens_ratio: float | None = Field(
        description="tokens / base tokens; None when the base holds no KV cache at all"
    )
    extra_max_concurrency: float


class ModelSummary(BaseModel):
    """What the plan says about the model itself: its parameters and, for a mixture of experts, how
    they are routed."""

    architecture: str
    total_parameters: int
    active_parameters: int = Field(description="per token; = total_parameters for a dense model")
    num_experts: int = 0
    num_experts_per_tok: int = 0
    num_moe_layers: int = 0
    shared_expert_intermediate_size: int = 0
    num_layers: int

    @classmethod
    def of(cls, shape: ModelShape) -> ModelSummary:
        return cls(
            architecture=shape.architecture,
            total_parameters=shape.num_parameters(),
            active_parameters=shape.num_active_parameters(),
            num_experts=shape.num_experts,
            num_experts_per_tok=shape.num_experts_per_tok,
            num_moe_layers=shape.num_moe_layers,
            shared_expert_intermediate_size=shape.shared_expert_intermediate_size,
            num_layers=shape.num_layers,
        )

    def parameters_line(self) -> str:
        """Total and active parameters in one line (equal for a dense model): what the capacity table,
        the report and the model card say about the model's size."""
        kind = (
            f"mixture of experts: {self.num_experts_per_tok} of {self.num_experts} routed experts per token"
            if self.num_moe_layers
            else "dense: every parameter is active"
        )
        return (
            f"Parameters: {_count(self.total_parameters)} total, {_count(self.active_parameters)} active "
            f"per token ({kind})."
        )


class PlanTable(BaseModel):
    """The three configurations the project compares, with what quantization frees."""

    model: str
    summary: ModelSummary | None = None
    rows: dict[str, CapacityPlan] = Field(
        description="keys: base, w4a16, w4a16-fp8kv (the production row, "
        "whatever its KV dtype; the text labels it by it: row_label)"
    )
    fits_at_tp: dict[str, int | None] = Field(
        default_factory=dict,
        description="for a row that does not fit: the smallest tensor_parallel_size "
        f"(up to {max(TP_SIZES)}) at which it would, or None",
    )
    freed_weight_bytes: int = Field(description="whole checkpoint: base - w4a16 weights")
    freed_weight_bytes_per_gpu: int
    gains: dict[str, ConfigGain] = Field(description="keys: w4a16, w4a16-fp8kv")
    host_tier: HostTier | None = Field(
        None, description="serve.kv_offload's host-memory tier beside the production row (native, sized)"
    )
    host_tier_unplanned: str | None = Field(
        None, description="why the recipe's serve.kv_offload is not planned (lmcache, a share, a CPU plan)"
    )

    @model_serializer(mode="wrap")
    def _without_tier(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A plan without serve.kv_offload dumps as it did before the tier existed."""
        data = handler(self)
        for key in ("host_tier", "host_tier_unplanned"):
            if getattr(self, key) is None:
                data.pop(key, None)
        return data


def smallest_fitting_tp(shape: ModelShape, **plan: Any) -> int | None:
    """The smallest TP in TP_SIZES that divides the attention heads and at which ``plan_capacity``
    (same arguments, ``tensor_parallel_size`` aside) says the configuration fits; None if none does."""
    plan.pop("tensor_parallel_size", None)
    for tp in TP_SIZES:
        if shape.num_heads % tp == 0 and plan_capacity(shape, tensor_parallel_size=tp, **plan).fits:
            return tp
    return None


def _gain(row: CapacityPlan, base: CapacityPlan) -> ConfigGain:
    return ConfigGain(
        extra_kv_cache_bytes=max(0, row.kv_cache_memory_bytes) - max(0, base.kv_cache_memory_bytes),
        extra_kv_tokens=row.kv_cache_tokens - base.kv_cache_tokens,
        kv_tokens_ratio=(row.kv_cache_tokens / base.kv_cache_tokens) if base.kv_cache_tokens else None,
        extra_max_concurrency=row.max_concurrency - base.max_concurrency,
    )


def gpu_memory_bytes(gpu: str) -> float:
    """Device memory of a GPU preset (``h200``, ``h100-80gb``) or a size (``150109880320``,
    ``80GiB``, ``141GB``), in bytes. Raises ValueError naming the accepted forms."""
    key = gpu.strip().lower()
    if key in GPU_MEMORY_BYTES:
        return GPU_MEMORY_BYTES[key]
    from pydantic import ByteSize, TypeAdapter, ValidationError

    try:
        size = TypeAdapter(ByteSize).validate_python(gpu.strip())
    except ValidationError:
        size = 0
    if size <= 0:
        raise ValueError(
            f"unknown GPU {gpu!r}: use one of {', '.join(GPU_MEMORY_BYTES)} or a memory size "
            "in bytes (e.g. 150109880320 or 80GiB)"
        )
    return float(size)


def plan_table(
    shape: ModelShape,
    *,
    device_memory_bytes: int | float,
    gpu_memory_utilization: float = 0.90,
    max_model_len: int = 8192,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    block_size: int = 16,
    tensor_parallel_size: int = 1,
    mode: PlanMode = "gpu",
    quant_scheme: Literal["W4A16", "W4A16_ASYM"] = "W4A16",
    fp8_kv_cache_dtype: KVCacheDtype = "fp8",
    group_size: int | None = 128,
    ignore: tuple[str, ...] | list[str] = ("lm_head",),
    enforce_eager: bool = False,
    cudagraph_memory_bytes: int | None = None,
    model: str = "model",
    kv_offload: KVOffloadSection | None = None,
) -> PlanTable:
    """Plan (a) ``base`` bf16 + 16-bit KV, (b) ``w4a16`` + 16-bit KV and (c)
    ``w4a16-fp8kv`` + fp8 KV under identical settings, and derive the freed weight bytes
    and the capacity gains of (b) and (c) over (a). ``kv_offload`` (the recipe's serve.kv_offload): (c)'s
    host-memory tier too, or why it is not planned."""
    common: dict[str, Any] = dict(
        device_memory_bytes=device_memory_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
        tensor_parallel_size=tensor_parallel_size,
        mode=mode,
        group_size=group_size,
        ignore=ignore,
        enforce_eager=enforce_eager,
        cudagraph_memory_bytes=cudagraph_memory_bytes,
    )
    settings = {
        boot: dict(
            scheme=quant_scheme if boot.quantized else "bf16",
            kv_cache_dtype="auto" if boot.sixteen_bit_kv else fp8_kv_cache_dtype,
            **common,
        )
        for boot in Boot
    }
    rows = {boot: plan_capacity(shape, **settings[boot]) for boot in Boot}
    base = rows[Boot.BASE]
    tier, unplanned = _host_tier(shape, rows[Boot.PRODUCTION], kv_offload)
    return PlanTable(
        model=model,
        summary=ModelSummary.of(shape),
        rows=rows,
        fits_at_tp={
            boot: smallest_fitting_tp(shape, **settings[boot]) for boot in Boot if not rows[boot].fits
        },
        freed_weight_bytes=base.total_weights_bytes - rows[Boot.QUANTIZED_16BIT_KV].total_weights_bytes,
        freed_weight_bytes_per_gpu=base.weights_bytes - rows[Boot.QUANTIZED_16BIT_KV].weights_bytes,
        gains={k: _gain(rows[k], base) for k in Boot if k.quantized},
        host_tier=tier,
        host_tier_unplanned=unplanned,
    )


def _host_tier(
    shape: ModelShape, production: CapacityPlan, kv_offload: KVOffloadSection | None
) -> tuple[HostTier | None, str | None]:
    """The production row's host-memory tier, or why it is not planned (None, None without one)."""
    if kv_offload is None:
        return None, None
    if kv_offload.backend != "native":
        return (
            None,
            "serve.kv_offload backend lmcache is sized by LMCache's own configuration, not planned here",
        )
    if production.mode != "gpu":
        return None, (
            "serve.kv_offload is not planned on the CPU host's budget: vLLM's CPU backend cannot offload "
            "(plan a GPU with --gpu)"
        )
    if kv_offload.host_memory_share is not None:
        return None, (
            f"serve.kv_offload.host_memory_share {kv_offload.host_memory_share:g} is resolved to GiB from "
            "the GPU host's available memory when the run validates (plan there, or set size_gib)"
        )
    tier = plan_host_tier(
        kv_offload,
        shape,
        kv_cache_dtype=production.kv_cache_dtype,
        tensor_parallel_size=production.tensor_parallel_size,
        gpu_tokens=production.kv_cache_tokens,
        block_size=production.block_size,
    )
    return tier, None


def row_label(name: str, row: CapacityPlan) -> str:
    """How the text names a row: the production row by its KV dtype (w4a16-16bitkv for "auto")."""
    return Boot(name).label(kv_cache_dtype=row.kv_cache_dtype)


def _gib(n: int | float) -> str:
    return f"{n / GiB:.2f}"


def _graphs(row: CapacityPlan) -> str:
    """CUDA graphs: 'off' (eager or a fixed budget); else the pool captured after the KV cache, after the
    estimate taken from the budget where there is one (vLLM's V1 model runner, or given)."""
    if row.cudagraph_source == "off":
        return "off"
    pool = f"{_gib(row.cudagraph_pool_bytes)} pool"
    return pool if row.cudagraph_source == "none" else f"{_gib(row.cudagraph_bytes)} est. + {pool}"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n:,}"


def _model_lines(table: PlanTable) -> list[str]:
    """Parameters (total and active) and, for a mixture of experts, its routing and expert bytes."""
    m = table.summary
    if m is None:
        return []
    if not m.num_moe_layers:
        return [
            f"Model: {m.architecture}, {_count(m.total_parameters)} parameters, "
            f"{_count(m.active_parameters)} active per token (dense)."
        ]
    shared = ", and a shared expert" if m.shared_expert_intermediate_size else ""
    lines = [
        f"Model: {m.architecture}, mixture of experts: {_count(m.total_parameters)} parameters, "
        f"{_count(m.active_parameters)} active per token ({m.num_experts} experts in "
        f"{m.num_moe_layers} of {m.num_layers} layers, {m.num_experts_per_tok} routed per token{shared})."
    ]
    parts = [r.weights for r in table.rows.values() if r.weights is not None]
    by_scheme = dict.fromkeys(f"{_gib(w.experts)} GiB {w.scheme}" for w in parts)
    router = parts[0].router if parts else 0
    lines.append(
        f"Expert weights (routed and shared, whole checkpoint): {', '.join(by_scheme)}; "
        f"router gates {_gib(router)} GiB, kept 16-bit."
    )
    return lines


def format_table(table: PlanTable, *, title: str | None = None) -> str:
    """Render a :class:`PlanTable` as a markdown table (GiB with 2 decimals, tokens with
    thousands separators), followed by the freed memory and the gains over ``base``."""
    first = next(iter(table.rows.values()))
    head = title or (
        f"{table.model}: {first.device_memory_bytes / GiB:.1f} GiB x {first.gpu_memory_utilization:.2f}, "
        f"TP {first.tensor_parallel_size}, max_model_len {first.max_model_len:,}, "
        f"mode {first.mode}"
        + (f", max_num_batched_tokens {first.max_num_batched_tokens:,}" if first.mode == "gpu" else "")
    )
    lines = [
        f"### {head}",
        "",
        "| config | weights GiB/GPU | activ. GiB | overhead GiB | CUDA graphs GiB | KV GiB/GPU | "
        "KV B/token (model) | KV tokens | max concurrency | rec. max_num_seqs | fits |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    labels = {name: row_label(name, r) for name, r in table.rows.items()}
    for name, r in table.rows.items():
        fits = "yes" if r.fits else f"NO (max_model_len <= {r.largest_max_model_len:,})"
        kv_gib = _gib(r.kv_cache_memory_bytes)  # negative: that much over budget
        lines.append(
            f"| {labels[name]} | {_gib(r.weights_bytes)} | {_gib(r.activation_bytes)} | "
            f"{_gib(r.overhead_bytes)} | {_graphs(r)} | {kv_gib} | {r.kv_bytes_per_token:,} | "
            f"{r.kv_cache_tokens:,} | {r.max_concurrency:.1f} | {r.recommended_max_num_seqs:,} | {fits} |"
        )
        if name == Boot.PRODUCTION and table.host_tier is not None:
            lines.append(_tier_row(labels[name], table.host_tier))
    lines.append("")
    lines.extend(_model_lines(table))
    lines.append(
        f"Freed by quantization: {_gib(table.freed_weight_bytes)} GiB of weights "
        f"({_gib(table.freed_weight_bytes_per_gpu)} GiB per GPU)."
    )
    for name, g in table.gains.items():
        ratio = "ratio n/a: base does not fit"
        if g.kv_tokens_ratio is not None:
            ratio = f"x{g.kv_tokens_ratio:.2f}"
        lines.append(
            f"- {labels[name]} vs base: {g.extra_kv_tokens:+,} KV tokens ({ratio}), "
            f"{g.extra_max_concurrency:+.1f} concurrent max-length requests"
        )
    for name, r in table.rows.items():
        if r.reason:
            tp = table.fits_at_tp.get(name)
            where = (
                (f"; fits at TP {tp}" if tp else f"; fits at no TP up to {max(TP_SIZES)}")
                if name in table.fits_at_tp
                else ""
            )
            lines.append(f"- {labels[name]} does not fit at TP {r.tensor_parallel_size}: {r.reason}{where}")
    production = table.rows.get(Boot.PRODUCTION)
    if production is not None and labels[Boot.PRODUCTION] != Boot.PRODUCTION.value:
        lines.append(
            f"- note: {labels[Boot.PRODUCTION]} is the production configuration with KV cache dtype "
            f"{production.kv_cache_dtype}: a 16-bit KV cache, as in the {Boot.QUANTIZED_16BIT_KV} row "
            "(--kv-cache-dtype fp8 plans an fp8 one)"
        )
    lines.extend(_tier_lines(table, labels.get(Boot.PRODUCTION, Boot.PRODUCTION.value)))
    notes = dict.fromkeys(n for r in table.rows.values() for n in r.notes)
    lines.extend(f"- note: {n}" for n in notes)
    return "\n".join(lines)


def _tier_row(label: str, tier: HostTier) -> str:
    """The tier's row under the production row: its host GiB in the KV column, its bytes a token over all
    ranks, its tokens; no concurrency (it adds none)."""
    return (
        f"| {label} + host tier ({tier.backend}) | - | - | - | - | {tier.size_gib:.2f} host | "
        f"{tier.bytes_per_token:,} | {tier.tokens:,} | - | - | prefix reuse |"
    )


def _tier_lines(table: PlanTable, label: str) -> list[str]:
    """What the tier holds, beyond the GPU, and what it is for; or why it is not planned."""
    if table.host_tier_unplanned:
        return [f"- host tier: {table.host_tier_unplanned}"]
    return table.host_tier.lines(label) if table.host_tier else []
