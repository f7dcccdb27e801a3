"""The prefix-reuse workload on the real vLLM CPU server (the session's base boot, prefix caching on as vLLM's
default): vLLM's own prefix_repetition bench and the prefix cache's counters read around it. Tier off only:
vLLM's CPU backend cannot offload its KV cache (its KV cache lives in host memory already), so the tier's
figures are absent here and the tier-on side is measured on a GPU."""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from quantize_serve.gates.prefix_reuse import plan_prefix_workload, run_prefix_workload
from quantize_serve.recipe.model import PrefixWorkload

# vLLM's CPU KV block is 128 tokens and only whole blocks are cached: a prefix of 2 blocks. At one request in
# flight each prefix's second prompt comes after its first has finished, so it finds the prefix cached.
WORKLOAD = PrefixWorkload(
    working_set=2, prefix_len=256, suffix_len=32, output_len=4, prompts_per_prefix=2, concurrency=1
)


def test_prefix_workload_hits_the_gpu_prefix_cache(base_server, base_model_dir: Path, tmp_path: Path) -> None:
    server, spec = base_server
    # a planning figure, not this boot's cache (~6k tokens): 2 x 512 tokens = 4 prefixes of 256, which the
    # boot's cache holds whole (the tier could add nothing here)
    plan = plan_prefix_workload(
        WORKLOAD,
        gpu_kv_tokens=512,
        host_tier_tokens=None,
        concurrency=16,
        max_model_len=spec.serve.max_model_len,
    )
    assert (plan.num_prefixes, plan.prompts, plan.concurrency) == (4, 8, 1)
    t0 = time.monotonic()
    figures = run_prefix_workload(
        server, plan, tokenizer_dir=str(base_model_dir), output_dir=tmp_path, seed=11, timeout_s=120
    )
    took = time.monotonic() - t0
    shown = figures.model_dump_json(indent=1) + f"\ntook {took:.1f} s"
    assert figures.completed == plan.prompts == figures.num_prompts and figures.failed == 0, shown
    assert (
        figures.command.startswith("vllm bench serve ")
        and "--dataset-name prefix_repetition" in figures.command
    )
    assert Path(figures.result_path).is_file()
    # every prompt is looked up (289 tokens with the BOS: at least its prefix and suffix); each prefix's
    # second prompt finds at least the prefix's first block cached
    assert figures.prefix_cache_queries >= plan.prompts * (plan.prefix_len + plan.suffix_len), shown
    assert figures.prefix_cache_hits >= plan.num_prefixes * 128, shown
    assert 0 < figures.gpu_hit_rate == figures.prefix_hit_rate < 0.5, shown
    assert not figures.external_prefix_cache_queries and not figures.external_prefix_cache_hits, shown
    assert figures.kv_offload_load_bytes is None and figures.kv_offload_store_bytes is None, shown
    assert figures.preemptions == 0 and figures.peak_kv_cache_usage is not None, shown
    assert figures.ttft_p50_ms and figures.ttft_p99_ms and figures.ttft_p99_ms >= figures.ttft_p50_ms, shown
    assert figures.output_throughput and figures.duration_s, shown
    benches = [
        p for p in psutil.Process().children(recursive=True) if "cli.benchmark" in " ".join(p.cmdline())
    ]
    assert not benches, f"bench processes left behind: {benches}"
