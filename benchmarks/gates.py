"""The promotion gates on the reference model: the whole flow for the tiny AWQ and GPTQ recipes, and
for the harmful one the gates must reject on their own (tiny-llama-sparse-gptq: 50% SparseGPT, then
GPTQ W4A16), on an ephemeral Prefect API, Hub publishing left out, default thresholds.

Writes benchmarks/results/gate-decisions/gates.json: per recipe, `accuracy` (per task and metric: base,
quantized, recovery, recovery_interval (the ~95% interval; null where lm-eval gives no stderr),
threshold, passed, warning (set when the interval crosses the threshold; see docs/gates.md)),
`stress` (the stress summary and vllm bench serve's throughput), and `decision` (passed,
reasons: one per check).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from benchmarks.harness import AVX512_FIX, ROOT, serving_choice  # noqa: E402
from benchmarks.evidence import write_json_result  # noqa: E402
from quantize_serve.recipe.load import parse_recipe  # noqa: E402
from quantize_serve.report.run_report import RunReport, report_of, stress_summary  # noqa: E402


def run(method: str) -> dict:
    from flows.pipeline import quantize_serve

    path = ROOT / f"recipes/tiny-llama-{method}.yaml"
    data = yaml.safe_load(path.read_text())
    data.pop("hub")  # measure the gates; publishing is tested elsewhere
    recipe = parse_recipe(data, source=str(path), base_dir=path.parent)
    state = quantize_serve(recipe, return_state=True)
    report = report_of(state.result(raise_on_failure=False))
    assert isinstance(report, RunReport), f"the flow failed before its report: {report}"
    stress = report.stress
    return {
        "accuracy": {
            f"{Path(c.task).stem}/{c.metric}": c.model_dump(
                include={
                    "base",
                    "quantized",
                    "recovery",
                    "recovery_interval",
                    "threshold",
                    "passed",
                    "warning",
                }
            )
            for c in report.accuracy
        },
        "stress": {
            **stress_summary(stress),
            "server_restarts": stress.server_restarts if stress else None,
            "throughput": stress.throughput.model_dump() if stress and stress.throughput else None,
        },
        "decision": {
            "passed": report.decision.passed,
            "reasons": [
                f"{c.check}: {'pass' if c.passed else 'FAIL'}: {c.reason}" for c in report.decision.checks
            ],
        },
        "report": str(Path(report.report_dir) / "report.md"),
    }


METHODS = ("awq", "gptq", "sparse-gptq")
# The demo's INT8 W8A8 would make AWQ and GPTQ one SmoothQuant + GPTQ recipe and cannot stand in for the
# sparse recipe's own llm-compressor recipe: a host that cannot serve them as written is refused.
FIX = f"{AVX512_FIX}; `make demo` runs the gates on this CPU as INT8 W8A8"


def main() -> None:
    for method in METHODS:  # before any flow starts
        serving_choice("gates.py", ROOT / f"recipes/tiny-llama-{method}.yaml", as_demo=False, fix=FIX)
    results = {method: run(method) for method in METHODS}

    out = ROOT / "benchmarks/results/gate-decisions/gates.json"
    write_json_result(out, results)
    for method, r in results.items():
        print(method, "decision:", "pass" if r["decision"]["passed"] else "FAIL")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
