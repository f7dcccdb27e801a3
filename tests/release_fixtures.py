"""Realistic release figures for the regression gate and the release history, without a vLLM boot.

The numbers are the tiny reference model's as the pipeline measured them on CPU under the 8 MiB budget
(README, benchmarks/results/release-formats/schemes.json): the 4-bit formats hold 14,464 KV tokens with the
fp8 KV
cache (28.25 requests of 512 tokens), the 8-bit ones 13,696 (26.75); accuracy of the AWQ W4A16
release on the project's tasks; `vllm bench serve` output throughput at the stress concurrency.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantize_serve.capacity.measure import CapacityConfig, CapacityReport
from quantize_serve.gates.accuracy.run import AccuracyCheck
from quantize_serve.gates.decision import Decision
from quantize_serve.gates.regression import MeasurementConditions, RecordedMetric, ReleaseResults
from quantize_serve.gates.soak import SoakFigures, SoakResult, SoakTraffic
from quantize_serve.gates.stress import StressResult
from quantize_serve.hub.client import PushResult
from quantize_serve.quantize.run import QuantizeResult
from quantize_serve.report.run_report import RunReport
from quantize_serve.serving.boot import Boot
from quantize_serve.traffic.bench import ThroughputFigures
from quantize_serve.validate.preflight import BaseModelRef

if TYPE_CHECKING:
    from quantize_serve.report.base_reference import BaseReference

CONDITIONS = MeasurementConditions(
    tasks=[
        {"task": "../evals/tasks/qs_facts_mc.yaml", "num_fewshot": 0, "limit": None},
        {"task": "../evals/tasks/qs_heldout_ppl.yaml", "num_fewshot": 0, "limit": None},
    ],
    vllm_version="0.32.0",
    hardware="x86_64 2 CPUs, no GPU",
    serve={"max_model_len": 512, "max_num_seqs": 8, "kv_cache_dtype": "fp8", "memory_budget": 8388608},
    stress={"concurrency": 8, "num_requests": 48, "prompt_tokens": [32, 128, 256], "output_tokens": [16, 64]},
)


def placeholder_checkpoint(checkpoint_dir: str = "c", **more: object) -> QuantizeResult:
    """An AWQ W4A16 checkpoint's record with placeholder figures; ``more`` sets any other field."""
    fields = {
        "checkpoint_dir": checkpoint_dir,
        "method": "awq",
        "scheme": "W4A16_ASYM",
        "seconds": 1.0,
        "base_bytes": 2,
        "quantized_bytes": 1,
        "calibration_fingerprint": "2" * 64,
        "engine_versions": {},
    }
    return QuantizeResult(**(fields | more))


# (task, metric, higher is better, AWQ W4A16 value, base value)
AWQ_ACCURACY = [
    ("../evals/tasks/qs_facts_mc.yaml", "acc", True, 0.9291, 0.9316),
    ("../evals/tasks/qs_facts_mc.yaml", "acc_norm", True, 0.9291, 0.9316),
    ("../evals/tasks/qs_heldout_ppl.yaml", "word_perplexity", False, 2.236, 2.214),
]
KV_4BIT, KV_8BIT, MAX_MODEL_LEN = 14_464, 13_696, 512


def results(
    *,
    kv_tokens: int = KV_4BIT,
    throughput: float = 2_400.0,
    accuracy_scale: float = 1.0,
    conditions: MeasurementConditions = CONDITIONS,
) -> ReleaseResults:
    """A release's recorded figures; ``accuracy_scale`` < 1 makes every metric that much worse."""
    return ReleaseResults(
        conditions=conditions,
        kv_cache_tokens=kv_tokens,
        max_concurrency=kv_tokens / MAX_MODEL_LEN,
        stress_concurrency=8,
        output_throughput=throughput,
        accuracy=[
            RecordedMetric(
                task=t, metric=m, higher_is_better=up, value=v * accuracy_scale if up else v / accuracy_scale
            )
            for t, m, up, v, _ in AWQ_ACCURACY
        ],
    )


