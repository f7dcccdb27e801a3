"""Issue 16 on CPU: the release format chosen by measurement on the reference model.

Runs the whole flow on recipes/tiny-llama-formats.yaml (ephemeral Prefect API, Hub publishing left
out): AWQ W4A16, GPTQ W4A16, INT8 W8A8 (SmoothQuant + GPTQ), FP8_DYNAMIC, and the AutoAWQ checkpoint
of tests/fixtures/tiny-llama-autoawq, each served in the production settings (fp8 KV, fixed memory
budget) and measured: weights, KV tokens (fp8 and 16-bit KV), max concurrency, `vllm bench serve`
output tok/s and p99 TTFT at the rule's concurrency (2 runs), accuracy recovery (the trained
reference model: meaningful here), the kernel vLLM chose and the kernel check; the rule picks the
release, which then runs the whole pipeline.

    .venv/bin/python benchmarks/schemes.py      # -> benchmarks/results/release-formats/schemes.json (~25
    min, 2 cores)
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from benchmarks.harness import AVX512_FIX, ROOT, serving_choice  # noqa: E402
from benchmarks.evidence import write_json_result  # noqa: E402
from quantize_serve.formats import choose as formats_module  # noqa: E402
from quantize_serve.recipe.load import parse_recipe  # noqa: E402
from quantize_serve.recipe.quantization import FormatRule  # noqa: E402
from quantize_serve.report.run_report import RunReport, report_of  # noqa: E402
from quantize_serve.serving import host as cpu_support  # noqa: E402

RECIPE = ROOT / "recipes" / "tiny-llama-formats.yaml"


def main() -> None:
    # Its W4A16 candidates and fp8 KV cache are what it compares: a host that cannot serve them is refused
    # (release-formats/cpu_schemes_avx2_emulated.json has what a CPU without AVX-512 serves).
    serving_choice("schemes.py", RECIPE, as_demo=False, fix=AVX512_FIX)
    from flows.pipeline import quantize_serve

    data = yaml.safe_load(RECIPE.read_text())
    data.pop("hub")  # the choice and the gates; publishing is tested elsewhere (tests/flows/test_formats.py)
    recipe = parse_recipe(data, source=str(RECIPE), base_dir=RECIPE.parent)
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    t0 = time.monotonic()
    state = quantize_serve(recipe, return_state=True)
    report = report_of(state.result(raise_on_failure=False))
    assert isinstance(report, RunReport), f"the flow failed before its report: {report}"
    formats = json.loads((Path(report.report_dir) / "formats.json").read_text())
    by_speed = formats_module.choose(
        report.formats.rows,
        FormatRule(rule="throughput", max_p99_ttft_ms=1e9),
        report.formats.bench,
        report.formats.platform,
    )
    flags = cpu_support.cpu_flags()
    result = {
        "started": started,
        "seconds": round(time.monotonic() - t0, 1),
        "cpu": platform.processor() or platform.machine(),
        "avx512": sorted(f for f in flags if f.startswith("avx512")),
        "amx": any(f.startswith("amx") for f in flags),
        "weights": "the trained reference model (models/tiny-llama): recovery is meaningful; speeds are a "
        "2-core CPU's, where 8-bit and 4-bit matmuls have no tensor cores to gain from",
        "recipe": "recipes/tiny-llama-formats.yaml",
        "rule": formats["rule"],
        "bench": formats["bench"],
        "platform": formats["platform"],
        "rows": formats["rows"],
        "pareto": formats["pareto"],
        "chosen": formats["winner"],
        "reason": formats["reason"],
        "winner_by_throughput": by_speed.winner,  # the same rows under rule: throughput, no latency limit
        "winner_by_throughput_reason": by_speed.reason,
        "release": {
            "method": report.checkpoint.method,
            "scheme": report.checkpoint.scheme,
            "decision_passed": report.decision.passed,
            "state": state.type.value,
        },
        "report": str(Path(report.report_dir) / "report.md"),
    }
    write_json_result(ROOT / "benchmarks/results/release-formats/schemes.json", result)
    print((Path(report.report_dir) / "formats.md").read_text())


if __name__ == "__main__":
    main()
