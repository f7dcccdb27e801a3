"""The whole flow on the tiny AWQ recipe against exactly the same steps done by hand, on the same
machine in the same run, the two interleaved (manual, flow, manual, flow, ...) so both see the same
load on a shared host.

Careful manual = what the engines' docs show, one command per step, the way a careful engineer
shares boots (one per configuration, 3 in all; the flow derives the 16-bit KV row from the fp8 boot,
serve.sixteen_bit_kv_row, so it boots twice):
1. an llm-compressor ``oneshot`` script (the same llm-compressor recipe and calibration samples);
2. ``vllm serve`` base (16-bit KV): ``/metrics`` for capacity, then ``lm_eval --model
   local-completions`` with the recipe's five accuracy tasks in one invocation;
3. ``vllm serve`` W4A16, 16-bit KV: ``/metrics``;
4. ``vllm serve`` W4A16, fp8 KV: ``/metrics``; ``lm_eval`` (the same five tasks); the stress test
   as the engine's own tool does it: ``/metrics`` before, ``vllm bench serve`` once per step of the
   flow's concurrency ramp (1 -> 25% -> 50% -> 100% of the target, the same request counts and
   mean lengths as the flow's plan), the over-long prompts sent by hand (each must get HTTP 400),
   ``/metrics`` after (preemptions); then the final ``vllm bench serve`` at the target concurrency
   with the flow's exact arguments.
lm-eval's concurrency is the same on both sides (what the recipe's gate resolves to). The commands are
``benchmarks/manual.py``'s, shared with the H200 counterpart (``benchmarks/h200_release_time.py --runs
manual``: the production recipe, timed against the flow's first release).
Pipeline = ``quantize-serve run recipe`` (no Hub section, fresh checkpoint cache), which also
writes the report. Both quantize from scratch.

Writes benchmarks/results/release-time/pipeline_vs_manual.json: each round's wall times, the totals and
``ratio_vs_careful_manual`` = sum(pipeline) / sum(careful manual), the vLLM boots of each, and
the host's load average during the measurement. Both paths share one ``VLLM_CACHE_ROOT``, filled
by an untimed boot before the first round.

    .venv/bin/python benchmarks/pipeline_vs_manual.py --rounds 2    # the measurement
    .venv/bin/python benchmarks/pipeline_vs_manual.py --rounds 1 --out OUT.json    # a smoke run
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
from benchmarks.manual import (  # noqa: E402 - the steps by hand, shared with h200_release_time.py --runs manual
    PY,
    Serve,
    kv_budget,
    lm_eval,
    oneshot_params,
    oneshot_script,
    sh,
    stress_by_hand,
)

from benchmarks.harness import ROOT, serving_choice  # noqa: E402
from benchmarks.evidence import write_json_result  # noqa: E402
from quantize_serve.gates.accuracy.run import lm_eval_concurrency  # noqa: E402
from quantize_serve.quantize.run import build_llmcompressor_recipe  # noqa: E402
from quantize_serve.recipe.load import load_recipe  # noqa: E402
from quantize_serve.serving.server import BOOT_START_DEFAULTS  # noqa: E402

RECIPE = ROOT / "recipes/tiny-llama-awq.yaml"
ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "TOKENIZERS_PARALLELISM": "false",
    **BOOT_START_DEFAULTS,  # as the flow's boots: vLLM's engine core forked (vLLM spawns it on CPU anyway)
}


def host_choice() -> tuple[dict[str, Any], str | None]:
    """The recipe overrides both paths run with on this host, and the line that says why: the demo's own
    choice (scripts/demo.py: on a CPU without AVX-512, INT8 W8A8 with a 16-bit KV cache). A host that
    serves not even that is refused in one line (harness.serving_choice)."""
    return serving_choice("pipeline_vs_manual.py", RECIPE, as_demo=True)


def with_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A recipe mapping with dotted ``overrides`` set (``serve.kv_cache_dtype``: its ``serve`` section's
    key)."""
    out = copy.deepcopy(data)
    for dotted, value in overrides.items():
        *sections, key = dotted.split(".")
        node = out
        for s in sections:
            node = node.setdefault(s, {})
        node[key] = value
    return out


