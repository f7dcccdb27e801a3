"""The server watched while traffic runs: ``/health``, ``/metrics`` gauges (KV usage, preemptions,
queue), its process tree's memory and GPU memory (stress and soak)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import psutil

from quantize_serve.core.processes import process_tree
from quantize_serve.serving import gpu
from quantize_serve.serving.metrics import read_gauges
from quantize_serve.serving.server import RunningServer

if TYPE_CHECKING:
    import aiohttp

# Short requests on a fast CPU finish between slower samples: on the 2-core CPU the tiny recipes' peak step
# lasts ~0.5 s, and at 0.2 s the ticks (slower under load) once all missed it (the idle-server check failed)
SAMPLE_EVERY_S = 0.1
HEALTH_FAILURES_DEAD = 3  # consecutive /health failures that mean "dead"


WATCHED = (
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "process_start_time_seconds",
)


class Sampler:
    def __init__(self, server: RunningServer, alive: Callable[[], bool]) -> None:
        self.server, self.alive = server, alive
        self.dead = asyncio.Event()
        self.death_reason = ""
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.peaks: dict[str, float] = {}
        self.restarts = 0
        self.health_failures = 0
        self.samples: list[dict] = []
        self.baseline = asyncio.Event()

    async def tick(self, session: aiohttp.ClientSession) -> None:
        import aiohttp  # heavy (~0.15 s): imported where requests are sent

        now = {"t": round(time.monotonic(), 2)}
        if not self.alive():
            return self.die(f"the server process (pid {self.server.pid}) is gone")
        try:
            async with session.get(
                self.server.base_url + "/health", timeout=aiohttp.ClientTimeout(total=5)
            ) as r:
                healthy = r.status == 200
            async with session.get(
                self.server.base_url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)
            ) as r:
                metrics = read_gauges(await r.text(), WATCHED) if r.status == 200 else {}
        except (aiohttp.ClientError, TimeoutError):
            healthy, metrics = False, {}
        self.health_failures = 0 if healthy else self.health_failures + 1
        if self.health_failures >= HEALTH_FAILURES_DEAD:
            return self.die(f"/health failed {self.health_failures} times in a row")
        start = metrics.get("process_start_time_seconds")
        if start and self.first.get("process_start_time_seconds", start) != start:
            self.restarts += 1
            self.first["process_start_time_seconds"] = start
        procs = process_tree(self.server.pid)
        rss = 0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                rss += p.memory_info().rss
        now |= metrics
        now["rss_bytes"] = rss or None
        now["gpu_memory_bytes"] = gpu.used_bytes({p.pid for p in procs})
        for key, value in now.items():
            if value is not None and key != "t":
                self.first.setdefault(key, value)
                self.last[key] = value
                self.peaks[key] = max(self.peaks.get(key, value), value)
        self.samples.append(now)

    def still_up(self) -> bool:
        """A check between phases, without waiting for the next tick."""
        if not self.dead.is_set() and not self.alive():
            self.die(f"the server process (pid {self.server.pid}) is gone")
        return not self.dead.is_set()

    def die(self, reason: str) -> None:
        if not self.dead.is_set():
            self.death_reason = reason
            self.dead.set()

    async def run(self, stop: asyncio.Event) -> None:
        import aiohttp  # heavy (~0.15 s): imported where requests are sent

        try:
            async with aiohttp.ClientSession() as session:
                while not stop.is_set() and not self.dead.is_set():
                    await self.tick(session)
                    self.baseline.set()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), SAMPLE_EVERY_S)
                if not self.dead.is_set():
                    await self.tick(session)  # counters after the last request
        finally:
            self.baseline.set()

    def peak(self, key: str) -> float | None:
        return self.peaks.get(key)

    def delta(self, key: str) -> float | None:
        return self.last[key] - self.first[key] if key in self.last else None
