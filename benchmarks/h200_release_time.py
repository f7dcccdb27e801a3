"""Time to a release decision on one H200, on production-shaped work: a baseline, a first release and a
re-release of the Llama-3-8B shape, each as `prefect deployment run quantize-serve/llama3 --watch`.

The work (localhub/datasets.py, "production-shaped data"; the scores mean nothing on random weights,
the times are real):
- the base: Llama-3-8B's shapes with random bf16 weights (``benchmarks/h200.py build``, as
  benchmarks/h200_llama3.py uses), under ``meta-llama/Meta-Llama-3-8B-Instruct`` on a local Hub;
- calibration: UltraChat-shaped conversations under ``HuggingFaceH4/ultrachat_200k`` whose lengths follow a
  log-normal with a median of ~1,000 tokens (the recipe's 256 samples, cap 2,048: ~300k tokens);
- the accuracy gate: the recipe's own task set (gsm8k 5-shot generation, arc_challenge 25-shot,
  hellaswag 10-shot, mmlu 5-shot) with lm-eval's own task definitions, on rows of the real tasks'
  shape under their real dataset ids, at the recipe's limits.

Three runs, one local stack (Prefect server, `gpu` pool, local Hub):
1. ``baseline``: the product's speed-ups that a setting switches off are off (QS_PREPARE_BOOTS=false,
   QS_REUSE_BASE_REFERENCE=false, QS_QUANTIZE_ON_DEVICE=false, lm-eval's concurrency at the recipe's
   former 16), a fresh work dir
   (an empty vLLM compile cache), its own Hub repo. What stays on: the Hub push beside the boots.
2. ``first_release``: everything on, a fresh work dir, its own Hub repo: a base never released here.
3. ``re_release``: everything on, the first release's work dir and Hub repo, a new calibration draw
   (calibration.shuffle_seed + 1, so the model is quantized again): a known base's next release.

``--runs`` picks some of them, in that order, when one session cannot hold all three: the runs not
picked stay in --out as an earlier session measured them (each run records when). ``re_release`` needs
``first_release`` in the same invocation: it re-releases that run's base from its work dir and Hub repo.

Recorded per run: flow wall and per-stage seconds (the run's "stage done" marks), calibration samples
and tokens (the quantize worker's own line), the task set, the vLLM boots with their compile-cache
hits or compiles (from each boot's log), whether the base reference was reused and from which run,
the decision. Written to ``--out`` (benchmarks/results/h200_release_time.json when copied back).

GPU host (after `benchmarks/h200.py build --model-dir M`):
    .venv/bin/python benchmarks/h200_release_time.py --state S --model-dir M --out OUT.json
CPU smoke (the tiny model, the same three runs with small sizes; proves the script, times mean little):
    .venv/bin/python benchmarks/h200_release_time.py --cpu-smoke --state S --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["HF_HUB_OFFLINE"] = "0"  # the local endpoint is the Hub here
os.environ["HF_HUB_DISABLE_XET"] = "1"  # the local endpoint takes plain LFS uploads

from benchmarks.h200 import Nvml, Results, log, versions, wait_for_build  # noqa: E402
from benchmarks.h200_llama3 import (  # noqa: E402
    BASE_ID,
    DEPLOYMENT,
    REHEARSE_OVERRIDES,
    TOKEN,
    deployment_env,
    publish_base,
    stage_seconds,
)

TASKS = [{"task": "gsm8k", "num_fewshot": 5, "limit": 500}, {"task": "arc_challenge", "num_fewshot": 25, "limit": 500},
         {"task": "hellaswag", "num_fewshot": 10, "limit": 1000}, {"task": "mmlu", "num_fewshot": 5, "limit": 20}]
# CPU smoke: the same tasks and shots, a few documents each (mmlu: one per subject), small data
SMOKE_LIMITS = {"gsm8k": 3, "arc_challenge": 3, "hellaswag": 3, "mmlu": 1}
SMOKE_DATA = {"gsm8k_test": 10, "arc_test": 10, "hellaswag_validation": 10, "mmlu_test": 2}
SMOKE_OVERRIDES = {k: v for k, v in REHEARSE_OVERRIDES.items() if k != "gates.accuracy.num_concurrent"}
BASELINE_ENV = {"QS_PREPARE_BOOTS": "false", "QS_REUSE_BASE_REFERENCE": "false", "QS_QUANTIZE_ON_DEVICE": "false"}
RUNS = ("baseline", "first_release", "re_release")
BASELINE_CONCURRENT = 16  # what recipes/llama3-8b-instruct-awq.yaml set before it was sized to max_num_seqs
CALIBRATION_LINE = re.compile(r"\[quantize\] (\d+) calibration samples, (\d+) tokens")


def boot_logs(run_dir: Path) -> list[dict[str, Any]]:
    """Each vLLM boot of a run: its compile-cache hits and compiles, as vLLM logged them."""
    boots = []
    for path in sorted(run_dir.rglob("vllm-*.log")):
        text = path.read_text(errors="replace")
        compiles = [float(s) for s in re.findall(r"Compiling a graph for compile range .*? takes ([\d.]+) s", text)]
        boots.append({"boot": path.stem.removeprefix("vllm-"),
                      "compile_cache_hits": len(re.findall(r"Directly load the compiled graph", text)),
                      "graphs_compiled": len(compiles), "compile_seconds": round(sum(compiles), 1),
                      "eager": "Enforce eager set" in text})
    return boots


def one_run(stack: Any, res: Results, name: str, *, overrides: dict[str, Any], env: dict[str, str],
            runs: Path, timeout_s: float) -> None:
    before = set(runs.glob("*/report.json"))
    t0 = time.monotonic()
    rc, output, run_id = stack.run_deployment(
        DEPLOYMENT, pool="gpu", params={"overrides": json.dumps(overrides)}, job_variables={"env": env},
        timeout=timeout_s, echo=lambda line: print(line[:300], flush=True))
    wall = round(time.monotonic() - t0, 1)
    (Path(stack.home) / f"{name}-watch.log").write_text(output)
    flow, stages = stage_seconds(stack.api_url, run_id) if run_id else ({}, {})
    new = sorted(set(runs.glob("*/report.json")) - before)
    report = json.loads(new[-1].read_text()) if new else {}
    run_dir = new[-1].parent if new else None
    calibration = CALIBRATION_LINE.search(output)
    decision = report.get("decision") or {}
    res.data["runs"][name] = {
        "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "exit_code": rc, "wall_seconds": wall, "flow": flow, "stage_seconds": stages,
        "calibration": {"samples": int(calibration[1]), "tokens": int(calibration[2])} if calibration else None,
        "tasks": [t.get("task") for t in overrides.get("gates.accuracy.tasks", [])],
        "accuracy_task_seconds": {},
        "boots": boot_logs(run_dir) if run_dir else [],
        "boot_seconds": {c["name"]: c["boot_seconds"] for c in (report.get("capacity") or {}).get("configs", [])},
        "base_reused_from": report.get("base_reused_from"),
        "decision": "passed" if decision.get("passed") else ("rejected" if decision else None),
        "environment": env, "overrides": overrides,
    }
    for side in ("accuracy-base", "accuracy-quantized"):
        summary = run_dir / side / "accuracy_run.json" if run_dir else None
        if summary and summary.is_file():
            tasks = json.loads(summary.read_text())["tasks"]
            res.data["runs"][name]["accuracy_task_seconds"][side] = {k: v["seconds"] for k, v in tasks.items()}
    res.save()
    log(f"{name}: rc {rc}, wall {wall} s, stages {stages}")


def cmd_run(args: argparse.Namespace) -> None:
    from huggingface_hub import HfApi
    from transformers import AutoTokenizer

    from localhub.datasets import publish_production_tasks, publish_ultrachat_production
    from quantize_serve.core.settings import get_settings
    from quantize_serve.recipe.load import load_recipe
    from scripts.local_stack import local_stack

    state = Path(args.state).resolve()
    model_dir = (ROOT / "models/tiny-llama") if args.cpu_smoke else Path(args.model_dir).resolve()
    home = state / "release-time-stack"
    shutil.rmtree(home, ignore_errors=True)
    runs = home / "runs"
    res = Results(Path(args.out), roots=(state, get_settings().serving_python.parent))
    kept = {name: run for name, run in res.data.get("runs", {}).items() if name not in args.runs}
    res.data.clear()  # the runs not asked for this time stay as an earlier session measured them
    res.data.update(errors={}, runs=kept)
    recipe = load_recipe(ROOT / "recipes/llama3-8b-instruct-awq.yaml")
    limits = SMOKE_LIMITS if args.cpu_smoke else {}
    tasks = [{**t, "limit": limits.get(t["task"], t["limit"])} for t in TASKS]
    base_overrides: dict[str, Any] = {"gates.accuracy.tasks": tasks}
    if args.cpu_smoke:
        base_overrides.update(SMOKE_OVERRIDES)
    serving_python = str(get_settings().serving_python)
    res.data.update(
        started=time.strftime("%Y-%m-%dT%H:%M:%S"), cpu_smoke=args.cpu_smoke, device=Nvml().info(),
        command=f"prefect deployment run quantize-serve/{DEPLOYMENT} --watch", versions=versions(),
        weights="random bf16 weights of Llama-3-8B's shapes: the accuracy figures are not model quality, the "
                "times are real" if not args.cpu_smoke else "the project's tiny reference model (CPU smoke)",
        work="production-shaped (localhub/datasets.py): UltraChat-shaped calibration, log-normal lengths, median "
             "~1,000 tokens per conversation, the recipe's cap 2,048; the recipe's task set "
             "(gsm8k 5-shot generation, arc_challenge 25-shot, hellaswag 10-shot, mmlu 5-shot) on rows of "
             "the real tasks' shape under their real dataset ids, lm-eval's own task definitions",
        task_set=tasks)
    if not args.cpu_smoke:
        res.data["build"] = wait_for_build(model_dir, None, args.build_timeout_s)
    res.save()
    extra = {"QS_RUNS_DIR": str(runs), "HF_DATASETS_OFFLINE": "0", "HF_HOME": str(home / "hf-home")}
    with local_stack(home, hub_token=TOKEN, deploy=False, extra_env=extra) as stack:
        api = HfApi(endpoint=stack.hub_endpoint, token=TOKEN)
        t0 = time.monotonic()
        base_sha = publish_base(api, model_dir, home / "scratch")
        if not (args.keep_model or args.cpu_smoke):  # the Hub holds it now (disk: 64 GiB hosts)
            for shard in model_dir.glob("*.safetensors"):
                shard.unlink()
        c = recipe.calibration
        publish_ultrachat_production(api, repo_id=c.dataset, train_sft=2 * c.num_samples,
                                     tokenizer=AutoTokenizer.from_pretrained(model_dir))
        shas = publish_production_tasks(api, **(SMOKE_DATA if args.cpu_smoke else {}))
        res.data["hub_setup"] = {"base_model": BASE_ID, "base_sha": base_sha, "datasets": sorted(shas),
                                 "seconds": round(time.monotonic() - t0, 1)}
        res.save()
        stack.prefect("--no-prompt", "deploy", "--name", DEPLOYMENT)
        env = deployment_env(serving_python)
        repo = recipe.hub.repo_id
        plan = [
            ("baseline", {**base_overrides, "hub.repo_id": repo + "-baseline",
                          "gates.accuracy.num_concurrent": BASELINE_CONCURRENT},
             {**env, **BASELINE_ENV, "QS_WORK_DIR": str(home / "work-baseline")}),
            ("first_release", {**base_overrides, "hub.repo_id": repo}, {**env, "QS_WORK_DIR": str(home / "work")}),
            ("re_release", {**base_overrides, "hub.repo_id": repo, "calibration.shuffle_seed": c.shuffle_seed + 1},
             {**env, "QS_WORK_DIR": str(home / "work")}),
        ]
        for name, overrides, run_env in plan:
            if name not in args.runs:
                continue
            try:
                one_run(stack, res, name, overrides=overrides, env=run_env, runs=runs, timeout_s=args.timeout_s)
            except Exception as exc:  # noqa: BLE001 - recorded; the next run still tells something
                res.data["errors"][name] = repr(exc)[:2000]
                res.save()
    r = res.data["runs"]
    res.data["summary"] = {name: {"wall_seconds": r[name]["wall_seconds"],
                                  "calibration_tokens": (r[name]["calibration"] or {}).get("tokens"),
                                  "compile_cache_hits": sum(b["compile_cache_hits"] for b in r[name]["boots"]),
                                  "base_reused_from": r[name]["base_reused_from"]} for name in r}
    res.data["targets"] = {"first_release_max_s": 600, "re_release_max_s": 360}
    res.data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    res.save()
    log(f"done: {res.data['summary']}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--state", required=True, help="scratch folder (the stack, runs, caches)")
    p.add_argument("--model-dir", help="the model `benchmarks/h200.py build` makes (GPU)")
    p.add_argument("--out", required=True)
    p.add_argument("--cpu-smoke", action="store_true", help="the tiny model on CPU, small sizes")
    p.add_argument("--keep-model", action="store_true", help="keep the built weights after publishing them")
    p.add_argument("--build-timeout-s", type=float, default=900)
    p.add_argument("--timeout-s", type=float, default=3000)
    p.add_argument("--runs", default=",".join(RUNS),
                   help="which runs, in order (a session may not hold all three: the others are kept from --out)")
    args = p.parse_args(argv)
    args.runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    if unknown := [r for r in args.runs if r not in RUNS]:
        p.error(f"--runs: unknown {', '.join(unknown)}; choose from {', '.join(RUNS)}")
    if "re_release" in args.runs and "first_release" not in args.runs:
        p.error("--runs: re_release needs first_release in the same invocation (it re-releases that run's "
                "base from its work dir and Hub repo, which live only as long as this host's scratch folder)")
    if not args.cpu_smoke and not args.model_dir:
        p.error("--model-dir is required on a GPU host (or --cpu-smoke)")
    cmd_run(args)


if __name__ == "__main__":
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    main()
