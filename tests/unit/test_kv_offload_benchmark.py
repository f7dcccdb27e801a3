"""benchmarks/kv_offload.py without a boot: the tier's size on a host (the margin, a cgroup limit), the
benchmark's workload, the no-reuse plan (every prompt its own random tokens), the device-time estimate, the
summary and decision from constructed runs, and --dry-run on a machine without a GPU (the planner's H100 80 GB
and the scenario's assumed host). The boots run on a GPU host (scripts/gpu/README.md)."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks import kv_offload as ko
from quantize_serve.capacity.host_tier import HostMemory
from quantize_serve.gates.prefix_reuse import PrefixFigures, plan_prefix_workload
from quantize_serve.recipe.model import PrefixWorkload
from quantize_serve.serving import gpu
from quantize_serve.traffic.bench import PrefixRepetition

GIB = 1024**3
H100_KV_TOKENS = 1_064_560  # the planner's production boot of the 8B W4A16 fp8 KV at 0.90 on an H100 80 GB


def options(**given) -> argparse.Namespace:
    keys = ("working_set", "prefix_len", "suffix_len", "output_len", "prompts_per_prefix", "repeats")
    return argparse.Namespace(**{k: None for k in (*keys, "concurrency")} | given)


def test_the_tier_takes_the_room_the_margin_leaves_in_whole_gib():
    memory = HostMemory(available_bytes=120 * GIB, total_bytes=128 * GIB)  # margin: 10% of 128 = 12.8 GiB
    assert ko.default_tier_gib(memory, None)[0] == 107
    assert ko.default_tier_gib(memory, 0.6) == (72, "--tier-share 0.6 of 120.0 GiB available")
    size, how = ko.default_tier_gib(memory, 0.95)
    assert size == 107 and how.startswith("--tier-share 0.95 capped at the room")


def test_the_workload_is_the_scenarios_with_the_options_given():
    w = ko.workload_of(ko.BENCH, options())
    assert (w.working_set, w.prefix_len, w.suffix_len, w.output_len) == (1.1, 2048, 128, 32)
    assert (w.prompts_per_prefix, w.repeats, w.concurrency) == (2, 2, None)
    assert ko.workload_of(ko.BENCH, options(working_set=1.5, repeats=3)).model_dump() == (
        w.model_copy(update={"working_set": 1.5, "repeats": 3}).model_dump()
    )
    assert ko.workload_of(ko.REHEARSE_BENCH, options()).concurrency == 1
    assert ko.parse_stages("off, on,off") == ["off", "on"]
    with pytest.raises(SystemExit, match="choose from on, off"):
        ko.parse_stages("both")


def test_the_no_reuse_plan_sends_each_prompt_its_own_random_tokens():
    plan = plan_prefix_workload(
        PrefixWorkload(working_set=1.1), H100_KV_TOKENS, 1_753_088, 128, max_model_len=8192
    )
    assert (plan.num_prefixes, plan.prompts, plan.concurrency) == (572, 1144, 128) and plan.shows_tier
    prompts = ko.no_reuse_prompts(plan, None, 4)
    rplan = ko.no_reuse_plan(plan, prompts)
    assert prompts == 512 and (rplan.prompts, rplan.num_prefixes, rplan.concurrency) == (512, 512, 128)
    # vLLM's prefix_repetition with one prompt per prefix: the prefix run's prompt shape, no reuse
    assert rplan.dataset() == PrefixRepetition(
        prefix_len=2048, suffix_len=128, num_prefixes=512, output_len=32
    )
    assert "no prefix shared between requests" in rplan.why
    assert ko.no_reuse_plan(plan, 3).concurrency == 3 and ko.no_reuse_prompts(plan, 2000, 4) == 2000


def test_the_estimate_counts_every_prompt_token_and_the_tiers_pinning():
    plan = plan_prefix_workload(PrefixWorkload(working_set=1.1), H100_KV_TOKENS, 1_753_088, 128)
    rplan = ko.no_reuse_plan(plan, 512)
    est = ko.estimate_inputs(rehearse=False)
    on = ko.stage_estimate("on", plan, rplan, 2, 107, est)
    off = ko.stage_estimate("off", plan, rplan, 2, 107, est)
    # 1,144 prompts x 2,176 tokens at 30k tok/s + 36,608 output tokens at 4k tok/s + 20 s: 112.1 s a run
    assert on["prefix_runs_s"] == off["prefix_runs_s"] == 224
    assert on["tier_pin_s"] == 32 and off["tier_pin_s"] == 0
    assert on["total_s"] - off["total_s"] == 32 and on["total_s"] <= est["stage_target_s"]


def figures(hit: float, tier_hit: float | None, ttft: float, tput: float, seed: int) -> PrefixFigures:
    queries = 100_000
    return PrefixFigures(
        command="vllm bench serve",
        result_path="bench.json",
        seed=seed,
        num_prompts=100,
        completed=100,
        failed=0,
        output_throughput=tput,
        ttft_p50_ms=ttft,
        ttft_p99_ms=3 * ttft,
        prefix_cache_queries=queries,
        prefix_cache_hits=round(hit * queries),
        external_prefix_cache_queries=None if tier_hit is None else round((1 - hit) * queries),
        external_prefix_cache_hits=None if tier_hit is None else round(tier_hit * (1 - hit) * queries),
        preemptions=0,
    )


def test_the_summary_gives_each_workloads_medians_and_the_decision():
    data = {
        "plan": plan_prefix_workload(PrefixWorkload(working_set=1.1), 1000, 2000, 8).model_dump(),
        "stages": {
            "off": {
                "status": "done",
                "host_memory": {"available_drop_gib": 9.0},
                "boot_seconds": 100.0,
                "workloads": {
                    "prefix": {
                        "status": "done",
                        "runs": [ko.figures_record(figures(0.3, None, 900, 900, s)) for s in (1, 2)],
                    },
                    "no_reuse": {
                        "status": "done",
                        "runs": [ko.figures_record(figures(0.0, None, 800, 1000, s)) for s in (1, 2)],
                    },
                },
            },
            "on": {
                "status": "done",
                "host_memory": {"available_drop_gib": 116.5},
                "boot_seconds": 130.0,
                "workloads": {
                    "prefix": {
                        "status": "done",
                        "runs": [
                            ko.figures_record(figures(0.3, 0.5, t, 1100, s)) for s, t in ((1, 500), (2, 520))
                        ],
                    },
                    "no_reuse": {
                        "status": "done",
                        "runs": [ko.figures_record(figures(0.0, 0.0, 820, 990, s)) for s in (1, 2)],
                    },
                },
            },
        },
    }
    s = ko.summarize(json.loads(json.dumps(data)))  # as read back from the JSON
    prefix, no_reuse = s["prefix"], s["no_reuse"]
    assert prefix["off"]["prefix_hit_rate"] == 0.3 and prefix["on"]["prefix_hit_rate"] == 0.65
    assert prefix["on"]["tier_hit_rate"] == 0.5 and prefix["off"]["tier_hit_rate"] is None
    assert prefix["on"]["ttft_p50_ms"] == 510 and prefix["on"]["ttft_p99_ms"] == 1530
    assert prefix["helped"] is True and "the tier ships" in prefix["why"]
    assert no_reuse["helped"] is False and "did not rise" in no_reuse["why"]
    assert "| on | 2 |" in prefix["report"]
    assert s["host_memory_the_tier_took_gib"] == 107.5 and s["boot_seconds"] == {"on": 130.0, "off": 100.0}


def test_the_rehearsals_summary_says_the_cpu_cannot_offload():
    data = {
        "stages": {
            "on": {"status": ko.NOT_ON_CPU, "why": ko.CPU_NOTE},
            "off": {
                "status": "done",
                "workloads": {
                    "prefix": {"status": "done", "runs": [ko.figures_record(figures(0.2, None, 30, 70, 1))]}
                },
            },
        }
    }
    s = ko.summarize(data)
    assert s["prefix"]["on"] is None and s["prefix"]["off"]["prefix_hit_rate"] == 0.2
    assert "cannot offload" in s["prefix"]["why"] and "helped" not in s["prefix"]
    assert s["no_reuse"]["off"] is None


def test_a_dry_run_away_from_the_gpu_host_plans_for_an_h100_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu, "usable_memory_bytes", lambda index=0: None)
    out = tmp_path / "kv.json"
    assert ko.main(["--dry-run", "--out", str(out), "--work", str(tmp_path / "w")]) == 0
    text = capsys.readouterr().out
    assert "GPU KV cache (planner): 1,064,560 tokens" in text
    assert "tier: 107 GiB (room: 120.0 GiB available less the 12.8 GiB margin" in text
    assert "572 prefixes x 2,048 tokens = 1,171,456 distinct prefix tokens, 1.10x" in text
    assert (
        "stage on: ~509 s" in text and "stage off: ~477 s" in text and "estimated device seconds: 986" in text
    )
    assert "cannot show" not in text and not out.exists()


def test_a_dry_run_for_an_h200_says_the_tier_cannot_show_and_how_to_make_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu, "usable_memory_bytes", lambda index=0: None)
    ko.main(
        ["--dry-run", "--card", "h200", "--out", str(tmp_path / "kv.json"), "--work", str(tmp_path / "w")]
    )
    text = capsys.readouterr().out
    assert "warning: the workload cannot show the tier here" in text
    assert "--gpu-memory-utilization 0.67 (not the production setting" in text
