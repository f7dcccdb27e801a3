"""On the GPU: the whole flow on the tiny recipe (llm-compressor quantizes on CUDA; the three capacity
boots under vLLM's GPU accounting, each boot's memory given back before the next; the gates; the
release), and the Llama-3-8B shape measured with dummy weights (random weights: capacity, not
accuracy). The flow's own stages are what the tier checks: a separate capacity test would boot the
same three configurations again (about 4.5 minutes on an H200)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from quantize_serve.capacity.measure import FP8_PATH_OWN_BYTES
from quantize_serve.capacity.shape import measure_shape
from quantize_serve.recipe.load import load_recipe
from quantize_serve.serving import gpu
from quantize_serve.serving.boot import Boot
from tests.conftest import ROOT, local_hub_server
from tests.gpu.conftest import assert_memory_given_back

LLAMA3_8B = ROOT / "benchmarks" / "configs" / "llama-3-8b.json"
TOKENIZER = ROOT / "models" / "tiny-llama"  # a dummy boot needs a tokenizer; any will do


@pytest.mark.timeout(1200)
def test_the_whole_flow_on_the_tiny_recipe_promotes_on_the_gpu(prefect_api, idle_gpu_memory, tmp_path):
    from flows.pipeline import quantize_serve
    from quantize_serve.report.run_report import RunReport

    token = "hf_GpuTierToken0123456789abcdefghij"
    with local_hub_server(tmp_path, tokens=(token,), online=True):
        state = quantize_serve(str(ROOT / "recipes" / "tiny-llama-awq.yaml"), return_state=True)
    report = state.result(raise_on_failure=False)
    assert state.is_completed(), state.message
    assert isinstance(report, RunReport)
    assert report.decision.passed and report.release.status == "promoted"
    assert report.checkpoint.device.startswith("cuda"), report.checkpoint.device  # quantized on the GPU
    assert report.checkpoint.placement.startswith("model and calibration activations on the device")
    # the three capacity boots, under vLLM's GPU accounting: the recipe's serve.memory_budget, the CPU
    # host's budget, is not applied on a GPU host, and the capacity section says so
    capacity = report.capacity
    assert capacity is not None and capacity.budget_bytes is None, capacity
    assert "serve.memory_budget not applied" in (capacity.host_note or ""), capacity.markdown()
    rows = {c.name: c for c in capacity.configs}
    assert list(rows) == list(Boot)
    assert all(c.kv_cache_tokens > 0 and c.block_size == 16 for c in rows.values()), capacity.markdown()
    # the weights freed go to the KV cache (vLLM logs the tiny model's weights as 0.00 GiB; its tokens tell),
    # within what row (b), derived from (c), may be short: the fp8 path's own memory, more than the tiny
    # model's quantization frees (2 MB -> 0.9 MB; at 1 KiB a 16-bit token 32,768 tokens are allowed; on an
    # H100 on 2026-12-07 the derived row held 26,064 fewer than the base)
    sixteen = rows[Boot.QUANTIZED_16BIT_KV]
    short = FP8_PATH_OWN_BYTES * sixteen.kv_cache_tokens // sixteen.kv_cache_memory_bytes
    assert sixteen.kv_cache_tokens + short > rows[Boot.BASE].kv_cache_tokens, capacity.markdown()
    assert 1.9 < capacity.fp8_token_ratio < 2.1, capacity.markdown()  # fp8 KV: half the bytes per token
    assert all(abs(p.error_pct) <= 1.0 for p in capacity.planner), capacity.markdown()
    # every row says what its boot held as vLLM logged it (a base served beside calibration: derived)
    for row in rows.values():
        assert row.held and "GPU KV cache size" in (row.held.vllm_said or ""), row.provenance()
    production = rows[Boot.PRODUCTION]
    assert production.source == "measured" and production.held.kv_cache_tokens == production.kv_cache_tokens
    assert production.held.log == "vllm-w4a16-fp8kv.log"  # named by what ran: W4A16, fp8 KV
    assert "GPU KV cache" in (Path(report.report_dir) / production.held.log).read_text()
    assert report.stress.peak_gpu_memory_bytes, "the stress test read no GPU memory (NVML)"
    print(
        f"GPU peak memory in the stress test: {report.stress.peak_gpu_memory_bytes / 2**30:.2f} GiB; "
        f"report: {report.report_dir}"
    )
    assert_memory_given_back(idle_gpu_memory)


@pytest.mark.timeout(1200)
def test_llama3_8b_shape_with_dummy_weights_is_measured_beside_the_planner(idle_gpu_memory, tmp_path):
    shape = tmp_path / "llama-3-8b"
    shape.mkdir()
    shutil.copyfile(LLAMA3_8B, shape / "config.json")
    for f in TOKENIZER.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copyfile(f, shape / f.name)
    recipe = load_recipe(
        ROOT / "recipes" / "llama3-8b-instruct-awq.yaml",
        {"model.id": str(shape), "serve.enforce_eager": True, "quantization.kv_cache_scales": False},
    )
    result = measure_shape(
        recipe,
        shape,
        out_dir=tmp_path / "out",
        model="Llama-3-8B",
        device_memory_bytes=gpu.usable_memory_bytes(),
        log=print,
    )
    rows = {r.name: r for r in result.rows}
    assert all(r.measured is not None and r.refused is None for r in rows.values()), result.markdown()
    for r in rows.values():
        assert abs(r.error_pct) <= 1.0, result.markdown()  # the planner beside each measured row
    w4 = rows[Boot.QUANTIZED_16BIT_KV].measured.kv_cache_tokens
    assert (
        rows[Boot.PRODUCTION].measured.kv_cache_tokens
        > 1.9 * w4
        > 1.9 * rows[Boot.BASE].measured.kv_cache_tokens
    )
    assert_memory_given_back(idle_gpu_memory)
