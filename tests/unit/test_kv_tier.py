"""The host-memory KV tier as the flow measures it (tasks/kv_tier.py): the workload sized to the production
boot beside the tier's tokens, the decision with a side that could not run, and the report's section. The
runs themselves: tests/engines/test_prefix_reuse.py (CPU, tier off) and tests/gpu/test_kv_tier.py (on and
off)."""

from __future__ import annotations

import shutil

from quantize_serve.gates.prefix_reuse import decide_offload
from quantize_serve.recipe.load import load_recipe
from quantize_serve.report.run_report import render_markdown
from quantize_serve.validate.preflight import ValidatedRecipe
from tasks.kv_tier import TierSide, decide_kv_tier, tier_plan
from tests.conftest import ROOT
from tests.release_fixtures import capacity_config, run_report
from tests.unit.test_prefix_reuse import OFF, fig

LLAMA3 = ROOT / "recipes" / "llama3-8b-instruct-awq.yaml"


def validated(tier: dict) -> ValidatedRecipe:
    recipe = load_recipe(LLAMA3, {"serve.kv_offload": tier})
    return ValidatedRecipe(
        recipe=recipe, source=str(LLAMA3), recipe_sha256="0" * 64, calibration_fingerprint="1"
    )


def checkpoint(tmp_path) -> str:
    shutil.copyfile(ROOT / "benchmarks" / "configs" / "llama-3-8b.json", tmp_path / "config.json")
    return str(tmp_path)


def test_the_workload_is_sized_to_the_production_boot_and_capped_by_the_tier(tmp_path):
    production = capacity_config(kv_cache_tokens=1_000_000, kv_cache_dtype="fp8", block_size=16)
    plan, host = tier_plan(validated({"size_gib": 96}), checkpoint(tmp_path), production)
    # Llama-3-8B with an fp8 cache: 2 x 32 layers x 8 KV heads x 128 x 1 byte = 64 KiB a token
    assert host.tokens == 96 * 2**30 // 65_536 == 1_572_864
    assert host.distinct_tokens_beyond_gpu == 572_864 and host.warning is None
    # working_set 1.5 x 1,000,000 capped at 90% of the tier's tokens, in whole 2,048-token prefixes
    assert plan.num_prefixes == int(0.9 * 1_572_864) // 2048 == 691 and plan.prompts == 1382
    assert plan.gpu_kv_tokens == 1_000_000 and plan.host_tier_tokens == 1_572_864 and plan.shows_tier
    # a tier no larger than the GPU's cache: planned, with the warning, and the plan says it cannot show
    small, host = tier_plan(validated({"size_gib": 32}), checkpoint(tmp_path), production)
    assert host.warning and "size it above 61.1 GiB" in host.warning
    assert not small.shows_tier and "the measurement cannot show the tier" in small.why
    # LMCache sizes its own tier: the workload is not capped, and no tokens are planned
    plan, host = tier_plan(validated({"backend": "lmcache"}), checkpoint(tmp_path), production)
    assert host is None and plan.host_tier_tokens is None and plan.num_prefixes == 733  # ceil(1.5M / 2048)


def test_a_side_that_could_not_run_leaves_the_tier_out_and_says_why(tmp_path):
    v = validated({"size_gib": 96})
    plan, _ = tier_plan(v, checkpoint(tmp_path), capacity_config(kv_cache_tokens=1_000_000))
    on = TierSide(tier=True, error="vllm bench serve did not finish within 600 s")
    decision = decide_kv_tier.fn(v, plan, on, TierSide(tier=False, runs=OFF))
    assert not decision.ship and not decision.helped
    assert decision.why.endswith(
        "the tier is left out: no run with the tier to compare (tier on: vllm bench serve did not finish "
        "within 600 s)"
    )


def test_the_report_shows_the_tier_beside_the_measurement(tmp_path):
    production = capacity_config(kv_cache_tokens=1_000_000, kv_cache_dtype="fp8", block_size=16)
    plan, host = tier_plan(validated({"size_gib": 96}), checkpoint(tmp_path), production)
    on = [fig(0.77, 430, 1005, tier_hit=0.6), fig(0.79, 445, 1000, tier_hit=0.6)]
    report = run_report(
        repo_id="org/m",
        candidate_sha="a" * 40,
        run_id="run-1",
        kv_tier=decide_offload(on, OFF, plan=plan),
        kv_host_tier=host,
        kv_tier_sizing="serve.kv_offload.size_gib 96.0 GiB: host_memory_share 0.8 of the 120.0 GiB available",
    )
    text = render_markdown(report)
    section = text[text.index("## Host-memory KV tier") :]
    assert (
        "- host tier of the production boot (serve.kv_offload, native): 96 GiB of pinned host memory, "
        "1,572,864 tokens by vLLM's block arithmetic, 572,864 of them beyond the GPU's 1,000,000" in section
    )
    assert "- serve.kv_offload.size_gib 96.0 GiB: host_memory_share 0.8 of the 120.0 GiB" in section
    assert "Workload: 691 prefixes x 2,048 tokens" in section and "| on | 2 |" in section
    assert "**The tier ships**: hit rate 0.41 -> 0.78" in section
    assert "## Host-memory KV tier" not in render_markdown(
        run_report(repo_id="org/m", candidate_sha="a" * 40, run_id="r")
    )
