"""The prefix-reuse workload without a server: its sizing, the tier's ship decision on constructed figures,
the bench's argv for vLLM's prefix_repetition dataset (the real run: tests/engines/test_prefix_reuse.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantize_serve.gates.prefix_reuse import (
    PrefixFigures,
    decide_offload,
    plan_prefix_workload,
)
from quantize_serve.recipe.model import PrefixWorkload
from quantize_serve.serving.metrics import counter_deltas, read_gauges
from quantize_serve.traffic.bench import PrefixRepetition, bench_args
from tests.conftest import ROOT

# --------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------


def test_plan_is_working_set_times_the_gpu_cache_in_whole_prefixes() -> None:
    plan = plan_prefix_workload(
        PrefixWorkload(), gpu_kv_tokens=100_000, host_tier_tokens=None, concurrency=16
    )
    # 1.5 x 100,000 = 150,000 tokens -> ceil(150,000 / 2,048) = 74 prefixes, 2 prompts each
    assert (plan.num_prefixes, plan.prompts, plan.working_set_tokens) == (74, 148, 74 * 2048)
    assert (plan.prefix_len, plan.suffix_len, plan.output_len, plan.concurrency) == (2048, 128, 32, 16)
    assert plan.shows_tier and "1.52x the GPU KV cache's 100,000 tokens" in plan.why
    assert "capped" not in plan.why and "cannot show" not in plan.why
    assert plan.dataset() == PrefixRepetition(prefix_len=2048, suffix_len=128, num_prefixes=74, output_len=32)


def test_plan_is_capped_at_ninety_percent_of_the_host_tier() -> None:
    """The tier is write-through (it holds copies of the GPU's blocks): what it holds beyond the GPU is
    max(gpu, host), so the cap is the host's tokens, and whole prefixes that stay inside it."""
    plan = plan_prefix_workload(
        PrefixWorkload(), gpu_kv_tokens=100_000, host_tier_tokens=120_000, concurrency=8
    )
    # 0.9 x 120,000 = 108,000 -> floor(108,000 / 2,048) = 52 prefixes = 106,496 tokens, above the GPU's
    assert (plan.num_prefixes, plan.prompts, plan.working_set_tokens) == (52, 104, 106_496)
    assert plan.shows_tier and "capped at 90% of the host tier's 120,000 tokens" in plan.why


def test_a_tier_too_small_to_show_is_said_in_the_plan() -> None:
    plan = plan_prefix_workload(
        PrefixWorkload(), gpu_kv_tokens=100_000, host_tier_tokens=100_000, concurrency=8
    )
    assert plan.num_prefixes == 43 and plan.working_set_tokens == 88_064  # 0.9 x 100,000 / 2,048
    assert not plan.shows_tier
    assert "the measurement cannot show the tier: the tier (100,000 tokens) is too small" in plan.why


def test_plan_concurrency_in_flight_and_model_length() -> None:
    small = PrefixWorkload(prefix_len=256, suffix_len=32, output_len=4, prompts_per_prefix=3, working_set=2)
    plan = plan_prefix_workload(small, gpu_kv_tokens=1000, host_tier_tokens=None, concurrency=64)
    # 2,000 tokens -> 8 prefixes x 3 = 24 prompts; the default concurrency 64 is more than there are prompts
    assert (plan.num_prefixes, plan.prompts, plan.concurrency) == (8, 24, 24)
    assert "in flight alone take 7,008 tokens, more than the GPU cache" in plan.why  # 24 x 292
    own = small.model_copy(update={"concurrency": 2})
    quiet = plan_prefix_workload(own, gpu_kv_tokens=1000, host_tier_tokens=None, concurrency=64)
    assert quiet.concurrency == 2 and "preemptions" not in quiet.why
    with pytest.raises(ValueError, match="292 tokens exceeds serve.max_model_len 256"):
        plan_prefix_workload(
            small, gpu_kv_tokens=1000, host_tier_tokens=None, concurrency=4, max_model_len=256
        )
    with pytest.raises(ValueError, match="gpu_kv_tokens must be positive"):
        plan_prefix_workload(small, gpu_kv_tokens=0, host_tier_tokens=None, concurrency=4)


# --------------------------------------------------------------------------------------------
# The figures
# --------------------------------------------------------------------------------------------


def fig(
    hit: float,
    ttft: float,
    tput: float,
    *,
    tier_hit: float | None = None,
    failed: int = 0,
    preemptions: int = 0,
    seed: int = 0,
) -> PrefixFigures:
    """A run of 100 prompts over 10,000 queried prompt tokens: ``hit`` of them from a cache, the share
    ``tier_hit`` of those from the tier (None: no tier)."""
    queries = 10_000
    hits = round(hit * queries)
    ext = None if tier_hit is None else round(hits * tier_hit)
    return PrefixFigures(
        command="vllm bench serve",
        result_path="bench.json",
        seed=seed,
        num_prompts=100,
        completed=100 - failed,
        failed=failed,
        output_throughput=tput,
        ttft_p50_ms=ttft,
        ttft_p99_ms=ttft * 2,
        prefix_cache_queries=queries,
        prefix_cache_hits=hits - (ext or 0),
        external_prefix_cache_queries=None if ext is None else queries - (hits - ext),
        external_prefix_cache_hits=ext,
        preemptions=preemptions,
        peak_kv_cache_usage=0.97,
    )


def test_hit_rates_gpu_tier_and_overall() -> None:
    f = fig(0.8, 400, 1000, tier_hit=0.5)  # 8,000 hit tokens: 4,000 on the GPU, 4,000 from the tier
    assert f.gpu_hit_rate == 0.4
    assert f.tier_hit_rate == 4000 / 6000  # the tier is asked for the GPU's 6,000 misses
    assert f.prefix_hit_rate == 0.8
    off = fig(0.4, 800, 900)
    assert off.tier_hit_rate is None and off.prefix_hit_rate == off.gpu_hit_rate == 0.4
    assert (
        PrefixFigures(command="", result_path="", seed=0, num_prompts=1, completed=1, failed=0).gpu_hit_rate
        is None
    )


def test_figures_from_the_bench_json_and_counter_deltas() -> None:
    before = read_gauges(
        "vllm:prefix_cache_queries_total 100\nvllm:prefix_cache_hits_total 10\n"
        "process_start_time_seconds 5\n",
        ["vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "process_start_time_seconds"],
    )
    after = {
        "vllm:prefix_cache_queries_total": 600.0,
        "vllm:prefix_cache_hits_total": 260.0,
        "vllm:num_preemptions_total": 1.0,  # first exposed after: counted from 0
        "process_start_time_seconds": 5.0,
    }
    deltas = counter_deltas(before, after)
    assert deltas == {
        "vllm:prefix_cache_queries_total": 500.0,
        "vllm:prefix_cache_hits_total": 250.0,
        "vllm:num_preemptions_total": 1.0,
        "process_start_time_seconds": 0.0,
    }
    bench = {"num_prompts": 8, "completed": 8, "failed": 0, "duration": 3.5, "output_throughput": 9.1}
    f = PrefixFigures.from_run(
        bench | {"median_ttft_ms": 40.0, "p99_ttft_ms": 90.0, "mean_ttft_ms": 45.0},
        deltas,
        command="c",
        result_path="r",
        seed=3,
        peak_kv=0.5,
    )
    assert (f.prefix_cache_queries, f.prefix_cache_hits, f.preemptions) == (500, 250, 1)
    assert f.external_prefix_cache_queries is None and f.kv_offload_store_bytes is None
    assert (f.ttft_p50_ms, f.ttft_p99_ms, f.ttft_mean_ms, f.duration_s) == (40.0, 90.0, 45.0, 3.5)
    assert f.gpu_hit_rate == 0.5 and f.peak_kv_cache_usage == 0.5 and f.seed == 3
    p50 = PrefixFigures.from_run(
        bench | {"p50_ttft_ms": 41.0, "median_ttft_ms": 40.0},
        {},
        command="",
        result_path="",
        seed=0,
        peak_kv=None,
    )
    assert p50.ttft_p50_ms == 41.0 and p50.prefix_cache_queries is None


# --------------------------------------------------------------------------------------------
# The decision
# --------------------------------------------------------------------------------------------

OFF = [fig(0.40, 812, 1000), fig(0.42, 830, 1010)]


def test_the_tier_ships_where_hits_rise_and_ttft_falls_beyond_the_noise() -> None:
    on = [fig(0.77, 430, 1005, tier_hit=0.6), fig(0.79, 445, 1000, tier_hit=0.6)]
    d = decide_offload(on, OFF)
    assert d.ship and d.helped and d.policy == "if_it_helps"
    assert (d.hit_rate.off, d.hit_rate.on) == pytest.approx((0.41, 0.78))
    assert d.hit_rate.noise == pytest.approx(0.02) and d.ttft_p50_ms.noise == 18
    assert d.why.startswith(
        "hit rate 0.41 -> 0.78 (noise 0.02), TTFT p50 821 -> 438 ms (noise 18.0 ms), "
        "output 1,005 -> 1,002 tok/s (noise 10.0), median of 2 run(s) without the tier and 2 with it"
    )
    assert d.why.endswith(": the tier ships")


def test_throughput_alone_beside_the_hit_rate_ships_it() -> None:
    on = [fig(0.77, 820, 1200, tier_hit=0.6), fig(0.79, 825, 1210, tier_hit=0.6)]
    assert decide_offload(on, OFF).ship


def test_gains_within_the_noise_leave_it_out() -> None:
    # the hit rate's spread with the tier (0.30) is larger than its gain
    noisy = [fig(0.30, 430, 1500, tier_hit=0.6), fig(0.60, 440, 1500, tier_hit=0.6)]
    d = decide_offload(noisy, OFF)
    assert not d.ship and not d.helped
    assert d.why.endswith(
        "the tier is left out: the prefix hit rate did not rise by more than the run's noise"
    )
    # more hits, but TTFT and throughput move less than their noise
    flat = [fig(0.77, 815, 1005, tier_hit=0.6), fig(0.79, 826, 1006, tier_hit=0.6)]
    d = decide_offload(flat, OFF)
    assert not d.ship and "neither TTFT p50 fell nor output throughput rose by more than the noise" in d.why


def test_a_worse_tier_is_left_out() -> None:
    on = [fig(0.77, 2400, 600, tier_hit=0.6), fig(0.79, 2500, 610, tier_hit=0.6)]
    d = decide_offload(on, OFF)
    assert not d.ship and "TTFT p50 821 -> 2,450 ms" in d.why and "output 1,005 -> 605 tok/s" in d.why


def test_failures_or_more_preemptions_with_the_tier_leave_it_out() -> None:
    good = [fig(0.77, 430, 1005, tier_hit=0.6), fig(0.79, 445, 1000, tier_hit=0.6)]
    failing = [good[0], fig(0.79, 445, 1000, tier_hit=0.6, failed=3)]
    d = decide_offload(failing, OFF)
    assert not d.ship and d.why.endswith("the tier is left out: 3 of 200 requests failed with the tier")
    preempting = [good[0], fig(0.79, 445, 1000, tier_hit=0.6, preemptions=4)]
    d = decide_offload(preempting, OFF)
    assert not d.ship and "the tier's runs preempted up to 4 requests against 0 without it" in d.why
    d = decide_offload(good, [OFF[0], fig(0.42, 830, 1010, failed=1)])
    assert not d.ship and "1 request(s) failed without the tier: no clean baseline" in d.why
    d = decide_offload([], OFF)
    assert not d.ship and d.why == "the tier is left out: no run with the tier to compare"


def test_always_ships_and_keeps_the_measurement() -> None:
    on = [fig(0.41, 900, 900, tier_hit=0.0), fig(0.41, 905, 905, tier_hit=0.0)]
    d = decide_offload(on, OFF, "always")
    assert d.ship and not d.helped and d.policy == "always"
    assert d.why.startswith("hit rate 0.41 -> 0.41 (noise 0.02)")
    assert d.why.endswith(
        "the tier did not help (the prefix hit rate did not rise by more than the run's noise), and ships "
        "anyway: serve.kv_offload.ship is always"
    )


def test_a_tier_too_small_for_the_workload_is_named_in_the_why_and_the_table() -> None:
    plan = plan_prefix_workload(
        PrefixWorkload(), gpu_kv_tokens=100_000, host_tier_tokens=100_000, concurrency=8
    )
    on = [fig(0.41, 820, 1003, tier_hit=0.0), fig(0.42, 826, 1004, tier_hit=0.0)]
    d = decide_offload(on, OFF, plan=plan)
    assert not d.ship and "the tier was too small for the workload to show it" in d.why
    md = d.markdown().splitlines()
    assert md[0] == f"Workload: {plan.why}."
    assert md[2].startswith("| tier | run | prefix hit rate | GPU hit rate | tier hit rate | TTFT p50 ms |")
    assert md[4] == "| off | 1 | 0.40 | 0.40 | — | 812 | 1,624 | 1,000.0 | 0 | 97% | 0 of 100 |"
    assert md[6] == "| on | 1 | 0.41 | 0.41 | 0.00 | 820 | 1,640 | 1,003.0 | 0 | 97% | 0 of 100 |"
    assert md[-1] == f"**The tier is left out**: {d.why}."
    assert d.lines() == md and len(md) == 10


# --------------------------------------------------------------------------------------------
# The bench's arguments
# --------------------------------------------------------------------------------------------


def test_random_argv_is_unchanged() -> None:
    """The stress gate's recorded command, rebuilt byte for byte."""
    recorded = json.loads((ROOT / "tests/fixtures/stress_metrics/stress_result.json").read_text())
    argv = bench_args(
        "http://127.0.0.1:51393",
        tokenizer_dir="models/tiny-llama",
        input_len=93,
        output_len=20,
        num_prompts=48,
        concurrency=16,
        output_dir=Path("stress_metrics"),
        seed=0,
    )
    assert "vllm " + " ".join(argv) == recorded["throughput"]["command"]


def test_prefix_repetition_argv() -> None:
    dataset = PrefixRepetition(prefix_len=256, suffix_len=32, num_prefixes=4, output_len=4)
    argv = bench_args(
        "http://h:1",
        tokenizer_dir="tok",
        num_prompts=8,
        concurrency=2,
        output_dir=Path("out"),
        seed=7,
        dataset=dataset,
    )
    assert argv == [
        "bench", "serve", "--backend", "openai", "--base-url", "http://h:1", "--endpoint", "/v1/completions",
        "--model", "model", "--served-model-name", "model", "--tokenizer", "tok",
        "--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "256",
        "--prefix-repetition-suffix-len", "32", "--prefix-repetition-num-prefixes", "4",
        "--prefix-repetition-output-len", "4",
        "--num-prompts", "8", "--max-concurrency", "2", "--request-rate", "inf", "--ignore-eos",
        "--temperature", "0", "--seed", "7", "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,99", "--disable-tqdm", "--save-result", "--result-dir", "out",
        "--result-filename", "bench.json",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="give input_len and output_len"):
        bench_args("u", tokenizer_dir="t", num_prompts=1, concurrency=1, output_dir=Path("o"), seed=0)
    with pytest.raises(ValueError, match="or a dataset"):
        bench_args(
            "u",
            tokenizer_dir="t",
            input_len=1,
            output_len=1,
            num_prompts=1,
            concurrency=1,
            output_dir=Path("o"),
            seed=0,
            dataset=dataset,
        )
