"""The gpu tier: what only a GPU host can prove (CUDA quantization, vLLM's GPU accounting, memory given
back between boots). Skipped, with the reason, where NVML finds no NVIDIA GPU (tests/conftest.py).

The tiny recipe runs in GPU mode here: without ``serve.memory_budget`` (the CPU runs' explicit budget),
so vLLM sizes each boot's KV cache from ``gpu_memory_utilization`` as production does."""

from __future__ import annotations

import pytest

from quantize_serve.serving import gpu


@pytest.fixture
def idle_gpu_memory() -> int:
    """GPU memory in use before the test (what every boot must give back)."""
    used = gpu.used_bytes()
    assert used is not None
    return used


def assert_memory_given_back(before: int, slack: int = 512 * 1024**2) -> None:
    after = gpu.used_bytes()
    assert after is not None and after <= before + slack, (
        f"GPU memory in use {after:,} B, before {before:,} B"
    )
