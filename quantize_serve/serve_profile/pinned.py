"""The production serving profile: the validated boot's settings, with its KV cache pinned in bytes.

A boot sized by ``gpu_memory_utilization`` gets whatever KV memory is left, on *that* GPU, after
the weights, activations and overheads: the same profile gives fewer tokens on a smaller GPU, or
after someone lowers the utilization to start next to another process. So ``serve-profile.yaml``
pins ``--kv-cache-memory-bytes`` to exactly the blocks the gates validated (blocks x the bytes one
block takes per GPU; vLLM allocates floor(bytes / block bytes) blocks, so the same bytes give the
same blocks on every GPU). A GPU without room for them fails at boot, never silently smaller.

On a GPU the profile keeps ``gpu_memory_utilization`` too: vLLM still refuses to start with less
than that fraction of the device free, pinned or not (vLLM 0.26, ``request_memory``). The report
shows what a profile sized by utilization, and this one, get on other GPUs or on this GPU partly
taken: :func:`elsewhere`, from the validated boot's measured non-KV memory and the model's shape.
"""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel, Field

from quantize_serve.capacity import planner
from quantize_serve.capacity.measure import CapacityConfig
from quantize_serve.core.model_files import GIB
from quantize_serve.serve_profile.output import write_profile
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.server import ServerSpec

TAKEN_SHARE = 0.25  # "this GPU, partly taken": a quarter of it held by another process at boot


class Elsewhere(BaseModel):
    """What the production boot gets on one device at one amount of free memory."""

    device: str
    total_bytes: int
    free_bytes: int
    utilization_sized: str = Field(description="what a profile sized by gpu_memory_utilization gets")
    pinned: str = Field(description="what serve-profile.yaml (KV bytes pinned) gets")


class ServingProfile(BaseModel):
    path: str
    command: str
    kv_cache_memory_bytes: int = Field(description="pinned, per GPU: the validated blocks x block bytes")
    kv_cache_tokens: int
    needs_free_bytes: int | None = Field(
        default=None, description="GPU: free memory per GPU the pinned boot needs (measured non-KV + KV)"
    )
    elsewhere: list[Elsewhere] = Field(default_factory=list)

    def markdown(self) -> str:
        lines = [
            f"`{Path(self.path).name}` pins the KV cache the gates validated: "
            f"`--kv-cache-memory-bytes {self.kv_cache_memory_bytes}` = {self.kv_cache_tokens:,} tokens "
            "on every GPU with room for them; a GPU without that room fails at boot instead of serving "
            "a smaller batch."
        ]
        if self.needs_free_bytes is not None:
            lines[0] += f" It needs {self.needs_free_bytes / GIB:.2f} GiB free per GPU."
        if self.elsewhere:
            lines += [
                "",
                "| GPU | free at boot | sized by gpu_memory_utilization | pinned (serve-profile.yaml) |",
                "|---|---:|---|---|",
            ]
            lines += [
                f"| {e.device} | {e.free_bytes / GIB:.2f} of {e.total_bytes / GIB:.2f} GiB | "
                f"{e.utilization_sized} | {e.pinned} |"
                for e in self.elsewhere
            ]
            lines += [
                "",
                "Other GPUs: the validated boot's measured non-KV memory (weights, activations, "
                "overheads) and the model's KV bytes per token, not measured boots.",
            ]
        return "\n".join(lines)


def block_bytes(config: CapacityConfig, base_config: dict, tensor_parallel_size: int) -> int:
    """The bytes one KV block of ``config`` takes on one GPU of the TP group."""
    kv = "fp8" if config.kv_cache_dtype.startswith("fp8") else "auto"
    shape = planner.ModelShape.from_config(base_config)
    return config.block_size * planner.kv_bytes_per_token_per_gpu(
        shape, kv_cache_dtype=kv, tensor_parallel_size=tensor_parallel_size
    )


def pinned_spec(
    spec: ServerSpec, config: CapacityConfig, base_config: dict, *, per_block: int | None = None
) -> ServerSpec:
    """``spec`` with ``--kv-cache-memory-bytes`` = the measured blocks x block bytes (``per_block``)."""
    per_block = per_block or block_bytes(config, base_config, spec.serve.tensor_parallel_size)
    return spec.model_copy(update={"kv_cache_memory_bytes": config.num_blocks * per_block})


