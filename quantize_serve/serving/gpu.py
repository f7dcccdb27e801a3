"""GPU memory through NVML. Every function answers None (or an empty list) where there is no
NVML: no library, no driver or no device is what a CPU host looks like, not an error."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any


@functools.cache
def nvml() -> Any | None:
    """The initialised ``pynvml`` module (initialised once per process), or None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


def device_handles() -> list[Any]:
    nv = nvml()
    if nv is None:
        return []
    try:
        return [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    except Exception:
        return []


def usable_memory_bytes(index: int = 0) -> int | None:
    """Memory of one GPU that CUDA can use (what vLLM's gpu_memory_utilization multiplies).

    NVML's total includes memory the driver reserves (0.6 GiB on an H200); CUDA, and so vLLM,
    never see it, and counting it put the planner 0.5% high there.
    """
    nv = nvml()
    if nv is None:
        return None
    try:
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        try:
            info = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
            return int(info.total - info.reserved)
        except (nv.NVMLError, AttributeError, TypeError):
            return int(nv.nvmlDeviceGetMemoryInfo(handle).total)
    except Exception:
        return None


def memory_info(index: int = 0) -> dict[str, Any] | None:
    """Name, driver and memory figures of one GPU (v2 figures too, where the driver has them)."""
    nv = nvml()
    if nv is None:
        return None
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    mem = nv.nvmlDeviceGetMemoryInfo(handle)
    out = {
        "name": str(nv.nvmlDeviceGetName(handle)),
        "total_bytes": int(mem.total),
        "used_bytes": int(mem.used),
        "free_bytes": int(mem.free),
        "driver": str(nv.nvmlSystemGetDriverVersion()),
    }
    try:  # v2 reports the driver-reserved part separately
        mem2 = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
        out.update(
            v2_total_bytes=int(mem2.total), v2_reserved_bytes=int(mem2.reserved), v2_used_bytes=int(mem2.used)
        )
    except Exception:
        pass
    return out


def free_bytes(devices: int = 1) -> int | None:
    """The least free memory of the first ``devices`` GPUs (a tensor-parallel group), None without them."""
    if nvml() is None or len(device_handles()) < devices:
        return None
    return min(memory_info(i)["free_bytes"] for i in range(devices))


def device_used_bytes(index: int = 0) -> int | None:
    """NVML's used memory of one GPU (every process on it), or None without NVML."""
    info = memory_info(index)
    return info["used_bytes"] if info else None


def used_bytes(pids: set[int] | None = None) -> int | None:
    """GPU memory used: by ``pids`` if NVML lists them, else by all devices together (container
    PID namespaces often hide the pids). None without NVML."""
    nv, handles = nvml(), device_handles()
    if nv is None or not handles:
        return None
    try:
        mine = [
            p.usedGpuMemory or 0
            for h in handles
            for p in nv.nvmlDeviceGetComputeRunningProcesses(h)
            if pids and p.pid in pids
        ]
        return sum(mine) if mine else sum(int(nv.nvmlDeviceGetMemoryInfo(h).used) for h in handles)
    except nv.NVMLError:
        return None


def describe_devices() -> str | None:
    """``"N x NAME"`` of the host's GPUs, or None without NVML."""
    nv, handles = nvml(), device_handles()
    if nv is None or not handles:
        return None
    return f"{len(handles)} x {nv.nvmlDeviceGetName(handles[0])}"


def compute_capability(index: int = 0) -> tuple[int, int] | None:
    """The GPU's CUDA compute capability, e.g. (9, 0) for an H200; None without NVML."""
    nv, handles = nvml(), device_handles()
    if nv is None or len(handles) <= index:
        return None
    try:
        major, minor = nv.nvmlDeviceGetCudaComputeCapability(handles[index])
        return int(major), int(minor)
    except Exception:
        return None


class PeakMemorySampler:
    """GPU memory used, sampled in a thread while the block runs (``read``: device 0 by default): the peak
    and the series of (seconds since the start, bytes). Without NVML both stay empty."""

    def __init__(self, read: Callable[[], int | None] = device_used_bytes, every_s: float = 0.5) -> None:
        self.read, self.every_s = read, every_s
        self.peak: int | None = None
        self.series: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._t0 = time.monotonic()

    def _loop(self) -> None:
        while not self._stop.is_set():
            used = self.read()
            if used is not None:
                self.peak = max(self.peak or 0, used)
                self.series.append((round(time.monotonic() - self._t0, 1), used))
            self._stop.wait(self.every_s)

    def __enter__(self) -> PeakMemorySampler:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
