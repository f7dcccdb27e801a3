"""ServerSpec's one builder: the boot spec of each configuration the pipeline compares (serving/boot.py), from
the recipe's serve section under its shared memory budget. The gates' boots, the capacity rows, the profile
search's probes and the boot that compiles ahead all take their spec from here."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from quantize_serve.recipe.model import Recipe
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.server import ServerSpec


def capacity_spec(
    recipe: Recipe,
    boot: Boot,
    model_dir: Path,
    *,
    weights_bytes: int | None = None,
    tensor_parallel_size: int | None = None,
    gpu_memory_utilization: float | None = None,
    as_published: bool = False,
    kv_tier: bool = True,
) -> ServerSpec:
    """The boot spec of one configuration under the recipe's (shared) budget. ``weights_bytes``: what
    the boot's weights take (default: the checkpoint's tensor bytes; a dummy boot has no checkpoint).
    ``tensor_parallel_size``: another TP than the recipe's (the base, when it needs more GPUs: BaseBoot).
    ``gpu_memory_utilization``: another than the recipe's (the base beside calibration: at_utilization).
    ``as_published``: the model named as the published profile names it, by the recipe's Hub repo id at
    its release ref (``ServerSpec.repo_id`` and ``revision``: ``hub.release_ref``; without a hub section,
    the folder): the boot's compile-cache entry is then the one production's first ``vllm serve <repo id>
    --config serve-profile.yaml`` on this host reads (serving/repo_layout.py). The production boot carries
    the host-memory tier of the prefix cache (serve.kv_offload) unless ``kv_tier`` is false (the boot the
    tier is measured against)."""
    kv_dtype = sixteen_bit_kv_dtype(model_dir) if Boot(boot).sixteen_bit_kv else recipe.serve.kv_cache_dtype
    kv_bytes = None
    if recipe.serve.memory_budget is not None:
        weights = checkpoint_tensor_bytes(model_dir) if weights_bytes is None else weights_bytes
        kv_bytes = int(recipe.serve.memory_budget) - weights
        if kv_bytes <= 0:
            kv_bytes = 1  # let vLLM refuse it with its own message (and our remedy)
    serve = recipe.serve
    if tensor_parallel_size is not None and tensor_parallel_size != serve.tensor_parallel_size:
        serve = serve.model_copy(update={"tensor_parallel_size": tensor_parallel_size})
    if gpu_memory_utilization is not None:
        serve = serve.model_copy(update={"gpu_memory_utilization": gpu_memory_utilization})
    hub = recipe.hub if as_published else None
    return ServerSpec(
        model_dir=str(model_dir),
        serve=serve,
        kv_cache_dtype=kv_dtype,
        kv_cache_memory_bytes=kv_bytes,
        repo_id=hub.repo_id if hub else None,
        revision=hub.release_ref if hub else None,
        kv_offload=recipe.serve.kv_offload if kv_tier and Boot(boot) is Boot.PRODUCTION else None,
    )


def sixteen_bit_kv_dtype(model_dir: Path) -> str:
    """The --kv-cache-dtype that gives a 16-bit KV cache for this checkpoint.

    vLLM resolves "auto" to fp8 when the checkpoint carries calibrated KV scales
    (quantization_config.kv_cache_scheme), so such a checkpoint needs its 16-bit dtype named.
    """
    config = json.loads((Path(model_dir) / "config.json").read_text())
    if (config.get("quantization_config") or {}).get("kv_cache_scheme"):
        dtype = str(config.get("dtype") or config.get("torch_dtype") or "bfloat16")
        return dtype if dtype in ("bfloat16", "float16") else "bfloat16"
    return "auto"


def checkpoint_tensor_bytes(model_dir: Path) -> int:
    """Sum of tensor data bytes in a folder's safetensors files (read from their headers)."""
    total = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with f.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        total += sum(
            end - start
            for k, v in header.items()
            if k != "__metadata__"
            for start, end in [v["data_offsets"]]
        )
    return total