def base_results() -> ReleaseResults:
    return ReleaseResults(
        conditions=CONDITIONS,
        kv_cache_tokens=6_016,
        max_concurrency=6_016 / MAX_MODEL_LEN,
        accuracy=[
            RecordedMetric(task=t, metric=m, higher_is_better=up, value=b) for t, m, up, _, b in AWQ_ACCURACY
        ],
    )


def capacity_config(**overrides: object) -> CapacityConfig:
    """A capacity row: by default the AWQ W4A16 release's production boot (fp8 KV cache, KV_4BIT tokens in
    blocks of 16 at MAX_MODEL_LEN) under the 8 MiB budget; ``overrides`` sets any field. Unless given,
    ``num_blocks`` and ``max_concurrency`` follow from the tokens, the block size and the model length."""
    fields: dict = {
        "name": Boot.PRODUCTION,
        "kv_cache_dtype": "fp8",
        "weights_bytes": 900_000,
        "kv_cache_memory_bytes": 7_000_000,
        "kv_cache_tokens": KV_4BIT,
        "block_size": 16,
        "max_model_len": MAX_MODEL_LEN,
        "boot_seconds": 20.0,
    } | overrides
    fields.setdefault("num_blocks", fields["kv_cache_tokens"] // fields["block_size"])
    fields.setdefault("max_concurrency", fields["kv_cache_tokens"] / fields["max_model_len"])
    return CapacityConfig(**fields)


def stress_result(**overrides: object) -> StressResult:
    """A stress test with nothing wrong in it, at the tiny AWQ recipe's profile (CONDITIONS: its valid
    requests all completed, its 2 over-long prompts rejected, the ramp 1-16, the bench run after the
    traffic); ``overrides`` sets any field."""
    n = CONDITIONS.stress["num_requests"]
    fields: dict = {
        "requests": n + 2,
        "completed": n,
        "rejected_overlong": 2,
        "overlong_expected": 2,
        "errors_5xx": 0,
        "other_errors": 0,
        "timeouts": 0,
        "wrong_token_counts": 0,
        "aborted": 0,
        "server_restarts": 0,
        "server_died": False,
        "peak_kv_cache_usage": 0.3,
        "preemptions": 0,
        "peak_running": 12,
        "peak_waiting": 0,
        "peak_rss_bytes": 2**30,
        "peak_gpu_memory_bytes": None,
        "duration_s": 10.0,
        "concurrency_steps": [1, 4, 8, 16],
        "failures": [],
        "error_samples": [],
        "output_dir": "stress",
        "throughput": ThroughputFigures(
            command="vllm bench serve",
            result_path="bench.json",
            input_len=8,
            output_len=8,
            num_prompts=n,
            completed=n,
            failed=0,
            request_throughput=1.0,
            output_throughput=8.0,
        ),
    }
    return StressResult(**(fields | overrides))


def soak_result(*, slope: float | None = 0.4, **overrides: object) -> SoakResult:
    """A soak that passed: an hour at concurrency 16 after 5 minutes of warm-up, its RSS growing ``slope``
    MiB/min (under the default bound of 10); ``overrides`` sets any other field."""
    figures = SoakFigures(
        samples=360,
        samples_after_warmup=330,
        fit_window_s=3300,
        rss_slope_mib_per_min=slope,
        rss_intercept_mib=2000.0,
        rss_after_warmup_bytes=2_000_000_000,
        rss_last_bytes=2_020_000_000,
        peak_rss_bytes=2_030_000_000,
        gpu_slope_mib_per_min=None,
        gpu_intercept_mib=None,
        peak_gpu_memory_bytes=None,
        peak_kv_cache_usage=0.3,
        preemptions=0,
        preemptions_after_warmup=0,
    )
    fields: dict = {
        "duration_s": 3600,
        "measured_s": 3600,
        "warmup_s": 300,
        "sample_interval_s": 10,
        "concurrency": 16,
        "prompt_tokens": [16],
        "output_tokens": [8],
        "max_memory_growth_mib_per_min": 10.0,
        "max_preemptions_after_warmup": 0,
        "figures": figures,
        "traffic": SoakTraffic(completed=1000),
        "server_died": False,
        "failures": [],
        "samples_path": "soak/samples.jsonl",
        "chart_path": None,
        "output_dir": "soak",
    }
    return SoakResult(**(fields | overrides))


def accuracy_checks(scale: float = 1.0) -> list[AccuracyCheck]:
    out = []
    for task, metric, up, value, base in AWQ_ACCURACY:
        q = value * scale if up else value / scale
        recovery = q / base if up else base / q
        out.append(
            AccuracyCheck(
                task=task,
                metric=metric,
                base=base,
                quantized=q,
                recovery=recovery,
                threshold=0.95,
                passed=recovery >= 0.95,
                higher_is_better=up,
                reason=f"recovery {recovery:.4f}",
            )
        )
    return out


def failed_checks(*tasks: str) -> list[AccuracyCheck]:
    """For each of ``tasks``, an ``acc`` check that failed (recovery 0.5): for what a report names, not
    its figures."""
    return [
        AccuracyCheck(
            task=t,
            metric="acc",
            base=0.5,
            quantized=0.25,
            recovery=0.5,
            threshold=0.95,
            passed=False,
            higher_is_better=True,
            reason="recovery quantized/base = 0.5000 < 0.95",
        )
        for t in tasks
    ]


def bare_report(**more: object) -> RunReport:
    """A run's report with only what every report has (no capacity, accuracy, candidate or release):
    the tiny AWQ recipe's, its gates passed; ``more`` sets any other field."""
    fields: dict = {
        "run_id": "r",
        "recipe": "tiny-llama-awq",
        "recipe_source": "recipes/tiny-llama-awq.yaml",
        "recipe_sha256": "0" * 64,
        "base": BaseModelRef(local_dir="models/tiny-llama", sha="1" * 64),
        "checkpoint": placeholder_checkpoint(),
        "decision": Decision(passed=True, checks=[]),
        "serving_command": "vllm serve c",
    }
    return RunReport(**(fields | more))


def run_report(
    *,
    repo_id: str,
    candidate_sha: str,
    run_id: str,
    kv_tokens: int = KV_4BIT,
    decision: Decision | None = None,
    report_dir: str = "",
    **more,
) -> RunReport:
    """A gated run's report as the flow hands it to the release step (figures above, no boot)."""
    return bare_report(
        run_id=run_id,
        candidate=PushResult(
            repo_id=repo_id,
            commit_sha=candidate_sha,
            created_commit=True,
            url=f"http://hub/{repo_id}/commit/{candidate_sha}",
        ),
        capacity=CapacityReport(
            method="fixed budget",
            budget_bytes=8_388_608,
            configs=[capacity_config(kv_cache_tokens=kv_tokens)],
            freed_weight_bytes=1_100_000,
            fp8_token_ratio=2.0,
            gain_quantized=1.19,
            gain_fp8=2.4,
            planner=[],
        ),
        accuracy=accuracy_checks(),
        results=results(kv_tokens=kv_tokens),
        decision=decision or Decision(passed=True, checks=[]),
        report_dir=report_dir,
        vllm_version="0.32.0",
        hardware=CONDITIONS.hardware,
        **more,
    )


def placeholder_reference(key: str = "k1", run_id: str = "run-1") -> BaseReference:
    """A base reference with placeholder figures: for where references are stored and found, not their
    numbers."""
    from quantize_serve.gates.accuracy.run import AccuracyRun
    from quantize_serve.report.base_reference import BaseReference

    capacity = capacity_config(name=Boot.BASE, kv_cache_dtype="auto")
    accuracy = AccuracyRun(
        server_base_url="http://127.0.0.1:1", tasks={}, seconds=1.0, lm_eval_version="0.4.13"
    )
    return BaseReference(
        key=key, run_id=run_id, run_dir=run_id, capacity=capacity, accuracy=accuracy, factors={}
    )
