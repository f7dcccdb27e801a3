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
from quantize_serve.gates.accuracy import AccuracyCheck
from quantize_serve.gates.decision import Decision
from quantize_serve.gates.regression import MeasurementConditions, RecordedMetric, ReleaseResults
from quantize_serve.hub.client import PushResult
from quantize_serve.quantize.run import QuantizeResult
from quantize_serve.report.run_report import RunReport
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
    configs = [
        CapacityConfig(
            name="w4a16-fp8kv",
            kv_cache_dtype="fp8",
            weights_bytes=900_000,
            kv_cache_memory_bytes=7_000_000,
            kv_cache_tokens=kv_tokens,
            num_blocks=kv_tokens // 16,
            block_size=16,
            max_model_len=MAX_MODEL_LEN,
            max_concurrency=kv_tokens / MAX_MODEL_LEN,
            boot_seconds=20.0,
        )
    ]
    return RunReport(
        run_id=run_id,
        recipe="tiny-llama-awq",
        recipe_source="recipes/tiny-llama-awq.yaml",
        recipe_sha256="0" * 64,
        base=BaseModelRef(local_dir="models/tiny-llama", sha="1" * 64),
        checkpoint=placeholder_checkpoint(),
        candidate=PushResult(
            repo_id=repo_id,
            commit_sha=candidate_sha,
            created_commit=True,
            url=f"http://hub/{repo_id}/commit/{candidate_sha}",
        ),
        capacity=CapacityReport(
            method="fixed budget",
            budget_bytes=8_388_608,
            configs=configs,
            freed_weight_bytes=1_100_000,
            fp8_token_ratio=2.0,
            gain_quantized=1.19,
            gain_fp8=2.4,
            planner=[],
        ),
        accuracy=accuracy_checks(),
        results=results(kv_tokens=kv_tokens),
        decision=decision or Decision(passed=True, checks=[]),
        serving_command="vllm serve c",
        report_dir=report_dir,
        vllm_version="0.32.0",
        hardware=CONDITIONS.hardware,
        **more,
    )


def placeholder_reference(key: str = "k1", run_id: str = "run-1") -> BaseReference:
    """A base reference with placeholder figures: for where references are stored and found, not their
    numbers."""
    from quantize_serve.gates.accuracy import AccuracyRun
    from quantize_serve.report.base_reference import BaseReference
    from quantize_serve.serving.boot import Boot

    capacity = CapacityConfig(
        name=Boot.BASE,
        kv_cache_dtype="auto",
        weights_bytes=1,
        kv_cache_memory_bytes=2,
        kv_cache_tokens=3,
        num_blocks=4,
        block_size=5,
        max_model_len=6,
        max_concurrency=7.0,
        boot_seconds=8.0,
    )
    accuracy = AccuracyRun(
        server_base_url="http://127.0.0.1:1", tasks={}, seconds=1.0, lm_eval_version="0.4.13"
    )
    return BaseReference(
        key=key, run_id=run_id, run_dir=run_id, capacity=capacity, accuracy=accuracy, factors={}
    )
