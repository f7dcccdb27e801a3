"""The host-memory tier of vLLM's prefix cache (``serve.kv_offload``, vLLM's native KV offloading): how many
tokens it holds, by vLLM 0.26's own arithmetic, how much host memory it pins, and what it is for.

vLLM's native tier (``--kv-offloading-backend native --kv-offloading-size X``) is its ``OffloadingConnector``
with the ``CPUOffloadingSpec``. ``X`` GiB is the total over every rank (``cpu_bytes_to_use = X * 2**30``).
The spec counts whole chunks of GPU blocks (``v1/kv_offload/cpu/spec.py``; one GPU block a chunk by
default)::

    bytes_per_chunk = world_size x block_size x (KV bytes of one token on one rank)
    chunks          = floor(X * 2**30 / bytes_per_chunk)
    tokens          = chunks x block_size

A rank holds ``max(1, kv_heads // TP)`` KV heads (vLLM replicates KV heads when TP exceeds them: each rank
then stores a copy, and the tier holds TP / kv_heads times fewer tokens). Every rank pins its share
(``chunks x bytes_per_chunk / world_size``) at vLLM's start, zero-filled, outside the GPU memory vLLM
profiles.

The tier is write-through: every prompt's full blocks are stored as they are computed, so it holds copies of
what the GPU cache holds. The distinct tokens the two keep together are max(GPU, host), not their sum, and a
tier no larger than the GPU's cache keeps nothing the GPU evicted. It does not raise the number of sequences
decoding at once (those need their blocks on the GPU): it saves recomputing prefixes the GPU no longer holds.

Multi-latent attention: each rank holds the whole latent, ``(kv_lora_rank + qk_rope_head_dim)`` elements a
layer, replicated on every TP rank in vLLM 0.26 (:func:`mla_bytes_per_token_per_rank`). The planner's
:class:`~quantize_serve.capacity.model_shape.ModelShape` refuses MLA configs, so :func:`host_tier_tokens`
never sees one; the arithmetic is here for when it does.

Pure Python and psutil (the host's memory), as the rest of the planner.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import psutil
from pydantic import BaseModel, ConfigDict, Field

from quantize_serve.capacity.planner import GiB, KVCacheDtype, ModelShape, kv_bytes_per_token_per_gpu
from quantize_serve.recipe.model import KVOffloadSection

__all__ = [
    "HOST_TIER_MARGIN_BYTES",
    "HOST_TIER_MARGIN_SHARE",
    "HOST_TIER_PURPOSE",
    "HostMemory",
    "HostTier",
    "HostTierSizing",
    "host_tier_tokens",
    "mla_bytes_per_token_per_rank",
    "plan_host_tier",
    "tokens_in",
]

# What the tier is for, in the words the planner's table and the report use
HOST_TIER_PURPOSE = "for prefix reuse, not concurrency: it does not raise the sequences decoding at once"

# Host memory the tier may not take: vLLM pins the whole tier at its start, and the host still needs memory
# for the serving processes (the API server, the engine core and each rank's worker with its CUDA context),
# for the checkpoint read while it loads (safetensors through the page cache) and for this pipeline itself
# (lm-eval, the stress clients). 8 GiB covers those on one GPU; a share of the total (10 %) scales with
# larger hosts, whose TP workers and checkpoints are larger too. The larger of the two is kept free.
HOST_TIER_MARGIN_BYTES = 8 * GiB
HOST_TIER_MARGIN_SHARE = 0.10


class HostMemory(BaseModel):
    """The memory this process may use: the kernel's (psutil: MemAvailable and MemTotal on Linux), within its
    cgroup's limit where one is set (a container: /proc/meminfo there can be the whole machine's)."""

    model_config = ConfigDict(frozen=True)

    available_bytes: int
    total_bytes: int
    cgroup_limit_bytes: int | None = None  # the cgroup's memory limit, where it is below the machine's

    @classmethod
    def read(cls) -> HostMemory:
        memory = psutil.virtual_memory()
        available, total = int(memory.available), int(memory.total)
        cgroup = cgroup_memory()
        if cgroup is None or cgroup[0] >= total:
            return cls(available_bytes=available, total_bytes=total)
        limit, used = cgroup
        return cls(
            available_bytes=max(0, min(available, limit - used)), total_bytes=limit, cgroup_limit_bytes=limit
        )

    @property
    def margin_bytes(self) -> int:
        """What the tier must leave free: :data:`HOST_TIER_MARGIN_BYTES` or :data:`HOST_TIER_MARGIN_SHARE` of
        the total, whichever is larger."""
        return max(HOST_TIER_MARGIN_BYTES, int(HOST_TIER_MARGIN_SHARE * self.total_bytes))

    @property
    def room_bytes(self) -> int:
        """The most host memory a tier may pin here: available less the margin (0 when none)."""
        return max(0, self.available_bytes - self.margin_bytes)

    def share_gib(self, share: float) -> float:
        """``share`` of the available memory in GiB, rounded down to 0.1 GiB (at least 0.1: a tier of
        nothing is no tier, and the memory check then says the host has no room)."""
        return max(0.1, math.floor(share * self.available_bytes / GiB * 10) / 10)


def cgroup_memory() -> tuple[int, int] | None:
    """This process's cgroup memory limit and use in bytes (cgroup v2, else v1), or None without a limit."""
    for folder, limit_file, use_file in (
        ("/sys/fs/cgroup", "memory.max", "memory.current"),
        ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"),
    ):
        try:
            limit = Path(folder, limit_file).read_text().strip()
            used = int(Path(folder, use_file).read_text().strip())
        except (OSError, ValueError):
            continue
        return None if limit == "max" or int(limit) >= 2**60 else (int(limit), used)
    return None


