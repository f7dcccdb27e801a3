"""serve-profile.yaml pins the KV cache the gates validated (quantize_serve/serve_profile/pinned.py).

The GPU figures are the 8B AWQ fp8-KV boot measured on the H200 (benchmarks/results/capacity/h200.json:
122,155 blocks of 16 tokens, "Available KV cache memory: 119.29 GiB", utilization 0.90 of
139.80 GiB). The boots themselves are covered by the flow tests (CPU) and benchmarks/h200.py (GPU).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from quantize_serve.capacity.measure import GIB, CapacityConfig
from quantize_serve.capacity.planner import GPU_MEMORY_BYTES
from quantize_serve.recipe.model import ServeSection
from quantize_serve.serve_profile.pinned import block_bytes, pinned_spec, write_serving_profile
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.server import ServerSpec
from tests.conftest import ROOT

LLAMA8B = json.loads((ROOT / "benchmarks/configs/llama-3-8b.json").read_text())
H200 = 150109880320  # what CUDA sees of the lent H200 (NVML total less the driver's reserve)


@pytest.fixture
def h200_fp8() -> CapacityConfig:
    return CapacityConfig(
        name=Boot.PRODUCTION,
        kv_cache_dtype="fp8",
        weights_bytes=int(5.46 * GIB),
        kv_cache_memory_bytes=int(119.29 * GIB),
        kv_cache_tokens=1_954_480,
        num_blocks=122_155,
        block_size=16,
        max_model_len=8192,
        max_concurrency=238.58,
        boot_seconds=60.0,
    )


def gpu_spec(**serve) -> ServerSpec:
    return ServerSpec(
        model_dir="/ckpt",
        kv_cache_dtype="fp8",
        serve=ServeSection(
            max_model_len=8192, max_num_seqs=256, max_num_batched_tokens=8192, enforce_eager=True, **serve
        ),
    )


def test_pinned_bytes_are_the_validated_blocks_exactly(h200_fp8):
    assert block_bytes(h200_fp8, LLAMA8B, 1) == 16 * 65_536  # 16 tokens x 2 x 32 layers x 8 heads x 128 x 1 B
    pinned = pinned_spec(gpu_spec(), h200_fp8, LLAMA8B)
    assert pinned.kv_cache_memory_bytes == 122_155 * 16 * 65_536 == 128_088_801_280  # 119.29 GiB
    # vLLM allocates floor(bytes / block bytes) blocks: the same 122,155 on any GPU with room for them
    assert pinned.kv_cache_memory_bytes // block_bytes(h200_fp8, LLAMA8B, 1) == h200_fp8.num_blocks
    # TP 2: each rank holds 4 of the 8 KV heads, and vLLM's blocks are per rank
    assert block_bytes(h200_fp8, LLAMA8B, 2) == 16 * 32_768


def test_gpu_profile_keeps_the_utilization_guard_and_cpu_does_not(h200_fp8):
    config = pinned_spec(gpu_spec(gpu_memory_utilization=0.85), h200_fp8, LLAMA8B).vllm_config()
    # vLLM on CUDA still refuses to start with less than utilization x total free, pinned or not
    assert config["kv-cache-memory-bytes"] == 128_088_801_280 and config["gpu-memory-utilization"] == 0.85
    assert config["max-num-seqs"] == 256  # always explicit: vLLM's default is 1024 on large GPUs
    cpu = ServerSpec(
        model_dir="/ckpt",
        serve=ServeSection(max_model_len=512, memory_budget="8MiB"),
        kv_cache_memory_bytes=4096,
    ).vllm_config()
    assert cpu["kv-cache-memory-bytes"] == 4096 and "gpu-memory-utilization" not in cpu


def test_profile_file_report_and_elsewhere_on_the_h200(h200_fp8, tmp_path):
    profile = write_serving_profile(
        gpu_spec(),
        h200_fp8,
        LLAMA8B,
        tmp_path / "serve-profile.yaml",
        model="org/llama-3-8b-awq",
        device_memory_bytes=H200,
    )
    text = Path(profile.path).read_text()
    mapping = yaml.safe_load(text)
    assert mapping["model"] == "org/llama-3-8b-awq" and mapping["kv-cache-memory-bytes"] == 128_088_801_280
    assert mapping["gpu-memory-utilization"] == 0.9 and mapping["max-num-seqs"] == 256
    assert "--kv-cache-memory-bytes 128088801280" in profile.command and "# Use: vllm serve --config" in text
    # needs = what the boot used besides KV (0.90 x 139.80 - 119.29 = 6.53 GiB) + the pinned KV
    assert profile.needs_free_bytes / GIB == pytest.approx(0.9 * H200 / GIB - 119.29 + 119.292, abs=0.01)
    rows = {e.device: e for e in profile.elsewhere}
    assert list(rows) == ["this GPU (validated)", "this GPU, 25% taken", "h100-80gb"]
    assert rows["this GPU (validated)"].utilization_sized.startswith("1,954,480 tokens (+0.0%)")
    assert rows["this GPU (validated)"].pinned == "1,954,480 tokens (as validated)"
    taken = rows["this GPU, 25% taken"]  # 104.85 GiB free < 0.90 x 139.80: vLLM refuses; at 0.75 it boots
    assert taken.utilization_sized.startswith("refuses at 0.90 (needs 125.82 GiB free); at 0.75: ")
    assert "tokens (-17.6%)" in taken.utilization_sized  # the batch production would silently lose
    assert "fails at boot: needs 125.8" in taken.pinned  # the pinned profile says so at boot instead
    h100 = rows["h100-80gb"]
    assert h100.total_bytes == int(GPU_MEMORY_BYTES["h100-80gb"]) and "fails at boot" in h100.pinned
    assert h100.utilization_sized == "1,066,784 tokens (-45.4%)"  # 0.90 x 79.6 GiB - the same 6.53 GiB
    md = profile.markdown()
    assert "`--kv-cache-memory-bytes 128088801280` = 1,954,480 tokens" in md and "| h100-80gb |" in md
