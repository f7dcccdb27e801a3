"""Capacity stage with real vLLM boots: the three configurations, failed and cancelled boots."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.evidence import measure_boot
from quantize_serve.capacity.measure import (
    measure_capacity,
    summarize_capacity,
    with_sixteen_bit_kv,
)
from quantize_serve.core.errors import ServerBootError
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.server import ServerSpec, vllm_server
from tests.conftest import ROOT, vllm_processes_of


@pytest.mark.fp8_kv_serving  # the third configuration is the fp8 KV cache
def test_three_configurations_same_budget(awq_recipe, awq_checkpoint, base_server, awq_fp8_server, tmp_path):
    ckpt = Path(awq_checkpoint.checkpoint_dir)
    base, base_spec = base_server
    quant, quant_spec = awq_fp8_server
    a = measure_capacity(base, base_spec, name=Boot.BASE)
    b = measure_boot(awq_recipe, Boot.QUANTIZED_16BIT_KV, ckpt, log_path=tmp_path / "vllm.log")
    c = measure_capacity(quant, quant_spec, name=Boot.PRODUCTION)
    config = json.loads((ROOT / "models/tiny-llama/config.json").read_text())
    report = summarize_capacity(awq_recipe, [a, b, c], config)

    budget = int(awq_recipe.serve.memory_budget)
    for cfg in (a, b, c):
        assert cfg.weights_bytes + cfg.kv_cache_memory_bytes == budget
    assert (
        a.kv_cache_dtype == "auto" and b.kv_cache_dtype == "bfloat16" and c.kv_cache_dtype.startswith("fp8")
    )
    assert report.freed_weight_bytes > 1_000_000
    assert b.kv_cache_tokens > a.kv_cache_tokens
    assert abs(report.fp8_token_ratio - 2.0) <= 0.02
    assert all(abs(p.error_pct) <= 3 for p in report.planner)
    assert "Memory freed by quantization" in report.markdown()
    # what the flow does unless serve.sixteen_bit_kv_row is boot: (b) from (c), the boot above not needed
    derived = with_sixteen_bit_kv(c, awq_recipe, config, kv_cache_dtype=b.kv_cache_dtype, usable_bytes=None)
    assert (derived.num_blocks, derived.kv_cache_tokens) == (b.num_blocks, b.kv_cache_tokens), (derived, b)


@pytest.mark.gpu_host
def test_boot_that_cannot_fit_names_the_remedy_and_leaves_nothing(awq_recipe, base_model_dir, tmp_path):
    # 300 KiB of KV holds 300 tokens at 16-bit (1 KiB per token): 2 blocks of 128 on a CPU, 18 of 16 on a
    # GPU, not one 512-token request; vLLM estimates the longest request that fits, in whole blocks
    spec = ServerSpec(
        model_dir=str(base_model_dir),
        serve=awq_recipe.serve,
        kv_cache_dtype="auto",
        kv_cache_memory_bytes=300 * 1024,
    )
    log = tmp_path / "vllm.log"
    with pytest.raises(ServerBootError) as info:
        with vllm_server(spec, log_path=log):
            pass
    message = str(info.value)
    fits = re.search(r"largest max_model_len that fits is (\d+)\b", message)
    assert fits and 0 < int(fits.group(1)) <= 300 and int(fits.group(1)) % 16 == 0, message
    assert "serve.max_model_len" in message
    assert "ValueError: To serve at least one request" in message
    assert "last lines of the vLLM log" in message
    assert not vllm_processes_of(str(log))


CANCEL_SCRIPT = """
import signal
import sys
# Ctrl-C's default: a test run started as a background job (a detached `make test` on a GPU host) has
# SIGINT ignored, and its children inherit that (seen on an H200: the boot ran on, the test timed out)
signal.signal(signal.SIGINT, signal.default_int_handler)
from pathlib import Path
from quantize_serve.recipe.load import load_recipe
from quantize_serve.serving.spec import capacity_spec
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.server import vllm_server
r = load_recipe(sys.argv[1])
spec = capacity_spec(r, Boot.BASE, Path(sys.argv[2]))
print("booting", flush=True)
with vllm_server(spec, log_path=Path(sys.argv[3])):
    print("healthy", flush=True)
"""


@pytest.mark.gpu_host
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["cancelled", "killed"])
def test_cancelled_boot_leaves_no_process(base_model_dir, tmp_path, sig):
    """Cancellation (SIGINT -> KeyboardInterrupt -> finally) and a hard kill of the pipeline
    process (the server dies with its parent) both leave no vLLM process behind."""
    log = tmp_path / "vllm.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CANCEL_SCRIPT,
            str(ROOT / "recipes/tiny-llama-awq.yaml"),
            str(base_model_dir),
            str(log),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "api_server" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.5)  # the log's first line is the command that starts the server
    time.sleep(6)  # mid-boot: the server process and its engine are starting
    assert proc.poll() is None, "the boot ended before it could be cancelled"
    os.kill(proc.pid, sig)
    proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and vllm_processes_of(str(log)):
        time.sleep(1)
    assert not vllm_processes_of(str(log)), "a vLLM process survived the cancelled boot"