class HostTierSizing(BaseModel):
    """How a ``serve.kv_offload.host_memory_share`` became the run's ``size_gib``: the host's memory when
    the run validated, for the report to show."""

    host_memory_share: float
    size_gib: float
    available_bytes: int
    total_bytes: int

    @classmethod
    def of(cls, share: float, memory: HostMemory) -> HostTierSizing:
        return cls(
            host_memory_share=share,
            size_gib=memory.share_gib(share),
            available_bytes=memory.available_bytes,
            total_bytes=memory.total_bytes,
        )

    def line(self) -> str:
        return (
            f"serve.kv_offload.size_gib {self.size_gib:.1f} GiB: host_memory_share "
            f"{self.host_memory_share:g} of the {self.available_bytes / GiB:.1f} GiB this host had available "
            "when the run validated "
            f"({self.total_bytes / GiB:.1f} GiB total)"
        )


def tokens_in(
    size_bytes: int, *, bytes_per_token_per_rank: int, world_size: int, block_size: int = 16
) -> int:
    """Tokens a tier of ``size_bytes`` (the total over ``world_size`` ranks) holds: whole chunks of one GPU
    block, each ``world_size x block_size x bytes_per_token_per_rank`` bytes (vLLM 0.26 CPUOffloadingSpec)."""
    chunk = world_size * block_size * bytes_per_token_per_rank
    return (int(size_bytes) // chunk) * block_size


def host_tier_tokens(
    size_bytes: int,
    shape: ModelShape,
    kv_cache_dtype: KVCacheDtype,
    tensor_parallel_size: int,
    block_size: int = 16,
) -> int:
    """Tokens vLLM's native tier of ``size_bytes`` (``--kv-offloading-size`` in bytes: all ranks) holds for
    ``shape`` at ``tensor_parallel_size``: per-rank KV bytes from the planner's
    :func:`~quantize_serve.capacity.planner.kv_bytes_per_token_per_gpu` (16-bit or fp8 elements; its
    ``ceil(kv_heads / TP)`` heads a rank is vLLM's ``max(1, kv_heads // TP)`` wherever vLLM can load the
    model: TP divides the KV heads or is a multiple of them).

    Llama-3-8B (32 layers, 8 KV heads of 128): 10 GiB hold 163,840 tokens with an fp8 KV cache and 81,920
    with a 16-bit one, at TP 1, 2, 4 or 8 alike."""
    per_rank = kv_bytes_per_token_per_gpu(
        shape, kv_cache_dtype=kv_cache_dtype, tensor_parallel_size=tensor_parallel_size
    )
    return tokens_in(
        size_bytes, bytes_per_token_per_rank=per_rank, world_size=tensor_parallel_size, block_size=block_size
    )


def mla_bytes_per_token_per_rank(
    num_layers: int, kv_lora_rank: int, qk_rope_head_dim: int, element_bytes: int
) -> int:
    """KV bytes one token takes on each rank under multi-latent attention (vLLM 0.26's MLA page: the
    compressed latent and the rope key, no K/V pair), the same on every TP rank: the latent is replicated,
    so the tier's tokens fall with TP (``tokens_in(..., world_size=TP)``)."""
    return num_layers * (kv_lora_rank + qk_rope_head_dim) * element_bytes


class HostTier(BaseModel):
    """The production configuration's host-memory tier as the planner predicts it."""

    backend: Literal["native"] = "native"
    size_gib: float = Field(description="serve.kv_offload.size_gib: vLLM's --kv-offloading-size, all ranks")
    size_bytes: int = Field(description="size_gib x 2**30, as vLLM counts it")
    pinned_bytes: int = Field(description="what the ranks pin together: whole chunks of the size")
    tensor_parallel_size: int
    block_size: int
    bytes_per_token: int = Field(
        description="host bytes a token takes over all ranks (KV heads replicated when TP exceeds them)"
    )
    tokens: int = Field(description="tokens the tier holds (vLLM's block arithmetic)")
    gpu_tokens: int = Field(description="the production configuration's GPU KV cache tokens")
    distinct_tokens_beyond_gpu: int = Field(
        description="max(0, tokens - gpu_tokens): the tier is write-through, so it holds copies of the GPU's "
        "blocks; what the two keep apart from each other is max(gpu, host) tokens"
    )
    note: str = HOST_TIER_PURPOSE
    warning: str | None = Field(None, description="set when the tier holds no more tokens than the GPU")

    @property
    def pinned_bytes_per_rank(self) -> int:
        return self.pinned_bytes // self.tensor_parallel_size

    def lines(self, label: str) -> list[str]:
        """What the tier of configuration ``label`` holds, beyond the GPU, and what it is for (the plan, the
        report)."""
        tp = self.tensor_parallel_size
        per_rank = f", {self.pinned_bytes_per_rank / GiB:.2f} GiB per rank" if tp > 1 else ""
        lines = [
            f"- host tier of {label} (serve.kv_offload, {self.backend}): {self.size_gib:g} GiB of pinned "
            f"host memory{per_rank}, {self.tokens:,} tokens by vLLM's block arithmetic, "
            f"{self.distinct_tokens_beyond_gpu:,} of them beyond the GPU's {self.gpu_tokens:,} "
            f"(write-through: it also holds copies of the GPU's blocks); {self.note}"
        ]
        if self.warning:
            lines.append(f"- warning: host tier: {self.warning}")
        return lines


def plan_host_tier(
    kv_offload: KVOffloadSection,
    shape: ModelShape,
    *,
    kv_cache_dtype: KVCacheDtype,
    tensor_parallel_size: int,
    gpu_tokens: int,
    block_size: int = 16,
) -> HostTier:
    """The tier of ``kv_offload`` (backend native, size_gib resolved) beside a GPU cache of ``gpu_tokens``.
    Raises ValueError for a tier vLLM does not size (lmcache) or one not sized yet (host_memory_share)."""
    if kv_offload.backend != "native" or kv_offload.size_bytes is None:
        raise ValueError("only a native tier with its size_gib resolved is planned")
    tp = tensor_parallel_size
    per_rank = kv_bytes_per_token_per_gpu(shape, kv_cache_dtype=kv_cache_dtype, tensor_parallel_size=tp)
    size = kv_offload.size_bytes
    tokens = tokens_in(size, bytes_per_token_per_rank=per_rank, world_size=tp, block_size=block_size)
    warning = None
    if tokens <= gpu_tokens:
        above = math.ceil(gpu_tokens * tp * per_rank / GiB * 10) / 10
        warning = (
            f"the tier holds copies of what the GPU holds; size it above {above:.1f} GiB to keep prefixes "
            "the GPU evicted"
        )
    return HostTier(
        size_gib=kv_offload.size_gib,
        size_bytes=size,
        pinned_bytes=tokens * tp * per_rank,
        tensor_parallel_size=tp,
        block_size=block_size,
        bytes_per_token=tp * per_rank,
        tokens=tokens,
        gpu_tokens=gpu_tokens,
        distinct_tokens_beyond_gpu=max(0, tokens - gpu_tokens),
        warning=warning,
    )
