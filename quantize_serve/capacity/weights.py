"""Weight bytes of a model shape per quantization format, as the checkpoint stores them and vLLM loads
them: the planner's weights term, split by part so a mixture of experts shows what its experts take.

Formats (compressed-tensors, as llm-compressor writes them):

``bf16``
    every parameter at 2 bytes (fp32 checkpoints are served in 16-bit by vLLM's ``dtype="auto"``).
``W4A16`` / ``W4A16_ASYM``
    ``pack-quantized`` int4: the Linear layers of every block (attention, the dense MLP, every routed
    expert, the shared expert) at 4 bits packed, one 16-bit scale per ``group_size`` inputs, plus packed
    zero points for ``_ASYM`` (:func:`packed_int4_linear_bytes`).
``W8A8`` / ``FP8_DYNAMIC``
    8 bits per weight plus a scale per output channel (:func:`channel_int8_linear_bytes`).

Always 16-bit: embeddings, norms, biases, the LM head when ignored or tied, and the MoE router (``gate``)
and shared-expert gate, which llm-compressor's MoE recipes ignore and vLLM builds unquantized.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel

from quantize_serve.capacity.model_shape import Linear, ModelShape

__all__ = [
    "Scheme",
    "WeightBytes",
    "weight_breakdown",
    "weight_bytes",
    "packed_int4_linear_bytes",
    "channel_int8_linear_bytes",
    "allocator_rounding_bytes",
]

Scheme = Literal["bf16", "W4A16", "W4A16_ASYM", "W8A8", "FP8_DYNAMIC"]

# PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp: kSmallSize, kMinLargeAlloc,
# kRoundLarge): a request of 10 MiB or more gets a segment rounded up to 2 MiB, and the block is split
# only when more than 1 MiB would remain, so a tensor that leaves 1 MiB or less is counted whole.
ALLOCATOR_SMALL_SIZE, ALLOCATOR_MIN_LARGE_ALLOC, ALLOCATOR_ROUND_LARGE = 2**20, 10 * 2**20, 2 * 2**20


def packed_int4_linear_bytes(out_f: int, in_f: int, *, group_size: int | None, asym: bool) -> int:
    """Bytes of one Linear stored by compressed-tensors ``pack-quantized`` at 4 bits.

    Layout (compressed-tensors ``PackedQuantizationCompressor.compression_param_info``):
    ``weight_packed`` int32 ``[out, ceil(in/8)]``; ``weight_scale`` in the model dtype
    (16-bit) ``[out, ceil(in/group)]``; ``weight_shape`` int32 ``[2]``; and, only for
    asymmetric group/channel quantization, ``weight_zero_point`` int32
    ``[ceil(out/8), ceil(in/group)]`` (zero points packed 8 per int32 along the output dim).
    ``group_size`` None or <= 0 means per-channel (one group per row). A routed expert is stored
    the same way, one set of tensors per expert (vLLM stacks them, ``w13_weight_packed`` and
    ``w2_weight_packed``, at the same size).
    """
    groups = 1 if not group_size or group_size <= 0 else math.ceil(in_f / group_size)
    packed = out_f * math.ceil(in_f / 8) * 4
    scales = out_f * groups * 2
    shape = 2 * 4
    zero_points = math.ceil(out_f / 8) * groups * 4 if asym else 0
    return packed + scales + shape + zero_points


def channel_int8_linear_bytes(out_f: int, in_f: int) -> int:
    """Bytes of one Linear stored by compressed-tensors ``int-quantized``/``float-quantized`` at 8
    bits, per output channel (W8A8, FP8_DYNAMIC): the 8-bit weight plus one scale per row (fp32 at
    most; 4 bytes taken, the row is thousands of bytes)."""
    return out_f * in_f + out_f * 4


def _quantized_linear_bytes(out_f: int, in_f: int, *, scheme: Scheme, group_size: int | None) -> int:
    if scheme in ("W8A8", "FP8_DYNAMIC"):
        return channel_int8_linear_bytes(out_f, in_f)
    return packed_int4_linear_bytes(out_f, in_f, group_size=group_size, asym=scheme == "W4A16_ASYM")


class WeightBytes(BaseModel):
    """Bytes of the whole checkpoint by part (all layers together)."""

    scheme: Scheme
    embeddings: int
    lm_head: int
    attention: int
    dense_mlp: int
    routed_experts: int
    shared_experts: int
    router: int
    norms_and_biases: int

    @property
    def total(self) -> int:
        return (
            self.embeddings
            + self.lm_head
            + self.attention
            + self.dense_mlp
            + self.routed_experts
            + self.shared_experts
            + self.router
            + self.norms_and_biases
        )

    @property
    def experts(self) -> int:
        """Routed and shared experts (the router aside)."""
        return self.routed_experts + self.shared_experts


def weight_breakdown(
    shape: ModelShape,
    *,
    scheme: Scheme,
    group_size: int | None = 128,
    ignore: tuple[str, ...] | list[str] = ("lm_head",),
) -> WeightBytes:
    """:func:`weight_bytes`, by part. A module name in ``ignore`` stays 16-bit: ``"lm_head"``, a Linear's
    name (``"down_proj"``: in every dense MLP and every expert), ``"experts"`` (every routed expert) or
    ``"shared_expert"``. A tied LM head is the embedding matrix and is never quantized."""
    b16 = 2
    ignored = set(ignore)

    def linears(items: list[Linear], *, group: str = "") -> int:
        total = 0
        for name, out_f, in_f in items:
            if scheme == "bf16" or name in ignored or group in ignored:
                total += out_f * in_f * b16
            else:
                total += _quantized_linear_bytes(out_f, in_f, scheme=scheme, group_size=group_size)
        return total

    h, v = shape.hidden_size, shape.vocab_size
    if shape.tie_word_embeddings:
        lm_head = 0
    elif scheme == "bf16" or "lm_head" in ignored:
        lm_head = v * h * b16
    else:
        lm_head = _quantized_linear_bytes(v, h, scheme=scheme, group_size=group_size)
    norms = shape.num_layers * shape.norm_elements_per_layer() + h
    biases = (
        shape.num_layers * shape.bias_elements_per_layer()
        + shape.num_dense_layers * shape.mlp_bias_elements()
    )
    moe, dense = shape.num_moe_layers, shape.num_dense_layers
    return WeightBytes(
        scheme=scheme,
        embeddings=v * h * b16,
        lm_head=lm_head,
        attention=shape.num_layers * linears(shape.attention_linears()),
        dense_mlp=dense * linears(shape.mlp_linears(shape.intermediate_size)) if dense else 0,
        routed_experts=moe * shape.num_experts * linears(shape.expert_linears(), group="experts"),
        shared_experts=moe * linears(shape.shared_expert_linears(), group="shared_expert"),
        router=moe * shape.router_elements() * b16,
        norms_and_biases=(norms + biases) * b16,
    )


def weight_bytes(
    shape: ModelShape,
    *,
    scheme: Scheme,
    group_size: int | None = 128,
    ignore: tuple[str, ...] | list[str] = ("lm_head",),
) -> int:
    """Bytes of the model's weights as stored in the checkpoint and loaded by vLLM (module docstring:
    the formats; :func:`weight_breakdown`: the parts).

    Measured on the H200 (vLLM 0.26, "Model loading took"): Llama-3-8B 14.96 GiB (bf16) and 5.32 GiB
    (W4A16), this gives 14.96 and 5.31 (the checkpoint was 5.70 GB); Qwen3-30B-A3B 56.88 and 15.55 GiB,
    this gives 56.87 and 15.54 (tests/unit/test_planner.py). On CUDA vLLM also counts the allocator's
    rounding of large tensors (:func:`allocator_rounding_bytes`), which the planner adds in mode "gpu".
    """
    return weight_breakdown(shape, scheme=scheme, group_size=group_size, ignore=ignore).total


def _rounding(size: int) -> int:
    """What the CUDA caching allocator counts beyond a tensor of ``size`` bytes, when that is fixed by
    the allocator's constants alone (requests of 10 MiB and more; 1-10 MiB requests share 20 MiB
    segments and what they leave depends on the order of allocations, so they are not counted)."""
    size = 512 * math.ceil(size / 512)
    if size < ALLOCATOR_MIN_LARGE_ALLOC:
        return 0
    left = ALLOCATOR_ROUND_LARGE * math.ceil(size / ALLOCATOR_ROUND_LARGE) - size
    return left if left <= ALLOCATOR_SMALL_SIZE else 0


def _tensor_sizes(
    out_f: int, in_f: int, *, scheme: Scheme, group_size: int | None, quantized: bool, stacked: int = 1
) -> list[int]:
    """Bytes of the tensors vLLM allocates for one Linear (``stacked`` experts in one tensor each)."""
    if scheme == "bf16" or not quantized:
        return [stacked * out_f * in_f * 2]
    if scheme in ("W8A8", "FP8_DYNAMIC"):
        return [stacked * out_f * in_f, stacked * out_f * 4]
    groups = 1 if not group_size or group_size <= 0 else math.ceil(in_f / group_size)
    return [stacked * out_f * math.ceil(in_f / 8) * 4, stacked * out_f * groups * 2]


def allocator_rounding_bytes(
    shape: ModelShape,
    *,
    scheme: Scheme,
    group_size: int | None = 128,
    ignore: tuple[str, ...] | list[str] = ("lm_head",),
    tensor_parallel_size: int = 1,
) -> int:
    """Bytes per GPU that vLLM's "Model loading took" counts beyond the weights' own size on CUDA: the
    caching allocator's rounding (:func:`_rounding`) of each tensor in vLLM's layout (q/k/v merged,
    gate/up merged, a sparse layer's experts stacked into one ``w13`` and one ``w2`` tensor, column
    shards of ``out / TP`` and row shards of ``in / TP``).

    Why: Qwen2-72B's int4 ``gate_up`` (231 MiB) and ``down`` (115.5 MiB) leave 1 and 0.5 MiB of their
    2 MiB-rounded segments, 120 MiB over 80 layers, which vLLM counts as weights (issue 25: 38.53 GiB
    measured, 38.36 planned without this). Llama-3's and Qwen3-30B-A3B's tensors are whole multiples
    of 2 MiB and get nothing, as measured.
    """
    tp, ignored = tensor_parallel_size, set(ignore)

    def linears(items: list[Linear], *, group: str = "", stacked: int = 1) -> list[int]:
        sizes = []
        for name, out_f, in_f in items:
            quantized = name not in ignored and group not in ignored
            sizes += _tensor_sizes(
                out_f, in_f, scheme=scheme, group_size=group_size, quantized=quantized, stacked=stacked
            )
        return sizes

    def merged(items: list[Linear], names: tuple[str, ...], *, column: bool) -> list[Linear]:
        """vLLM's merged Linear of ``names``: column shards (outputs / TP) or one row shard (inputs / TP)."""
        picked = [(o, i) for n, o, i in items if n in names]
        if column:
            return [(names[0], sum(math.ceil(o / tp) for o, _ in picked), picked[0][1])]
        return [(names[0], picked[0][0], math.ceil(picked[0][1] / tp))]

    attn = shape.attention_linears()
    kv_heads_gpu = math.ceil(shape.num_kv_heads / tp)
    qkv = [("q_proj", (shape.num_heads // tp + 2 * kv_heads_gpu) * shape.head_dim, shape.hidden_size)]
    per_layer = linears(qkv) + linears(merged(attn, ("o_proj",), column=False))

    def mlp(intermediate: int, *, group: str = "", stacked: int = 1) -> list[int]:
        items = shape.mlp_linears(intermediate)
        return linears(
            merged(items, ("gate_proj", "up_proj"), column=True), group=group, stacked=stacked
        ) + linears(merged(items, ("down_proj",), column=False), group=group, stacked=stacked)

    total = shape.num_layers * sum(_rounding(b) for b in per_layer)
    if shape.num_dense_layers:
        total += shape.num_dense_layers * sum(_rounding(b) for b in mlp(shape.intermediate_size))
    if shape.is_moe:
        sparse = mlp(shape.moe_intermediate_size, group="experts", stacked=shape.num_experts)
        if shape.shared_expert_intermediate_size:
            sparse += mlp(shape.shared_expert_intermediate_size, group="shared_expert")
        total += shape.num_moe_layers * sum(_rounding(b) for b in sparse)
    vocab_gpu = math.ceil(shape.vocab_size / tp)
    head = [] if shape.tie_word_embeddings else linears([("lm_head", vocab_gpu, shape.hidden_size)])
    return total + sum(_rounding(b) for b in [vocab_gpu * shape.hidden_size * 2, *head])