def manual(work: Path, name: str, overrides: dict[str, Any]) -> tuple[float, int]:
    """The steps by hand, from scratch (its own oneshot checkpoint), one boot per configuration;
    returns (seconds, vLLM boots)."""
    recipe = load_recipe(RECIPE, overrides)
    gate, serve_section = recipe.gates.accuracy, recipe.serve
    tasks = [Path(t.task).stem for t in gate.tasks]  # the task files' names are their task names
    evaluate = {
        "tasks": tasks,
        "batch_size": gate.batch_size,
        "concurrent": lm_eval_concurrency(gate, serve_section),
        "max_length": serve_section.max_model_len,
        "env": ENV,
        "cwd": ROOT / "evals/tasks",
    }
    work = work / name
    work.mkdir(parents=True)
    base, ckpt = ROOT / "models/tiny-llama", work / "ckpt"
    (work / "recipe.yaml").write_text(build_llmcompressor_recipe(recipe.quantization))
    (work / "oneshot.py").write_text(oneshot_script(oneshot_params(recipe, base, ckpt, work / "recipe.yaml")))
    boots = 0

    def serve(model: Path, kv_dtype: str) -> Serve:
        nonlocal boots
        boots += 1
        return Serve(model, kv_dtype, kv_budget(serve_section, model), serve=serve_section, env=ENV)

    started = time.monotonic()
    sh([PY, work / "oneshot.py"], env=ENV)
    with serve(base, "auto") as s:
        s.metrics()
        lm_eval(s.url, base, work / "lm-eval-base", **evaluate)
    production_kv = serve_section.kv_cache_dtype
    if production_kv not in ("auto", "bfloat16"):  # the 16-bit KV row is a boot of its own then
        with serve(ckpt, "bfloat16") as s:
            s.metrics()
    with serve(ckpt, production_kv) as s:
        s.metrics()
        lm_eval(s.url, ckpt, work / "lm-eval-quant", **evaluate)
        stress_by_hand(s, recipe, ckpt, work / "stress", env=ENV)
    return time.monotonic() - started, boots


def pipeline(work: Path, name: str, overrides: dict[str, Any]) -> tuple[float, int]:
    data = with_overrides(yaml.safe_load(RECIPE.read_text()), overrides)
    data.pop("hub")
    recipe = ROOT / "recipes" / f".bench-{name}.yaml"
    recipe.write_text(yaml.safe_dump(data))
    env = {**ENV, "QS_WORK_DIR": str(work / name / "work"), "QS_RUNS_DIR": str(work / name / "runs")}
    started = time.monotonic()
    try:
        subprocess.run(
            [PY, "-m", "quantize_serve.cli", "run", recipe],
            cwd=ROOT,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    finally:
        recipe.unlink()
    wall = time.monotonic() - started
    boots = len(list((work / name / "runs").glob("*/vllm-*.log")))
    return wall, boots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="manual/pipeline pairs, interleaved")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/release-time/pipeline_vs_manual.json"
    )
    args = parser.parse_args()
    overrides, why = host_choice()
    if why:
        print(why, flush=True)
    rounds, load = [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # One vLLM cache for both paths (model-info and compile caches), filled by one untimed boot first:
        # neither path pays its first fill, as neither would on a host that has served before.
        ENV["VLLM_CACHE_ROOT"] = str(work / "vllm-cache")

        base, serve_section = ROOT / "models/tiny-llama", load_recipe(RECIPE, overrides).serve
        with Serve(base, "auto", kv_budget(serve_section, base), serve=serve_section, env=ENV):
            pass
        for i in range(args.rounds):
            load.append(os.getloadavg()[0])
            manual_s, manual_boots = manual(work, f"manual-{i}", overrides)
            load.append(os.getloadavg()[0])
            pipeline_s, pipeline_boots = pipeline(work, f"pipeline-{i}", overrides)
            load.append(os.getloadavg()[0])
            rounds.append(
                {
                    "careful_manual_seconds": round(manual_s, 1),
                    "pipeline_seconds": round(pipeline_s, 1),
                    "ratio": round(pipeline_s / manual_s, 3),
                }
            )
            print(rounds[-1], flush=True)
    pipeline_total = sum(r["pipeline_seconds"] for r in rounds)
    manual_total = sum(r["careful_manual_seconds"] for r in rounds)
    result = {
        "rounds": rounds,
        "pipeline_seconds": round(pipeline_total / len(rounds), 1),
        "pipeline_vllm_boots": pipeline_boots,
        "careful_manual_seconds": round(manual_total / len(rounds), 1),
        "careful_manual_vllm_boots": manual_boots,
        "ratio_vs_careful_manual": round(pipeline_total / manual_total, 3),
        "load_average_1min": {"min": round(min(load), 2), "max": round(max(load), 2)},
        "host": f"{os.cpu_count()} CPU cores",
        "overrides": overrides,  # what this host serves (the demo's choice); empty: the recipe as it is
        "note": "the two paths interleaved (manual, pipeline, manual, pipeline, ...) so both see the same "
        "load; the same steps on both sides: quantize from scratch (the same llm-compressor recipe, oneshot "
        "arguments and calibration rows), vLLM boots with /metrics on each (by hand one per "
        "configuration; the flow derives row (b), the 16-bit KV one, from the fp8 boot unless "
        "serve.sixteen_bit_kv_row is boot), the five "
        "accuracy tasks on base and fp8 boots, the stress ramp (one vllm bench serve per step, the "
        "over-long prompts, /metrics before and after) and the final vllm bench serve; the pipeline "
        "also writes the report. ratio = sum(pipeline) / sum(manual)",
    }

    write_json_result(args.out, result)
    print(result)


if __name__ == "__main__":
    main()
