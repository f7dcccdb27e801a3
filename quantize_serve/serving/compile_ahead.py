"""The production boot's graphs compiled ahead, beside the base's accuracy run.

A first release quantizes beside its base's accuracy run (calibration.beside_base), so the checkpoint is saved
while the base is still scored. The production boot (c) then boots after the base and compiles its graphs
from an empty cache: on one H100, 30.0 s of torch.compile and a 90.0 s boot, where the same boot with its
graphs in the cache took 7.9 s and 50.5 s (benchmarks/results/h200_release_time.json, first_release and
re_release_warm). vLLM keys the cache on the model as named, its config and its KV dtype, not on the memory
it is given (CacheConfig.compute_hash ignores gpu_memory_utilization and kv_cache_memory_bytes;
benchmarks/results/compile_cache_key.json): (c)'s settings booted in the memory the base leaves compile
the entry (c) itself then loads.

That boot starts as the checkpoint is saved, while the base's accuracy run goes on, and stops once healthy;
if the base's run ends first, as soon as its graphs are saved, so the release never waits longer than (c)
would have spent compiling them. It never fails the release: a boot that fails leaves (c) to compile as
before, and says why.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from quantize_serve.core.errors import ServerBootError
from quantize_serve.core.model_files import GIB
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.server import ServerSpec, vllm_server
from quantize_serve.serving.vllm_log import graphs_cached, read_log

# What the compiling boot leaves free beside the base: its own CUDA context before vLLM reads the free memory
# (~0.5 GiB) and what the base's accuracy run may still take from the device as it serves
MARGIN_BYTES = 2 * GIB


def compile_log(run_dir: Path) -> Path:
    """Where the boot that compiles ahead logs, beside the boots' own logs (tasks/serve.py boot_log)."""
    return run_dir / f"vllm-{Boot.PRODUCTION}-compile-ahead.log"


class Until:
    """When the boot that compiles ahead may stop before it is healthy: once its graphs are saved after
    :meth:`base_scored` (the device is wanted for the production boot), or at once after :meth:`abandon`
    (the run failed)."""

    def __init__(self) -> None:
        self._scored, self._abandoned = threading.Event(), threading.Event()

    def base_scored(self) -> None:
        self._scored.set()

    def abandon(self) -> None:
        self._abandoned.set()

    @property
    def ended(self) -> str | None:
        """Why nothing is to be compiled ahead any more, if so."""
        if self._abandoned.is_set():
            return "the run stopped"
        return "the base's accuracy run had ended: nothing to overlap" if self._scored.is_set() else None

    def enough(self, log_path: Path) -> bool:
        return self._abandoned.is_set() or (self._scored.is_set() and graphs_cached(read_log(log_path)))


class CompiledAhead(BaseModel):
    """What the boot that compiles ahead did: ``healthy`` (it booted whole), ``compiled`` (stopped once its
    graphs were saved), ``stopped`` (abandoned before), ``failed`` or ``skipped``; ``detail``: why."""

    outcome: Literal["healthy", "compiled", "stopped", "failed", "skipped"]
    seconds: float = 0.0
    detail: str = ""

    def line(self) -> str:
        """The run log's and the report's sentence."""
        done = {
            "healthy": "its graphs compiled beside the base's accuracy run",
            "compiled": "its graphs compiled beside the base's accuracy run (stopped once saved)",
            "stopped": "its compile beside the base's accuracy run stopped before the graphs were saved",
            "failed": "its compile beside the base's accuracy run failed (it compiles its own)",
            "skipped": "its graphs not compiled ahead",
        }[self.outcome]
        return (
            done
            + (f" in {self.seconds:.0f} s" if self.seconds else "")
            + (f": {self.detail}" if self.detail else "")
        )


def utilization_ahead(
    free_bytes: int | None,
    usable_bytes: int | None,
    *,
    recipe_utilization: float,
    fits: Callable[[float], bool],
) -> tuple[float | None, str]:
    """The gpu_memory_utilization the production settings compile ahead at beside the base (None: they do
    not), and why: what the device has free less :data:`MARGIN_BYTES`, two decimals, at most the recipe's,
    where ``fits(u)`` (the planner: the weights, the activations and one max_model_len request's KV cache)."""
    if free_bytes is None or usable_bytes is None:
        return None, "no GPU: on a CPU the compile would take the cores the base's accuracy run scores on"
    room = f"{free_bytes / GIB:.1f} GiB free beside the base"
    utilization = min(recipe_utilization, math.floor((free_bytes - MARGIN_BYTES) / usable_bytes * 100) / 100)
    if utilization <= 0 or not fits(utilization):
        return None, f"{room}: the production settings do not fit in it"
    return utilization, f"{room}, at gpu_memory_utilization {utilization:.2f}"


def compile_ahead(
    spec: ServerSpec, log_path: Path, until: Until, *, log: Callable[[str], None] = print
) -> CompiledAhead:
    """Boot ``spec`` (the production settings in the memory the base leaves) until it is healthy or
    ``until`` says enough, then stop it; its log at ``log_path``. A boot that fails is said, not raised."""
    started = time.monotonic()
    log(f"compiling the production boot's graphs ahead, beside the base's scoring: {spec.serve_command()}")
    healthy, detail = False, ""
    try:
        with vllm_server(spec, log_path=log_path, enough=lambda: until.enough(log_path)) as server:
            healthy = server.healthy()
    except ServerBootError as exc:
        detail = str(exc).splitlines()[0]
    if healthy:
        outcome = "healthy"
    elif graphs_cached(read_log(log_path)):  # graphs saved before a failure stay in the cache
        outcome, detail = "compiled", detail and f"the boot failed after: {detail}"
    else:
        outcome = "failed" if detail else "stopped"
    done = CompiledAhead(outcome=outcome, seconds=round(time.monotonic() - started, 1), detail=detail)
    log(f"the production boot: {done.line()}")
    return done
