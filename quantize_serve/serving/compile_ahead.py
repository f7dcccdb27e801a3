"""The production boot's graphs compiled ahead, beside the base's accuracy run.

A first release quantizes beside its base's accuracy run (calibration.beside_base), so the checkpoint is saved
while the base is still scored. The production boot (c) then boots after the base and compiles its graphs
from an empty cache: on one H100, 30.0 s of torch.compile and a 90.0 s boot, where the same boot with its
graphs in the cache took 7.9 s and 50.5 s (benchmarks/results/release-time/h200_release_time.json,
first_release and
re_release_warm). vLLM keys the cache on the model as named, its config and its KV dtype, not on the memory
it is given (CacheConfig.compute_hash ignores gpu_memory_utilization and kv_cache_memory_bytes;
benchmarks/results/release-time/compile_cache_key.json): (c)'s settings booted in the least memory they fit
in, beside
the base, compile the entry (c) itself then loads.

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

# Above the least memory the planner fits the production settings in: its error, and the compiling process's
# own CUDA context before vLLM reads the free memory it checks its budget against
HEADROOM_BYTES = 1 * GIB


def compile_log(run_dir: Path, label: str = Boot.PRODUCTION.value) -> Path:
    """Where the boot that compiles ahead logs, beside the boots' own logs (tasks/boot.py boot_log);
    ``label``: the production boot's name by what it runs (capacity.boot_label)."""
    return run_dir / f"vllm-{label}-compile-ahead.log"


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


def kept_for_base_bytes(base_config: dict, max_num_batched_tokens: int) -> int:
    """What the base's accuracy run keeps free beside the boot that compiles ahead: a step's prompt logprobs
    over the vocabulary in fp32 (the batched tokens x the vocabulary x 4 B: 3.9 GiB for Llama-3-8B at 8,192
    tokens), which may fall outside the budget vLLM profiled for the base, and a GiB."""
    return max_num_batched_tokens * int(base_config.get("vocab_size", 0)) * 4 + GIB


def utilization_ahead(
    free_bytes: int | None,
    usable_bytes: int | None,
    *,
    recipe_utilization: float,
    fits: Callable[[float], bool],
    keep_free_bytes: int,
) -> tuple[float | None, str]:
    """The gpu_memory_utilization the production settings compile ahead at beside the base (None: they do
    not), and why: the least that ``fits`` (the planner: the weights, the activations, the CUDA graphs and
    one max_model_len request's KV cache), two decimals, raised by :data:`HEADROOM_BYTES`; only where the
    device's free memory holds it and still ``keep_free_bytes`` for the base's accuracy run. The compile needs
    no more: the KV cache's size is not in vLLM's key."""
    if free_bytes is None or usable_bytes is None:
        return None, "no GPU: on a CPU the compile would take the cores the base's accuracy run scores on"
    room = f"{free_bytes / GIB:.1f} GiB free beside the base"
    steps = range(1, math.floor(recipe_utilization * 100) + 1)
    least = next((step / 100 for step in steps if fits(step / 100)), None)
    if least is None:
        return None, f"{room}: the planner fits the production settings in no utilization up to the recipe's"
    utilization = min(
        recipe_utilization, round(least + math.ceil(HEADROOM_BYTES / usable_bytes * 100) / 100, 2)
    )
    need = math.ceil(utilization * usable_bytes)
    if need + keep_free_bytes > free_bytes:
        return None, (
            f"{room}: the production settings need {need / GIB:.1f} GiB (gpu_memory_utilization "
            f"{utilization:.2f}) and the base's accuracy run keeps {keep_free_bytes / GIB:.1f}"
        )
    return utilization, (
        f"{room}: at gpu_memory_utilization {utilization:.2f} ({need / GIB:.1f} GiB), "
        f"{(free_bytes - need) / GIB:.1f} GiB left to the base's accuracy run"
    )


def compile_ahead(
    spec: ServerSpec, log_path: Path, until: Until, *, log: Callable[[str], None] = print
) -> CompiledAhead:
    """Boot ``spec`` (the production settings in the least memory they fit in) until it is healthy or
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