def needs_free_bytes(
    config: CapacityConfig, *, per_block: int, gpu_memory_utilization: float, device_memory_bytes: int
) -> int:
    """Free memory per GPU the pinned boot needs: what the validated boot used besides its KV cache
    (the utilization budget less the KV memory vLLM logged) plus the pinned KV bytes. vLLM logs the
    available KV memory in hundredths of a GiB, and the allocated blocks fit in it: at least that."""
    pinned = config.num_blocks * per_block
    available = max(config.kv_cache_memory_bytes, pinned)
    return math.ceil(gpu_memory_utilization * device_memory_bytes) - available + pinned


def elsewhere(
    config: CapacityConfig,
    *,
    per_block: int,
    needs: int,
    gpu_memory_utilization: float,
    device_memory_bytes: int,
) -> list[Elsewhere]:
    """The production boot on this GPU idle (what was validated) and partly taken, and on the
    planner's other GPUs. ``config`` is the validated boot sized by utilization (GPU accounting);
    ``needs``: the free bytes per GPU the pinned boot needs (:func:`needs_free_bytes`)."""
    u, total = gpu_memory_utilization, device_memory_bytes
    non_kv = needs - config.num_blocks * per_block  # weights + activations + overheads
    rows = [
        ("this GPU (validated)", total, total),
        (f"this GPU, {TAKEN_SHARE:.0%} taken", total, int(total * (1 - TAKEN_SHARE))),
    ]
    rows += [
        (name, int(size), int(size))
        for name, size in planner.GPU_MEMORY_BYTES.items()
        if abs(size - total) > GIB
    ]

    def tokens(budget: int) -> int:
        return max(0, budget - non_kv) // per_block * config.block_size

    out = []
    for device, size, free in rows:
        util = u if free >= math.ceil(u * size) else math.floor(100 * free / size) / 100
        lowered = (
            "" if util == u else f"refuses at {u:.2f} (needs {u * size / GIB:.2f} GiB free); at {util:.2f}: "
        )
        got = config.kv_cache_tokens if free == size == total else tokens(math.ceil(util * size))
        change = (got - config.kv_cache_tokens) / config.kv_cache_tokens
        sized = lowered + (
            f"{got:,} tokens ({change:+.1%})"
            if got >= config.max_model_len
            else "no room for one request of max_model_len: refuses to start"
        )
        if math.ceil(util * size) >= needs:
            pinned = lowered + f"{config.kv_cache_tokens:,} tokens (as validated)"
        else:
            pinned = (
                lowered + f"fails at boot: needs {needs / GIB:.2f} GiB free, at most {util * size / GIB:.2f}"
            )
        out.append(
            Elsewhere(
                device=device, total_bytes=size, free_bytes=free, utilization_sized=sized, pinned=pinned
            )
        )
    return out


def write_serving_profile(
    spec: ServerSpec,
    config: CapacityConfig,
    base_config: dict,
    path: str | Path,
    *,
    model: str,
    device_memory_bytes: int | None,
) -> ServingProfile:
    """Write ``serve-profile.yaml`` for the validated production boot (``spec``, measured as ``config``),
    its KV cache pinned; ``device_memory_bytes`` (a GPU's) adds what other GPUs would get."""
    per_block = block_bytes(config, base_config, spec.serve.tensor_parallel_size)
    pinned = pinned_spec(spec, config, base_config, per_block=per_block)
    gpu = spec.kv_cache_memory_bytes is None and device_memory_bytes is not None  # sized by utilization
    u = spec.serve.gpu_memory_utilization
    needs = (
        needs_free_bytes(
            config, per_block=per_block, gpu_memory_utilization=u, device_memory_bytes=device_memory_bytes
        )
        if gpu
        else None
    )
    rows = (
        elsewhere(
            config,
            per_block=per_block,
            needs=needs,
            gpu_memory_utilization=u,
            device_memory_bytes=device_memory_bytes,
        )
        if gpu
        else []
    )
    header = [
        f"vLLM serving profile of the boot quantize-serve's gates validated ({Boot.PRODUCTION}): "
        f"{config.kv_cache_tokens:,} KV tokens,",
        f"pinned as --kv-cache-memory-bytes ({config.num_blocks:,} blocks x {per_block:,} bytes per GPU); "
        "a GPU without room for them fails at boot.",
    ]
    if needs is not None:
        header.append(f"Needs {needs / GIB:.2f} GiB free per GPU (and gpu_memory_utilization x its memory).")
    written, command = write_profile(pinned, path, model=model, header=header)
    return ServingProfile(
        path=str(written),
        command=command,
        kv_cache_memory_bytes=pinned.kv_cache_memory_bytes,
        kv_cache_tokens=config.kv_cache_tokens,
        needs_free_bytes=needs,
        elsewhere=rows,
    )
