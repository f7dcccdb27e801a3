"""On the GPU: the host-memory KV tier (serve.kv_offload) through the flow's own pieces (tasks/kv_tier.py).
The tiny model's production settings with a 1 GiB tier and a GPU KV cache pinned small (4 MiB: ~8k tokens), so
that the prefix-reuse workload's prefixes (3x the GPU cache) outgrow it: with the tier, prefixes the GPU
evicted come back from host memory (vLLM's external prefix-cache hits, its offload bytes); without it, the
same requests find fewer. vLLM's CPU backend cannot offload: this is the only place the tier-on side runs
before a release does."""

from __future__ import annotations

import pytest

from quantize_serve.capacity.measure import measure_capacity
from quantize_serve.recipe.load import load_recipe
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.server import vllm_server
from quantize_serve.serving.spec import capacity_spec
from quantize_serve.validate.preflight import ValidatedRecipe, check_serving_host
from tasks.kv_tier import decide_kv_tier, measure_prefix_reuse, tier_plan
from tests.conftest import ROOT
from tests.gpu.conftest import assert_memory_given_back

TINY = ROOT / "recipes" / "tiny-llama-awq.yaml"
MODEL = ROOT / "models" / "tiny-llama"
GPU_KV_BYTES = 4 * 2**20  # fp8: 512 bytes a token for the tiny model (2 x 4 layers x 2 KV heads x 32)
TIER = {
    "size_gib": 1,
    "workload": {
        "working_set": 3,
        "prefix_len": 256,
        "suffix_len": 32,
        "output_len": 4,
        "prompts_per_prefix": 2,
        "repeats": 2,
        "concurrency": 4,
    },
}


@pytest.mark.timeout(900)
def test_the_tier_brings_back_prefixes_the_gpu_evicted(idle_gpu_memory, tmp_path):
    recipe = load_recipe(TINY, {"serve.memory_budget": None, "serve.kv_offload": TIER})
    check_serving_host(recipe, source=str(TINY))  # a GPU host with the memory: nothing refused
    v = ValidatedRecipe(recipe=recipe, source=str(TINY), recipe_sha256="0" * 64, calibration_fingerprint="1")
    sides = {}
    plan = None
    for tier in (True, False):
        spec = capacity_spec(recipe, Boot.PRODUCTION, MODEL, kv_tier=tier)
        spec = spec.model_copy(update={"kv_cache_memory_bytes": GPU_KV_BYTES})
        assert ("kv-offloading-size" in spec.vllm_config()) is tier
        with vllm_server(spec, log_path=tmp_path / f"tier-{tier}" / "vllm.log") as server:
            if plan is None:
                capacity = measure_capacity(server, spec, name=Boot.PRODUCTION)
                plan, host = tier_plan(v, str(MODEL), capacity)
                assert host is not None and host.tokens > 100 * capacity.kv_cache_tokens, host
                assert plan.shows_tier and plan.working_set_tokens >= 3 * capacity.kv_cache_tokens, plan.why
            sides[tier] = measure_prefix_reuse.fn(
                v, server, plan, tier=tier, tokenizer_dir=str(MODEL), output_dir=tmp_path
            )
    on, off = sides[True], sides[False]
    assert on.error is None and off.error is None, (on.error, off.error)
    shown = "\n".join(f.model_dump_json() for f in on.runs + off.runs)
    assert all(f.failed == 0 and f.completed == plan.prompts for f in on.runs + off.runs), shown
    # the tier: blocks stored to host memory, prefixes loaded back from it
    assert all(f.kv_offload_store_bytes and f.external_prefix_cache_hits for f in on.runs), shown
    assert all(not f.external_prefix_cache_hits for f in off.runs), shown
    assert min(f.prefix_hit_rate for f in on.runs) > max(f.prefix_hit_rate for f in off.runs), shown
    decision = decide_kv_tier.fn(v, plan, on, off)
    assert decision.hit_rate is not None and decision.hit_rate.beats_noise, decision.why
    assert_memory_given_back(idle_gpu_memory)
