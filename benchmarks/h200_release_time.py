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
  shape under their real dataset ids, at the recipe's limits; token-true: sized so the served tokenizer
  gives them the tokens Llama-3's would give the real rows (~10M scored prompt tokens a model).

The runs, on one local stack (Prefect server, `gpu` pool, local Hub):
1. ``baseline``: the product's speed-ups off by one setting, QS_STEPS=baseline (report/steps.py: the boots
   not prepared ahead, no base reference reused, llm-compressor's own placement, vLLM's workers spawned,
   lm-eval's echo scoring, every document in one look, quantization before the base), lm-eval's concurrency
   at the recipe's former 16, a fresh work dir (an empty vLLM compile cache), its own Hub repo. What stays
   on: the Hub push beside the boots.
2. ``first_release``: everything on, a fresh work dir, its own Hub repo: a base never released here.
3. ``re_release``: everything on, the first release's work dir and Hub repo, a new calibration draw
   (calibration.shuffle_seed + 1, so the model is quantized again): a known base's next release.
   ``re_release_warm``: the same once more on the same host (calibration.shuffle_seed + 2), its work dir as
   the run before left it: the base's download cached, vLLM's compile cache warm, as on a platform's
   persistent host. ``warm_up`` leaves the host so for less device time than a whole re-release: the
   re-release's download, quantization (calibration.shuffle_seed + 3) and production boot at the recipe's
   serve settings (so the same compile-cache entry), with the gates cut to a few documents a task and one
   wave of stress requests (its task set then differs from the base reference's, so it serves its base too).
4. ``manual`` (benchmarks/release_time_manual.py): ``first_release``'s work by hand, the careful engineer's
   way, with the engines' own commands (``benchmarks/manual.py``, shared with the CPU's
   ``benchmarks/pipeline_vs_manual.py``), each built from the same recipe and overrides as first_release's, a
   fresh work dir (an empty vLLM compile cache) and a Hub repo of its own (``-manual``): ``hf download`` of
   the base (without original/); an llm-compressor ``oneshot`` script the way its examples write one (the
   model loaded in bf16; the llm-compressor recipe the flow builds, the rows the flow calibrates on from the
   local Hub with ``datasets``, rendered with the chat template, and oneshot's arguments and placement as the
   flow sets them: the model on the GPU); ``hf upload`` of the checkpoint started right after, in the
   background (the flow pushes beside the boots too); ``vllm serve`` base (16-bit KV), ``/metrics``, one
   ``lm_eval --model local-completions`` for the whole task set (one group file with each task's few-shot
   count, the limits as ``--samples``); ``vllm serve`` W4A16 16-bit KV, ``/metrics``; ``vllm serve`` W4A16 fp8
   KV, ``/metrics``, the same ``lm_eval``, the stress ramp by ``vllm bench serve`` with the over-long prompts
   by hand, the final ``vllm bench serve``; then, the upload done, ``hf repos tag create`` of the release ref.
   One boot per configuration, the serve settings as the recipe says them. Timed from the first command to the
   tag (the flow's wall ends after its promotion too); ``decision_inputs_seconds`` is the time to the last
   figure the decision reads (the fp8 boot done, the upload done). ``ratio_vs_careful_manual`` = first_release
   wall / manual wall, whenever both are in --out and on one card, with the session (its start), date and
   card each came from (``ratio_vs_careful_manual_from``); a manual run cut short (its record is saved after
   every stage and every 10 s) bounds it instead: ``ratio_at_most``.

``--set KEY=VALUE`` (repeatable): a recipe override for every run (the baseline's own win); runs record them.

``--runs`` picks some of them, always run in the order above, when one session cannot hold them all: the
others stay in --out as an earlier session measured them (each run records when and in which session).
``re_release`` needs ``first_release`` in the same invocation (it re-releases that run's base from its work
dir and Hub repo), or ``--base-reference FILE``: the base reference a first release stored, which the driver
keeps beside --out as h200_base_reference.json, put in this session's work dir (its key, base sha, tasks,
serve settings, vLLM and GPU, must match; the record says which run it came from), for a session that holds
only the re-release; ``re_release_warm`` needs one of the runs before it in the same invocation, and a base
reference the same way. ``manual`` runs alone or after the flow's runs (sharing the local Hub and its datasets
cache with them: warm caches favour it).

Recorded per flow run: the wall of ``prefect deployment run --watch`` (to its last line, the run's final
state; ``driver_seconds`` adds the harness's stop of the worker it started for the run), the flow run's own
seconds and per-stage seconds (the run's "stage done" marks), calibration samples and tokens, the task set,
the vLLM boots with their compile-cache hits or compiles, phases and timeline (from each boot's log), the
stress test's seconds and its bench's, whether the base reference was reused and from which run, the decision,
and the streamed log's progress lines with their seconds since the command started; for ``manual``, the same
per-stage marks (named as the flow's stages where one matches), each command's seconds, the commands as typed,
the boots and what ``/metrics`` gave. Each run names its card (``device``: a session may be lent an H100 where
it asked for an H200). A run measured again replaces its record (``Results.replace_run``); the earlier
one is in git's history of the result file. Written to ``--out`` (h200_release_time.json).

GPU host (after `benchmarks/h200.py build --model-dir M`):
    .venv/bin/python benchmarks/h200_release_time.py --state S --model-dir M --out OUT.json
CPU smoke (the tiny model, the same runs with small sizes; proves the script, times mean little):
    .venv/bin/python benchmarks/h200_release_time.py --cpu-smoke --state S --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
from benchmarks.harness import (  # noqa: E402
    ROOT,
    Results,
    boot_logs,
    driver_env,
    error_text,
    logger,
    parse_sets,
    require_gpu,
    shared_settings,
    versions,
    wait_for_build,
    write_json_result,
)
from benchmarks import production_stack as production  # noqa: E402 - the local Hub and deployment

driver_env(local_hub=True)  # before the product's imports, which read it

from benchmarks import manual as m  # noqa: E402 - the steps by hand, shared with pipeline_vs_manual.py
from benchmarks.release_time_manual import (  # noqa: E402 - the careful engineer's run, and the ratio
    RECIPE,
    SCENARIO,
    ManualSetting,
    manual_recipe,
    manual_run,
    record_ratio,
)
from localhub.datasets import publish_production_tasks, publish_ultrachat_production  # noqa: E402
from quantize_serve.core.settings import get_settings  # noqa: E402
from quantize_serve.recipe.load import load_recipe  # noqa: E402
from quantize_serve.report import base_reference  # noqa: E402
from quantize_serve.serving import gpu  # noqa: E402
from scripts.local_stack import local_stack  # noqa: E402

TASKS = SCENARIO["tasks"]
SMOKE_LIMITS, SMOKE_DATA = SCENARIO["smoke_limits"], SCENARIO["smoke_data"]
# CPU smoke: the llama3 deployment's CPU rehearsal (shared.yaml), lm-eval's concurrency as the gate sets it
SMOKE_OVERRIDES = {
    k: v
    for k, v in shared_settings()["llama3_rehearse_overrides"].items()
    if k != "gates.accuracy.num_concurrent"
}
BASELINE_ENV = SCENARIO["baseline_env"]
RUNS = ("baseline", "first_release", "re_release", "warm_up", "re_release_warm", "manual")
FLOW_RUNS = RUNS[:5]
WARM_UP_OUTPUT_TOKENS = [64]  # warm_up's stress requests (run_plan)
# The base's figures a first release stored (the flow's base reference), beside --out, for a re-release in
# a later session (--base-reference): a first release and a re-release do not fit one session's device time
BASE_REFERENCE_FILE = "h200_base_reference.json"
BASELINE_CONCURRENT = SCENARIO["baseline_concurrent"]
# What a run's streamed log says as it goes: kept under "cut_short" until the run ends, so a run that a
# session's end cuts short still leaves its stages (the final record replaces it)
STAGE_LINE = re.compile(r"stage done: (.+?)\s*$")
PROGRESS_LINE = re.compile(
    r"booting vLLM \([^)]+\)|vLLM \([^)]+\) healthy\b.*"
    r"|lm-eval \S+: .+ documents in .*|lm-eval: .+ look \d+ of \d+(?::| done in) .*"
    r"|\d+ calibration samples, \d+ tokens|device peak .*"
    r"|stress: \d+ requests at concurrency \d+|stress: vllm bench serve.*|stress: (?:passed|FAILED)"
)
log = logger("release")


def stress_seconds(stress: dict[str, Any] | None) -> dict[str, float | None] | None:
    """The stress test's seconds (traffic ramp and bench) and its bench's own (vLLM's ``duration``, the final
    bench's requests only), from the run report's stress result."""
    if not stress:
        return None
    return {"test": stress["duration_s"], "bench": (stress.get("throughput") or {}).get("duration")}


def decided(report: dict[str, Any]) -> dict[str, Any]:
    """What a run's steps chose (report.json's ``steps``, report/steps.py): the base reused from which run,
    why it quantized beside the base, what compiling the production boot's graphs ahead did. A report
    written before the steps carried these three as fields of its own."""
    steps = report.get("steps")
    if not steps:
        return {k: report.get(k) for k in ("base_reused_from", "quantized_beside_base", "compiled_ahead")}
    by_name = {s["name"]: s for s in steps["steps"]}
    return {
        "base_reused_from": steps["base_reused_from"],
        "quantized_beside_base": by_name["quantize"]["why"] if steps["quantized_beside_base"] else None,
        "compiled_ahead": by_name["compile ahead"][
            "outcome"
        ],  # the production boot's graphs (compile_ahead.py)
    }


def one_run(
    stack: Any,
    res: Results,
    name: str,
    *,
    overrides: dict[str, Any],
    env: dict[str, str],
    runs: Path,
    timeout_s: float,
    session: str,
) -> None:
    before = set(runs.glob("*/report.json"))
    t0 = time.monotonic()
    last_line = [t0]
    progress: dict[str, Any] = {
        "state": "cut short: the session's device time ended before the run did; seconds since the command "
        "started, as its log streamed them",
        "session_started": session,
        "stage_done_at": {},
        "log": [],
    }

    def echo(line: str) -> None:
        last_line[0] = now = time.monotonic()
        print(line[:300], flush=True)
        if stage := STAGE_LINE.search(line):
            progress["stage_done_at"][stage[1]] = round(now - t0, 1)
        elif event := PROGRESS_LINE.search(line):
            progress["log"].append(f"{now - t0:.0f} s: {event[0][:200]}")
        else:
            return
        res.data.setdefault("cut_short", {})[name] = progress
        res.save()

    rc, output, run_id = stack.run_deployment(
        production.DEPLOYMENT,
        pool="gpu",
        params={"overrides": json.dumps(overrides)},
        job_variables={"env": env},
        timeout=timeout_s,
        echo=echo,
    )
    # The command's wall ends with its last line (the run's final state); what follows is this harness
    # stopping the worker it started for the run (up to 30 s), no part of the release.
    driver = round(time.monotonic() - t0, 1)
    wall = round(last_line[0] - t0, 1)
    (Path(stack.home) / f"{name}-watch.log").write_text(output)
    flow, stages = production.stage_seconds(stack.api_url, run_id) if run_id else ({}, {})
    new = sorted(set(runs.glob("*/report.json")) - before)
    report = json.loads(new[-1].read_text()) if new else {}
    run_dir = new[-1].parent if new else None
    calibration = m.CALIBRATION_LINE.search(output)
    decision = report.get("decision") or {}
    res.data.setdefault("cut_short", {}).pop(name, None)
    res.replace_run(
        name,
        {
            "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "session_started": session,
            "device": res.card(),
            "exit_code": rc,
            "wall_seconds": wall,
            "driver_seconds": driver,
            "flow": flow,
            "stage_seconds": stages,
            "calibration": {"samples": int(calibration[1]), "tokens": int(calibration[2])}
            if calibration
            else None,
            "tasks": [t.get("task") for t in overrides.get("gates.accuracy.tasks", [])],
            "accuracy_task_seconds": {},
            "boots": boot_logs(run_dir) if run_dir else [],
            "boot_seconds": {
                c["name"]: c["boot_seconds"] for c in (report.get("capacity") or {}).get("configs", [])
            },
            "capacity_rows": {
                c["name"]: {k: c.get(k) for k in ("kv_cache_tokens", "num_blocks", "derived")}
                for c in (report.get("capacity") or {}).get("configs", [])
            },
            "quantize_device_peak_bytes": (report.get("checkpoint") or {}).get("device_peak_bytes"),
            "quantize_stage_seconds": (report.get("checkpoint") or {}).get("stage_seconds"),  # the worker's
            # its imports done before the stage (a worker started as the run validated): not on its wall
            "quantize_imports_ahead": (report.get("checkpoint") or {}).get("imports_ahead"),
            **decided(report),
            "decision": "passed" if decision.get("passed") else ("rejected" if decision else None),
            "stress_seconds": stress_seconds(report.get("stress")),
            "environment": env,
            "overrides": overrides,
            "log": progress["log"],  # seconds since the command started: boots, calibration, lm-eval, stress
        },
    )
    for side in ("accuracy-base", "accuracy-quantized"):
        summary = run_dir / side / "accuracy_run.json" if run_dir else None
        if summary and summary.is_file():
            run = json.loads(summary.read_text())  # one lm-eval call a look serves every task: they overlap
            res.data["runs"][name]["accuracy_task_seconds"][side] = {
                **{k: v["seconds"] for k, v in run["tasks"].items()},
                "all tasks": run["seconds"],
            }
    res.save()
    log(f"{name}: rc {rc}, wall {wall} s, stages {stages}")


def keep_base_reference(work: Path, folder: Path, roots: tuple[Path, ...]) -> None:
    """The base reference first_release stored in ``work`` (the flow's base-references folder), kept in
    ``folder`` as BASE_REFERENCE_FILE with its paths relative to ``roots`` (it is committed): the input of a
    later session's re_release (--base-reference). The driver keeps the GPU's beside --out and the CPU
    smoke's in its state folder, where it cannot replace the GPU's in benchmarks/results."""
    stored = sorted((work / base_reference.FOLDER).glob("*.json"), key=lambda p: p.stat().st_mtime)
    if stored:
        dest = folder / BASE_REFERENCE_FILE
        write_json_result(dest, json.loads(stored[-1].read_text()), roots=roots)
        log(f"base reference of the first release kept as {dest.name}")


def carry_base_reference(path: Path, work: Path) -> dict[str, Any]:
    """Put a base reference from an earlier session where the flow looks for it in ``work``: the re-release
    then finds its base known when its key (base sha, tasks, serve settings, vLLM, GPU) matches."""
    reference = base_reference.BaseReference.model_validate_json(path.read_text())
    base_reference.save_reference(work, reference)
    return {"file": path.name, "run_id": reference.run_id, "key": reference.key}


def run_plan(
    recipe: Any, base_overrides: dict[str, Any], env: dict[str, str], home: Path
) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    """Each flow run's (name, recipe overrides, deployment env), in the order they run: ``recipe`` with
    ``base_overrides`` (every run's) applied. The releases share one work dir and Hub repo (the baseline has
    its own); each re-release draws its calibration rows anew, so the model is quantized again. warm_up cuts
    the gates (the CPU smoke's few documents a task, one wave of stress requests, short answers) and
    nothing else: the serve settings, and so the production boot's compile-cache entry, are every run's."""
    repo, seed = recipe.hub.repo_id, recipe.calibration.shuffle_seed
    release_env = {**env, "QS_WORK_DIR": str(home / "work")}
    warm_up = {
        "gates.accuracy.tasks": [{**t, "limit": SMOKE_LIMITS[t["task"]]} for t in TASKS],
        "gates.stress.num_requests": recipe.serve.concurrency(recipe.gates.stress.concurrency),
        "gates.stress.output_tokens": WARM_UP_OUTPUT_TOKENS,
    }
    baseline = {
        **base_overrides,
        "hub.repo_id": repo + "-baseline",
        "gates.accuracy.num_concurrent": BASELINE_CONCURRENT,
    }
    return [
        ("baseline", baseline, {**env, **BASELINE_ENV, "QS_WORK_DIR": str(home / "work-baseline")}),
        ("first_release", {**base_overrides, "hub.repo_id": repo}, release_env),
        *(
            (
                name,
                {**base_overrides, "hub.repo_id": repo, "calibration.shuffle_seed": seed + n, **cut},
                release_env,
            )
            for n, name, cut in ((1, "re_release", {}), (3, "warm_up", warm_up), (2, "re_release_warm", {}))
        ),
    ]


def cmd_run(args: argparse.Namespace) -> None:
    require_gpu("h200_release_time.py", "--cpu-smoke runs it on this CPU", rehearsing=args.cpu_smoke)
    from huggingface_hub import HfApi  # after HF_HUB_OFFLINE is set: huggingface_hub reads it on import
    from transformers import AutoTokenizer  # heavy (~3 s): only once the run starts

    state = Path(args.state).resolve()
    model_dir = (ROOT / "models/tiny-llama") if args.cpu_smoke else Path(args.model_dir).resolve()
    home = state / "release-time-stack"
    shutil.rmtree(home, ignore_errors=True)
    runs = home / "runs"
    res = Results(Path(args.out), roots=(state, get_settings().serving_python.parent))
    session = time.strftime("%Y-%m-%dT%H:%M:%S")  # this invocation: each run it measures records it
    # Every run stays as an earlier session measured it until this one measures it again
    # (Results.replace_run): one never reached within the device time keeps its measurement in place.
    kept = dict(res.data.get("runs", {}))
    cut = {name: run for name, run in res.data.get("cut_short", {}).items() if name not in args.runs}
    res.data.clear()
    res.data.update(errors={}, runs=kept, cut_short=cut)
    limits = SMOKE_LIMITS if args.cpu_smoke else {}
    tasks = [{**t, "limit": limits.get(t["task"], t["limit"])} for t in TASKS]
    base_overrides: dict[str, Any] = {"gates.accuracy.tasks": tasks, **parse_sets(args.set)}
    if args.cpu_smoke:
        base_overrides.update(SMOKE_OVERRIDES)
    recipe = load_recipe(RECIPE, base_overrides)  # as every run has it, before its own overrides
    serving_python = str(get_settings().serving_python)
    res.data.update(
        started=session,
        cpu_smoke=args.cpu_smoke,
        device=gpu.memory_info(0),
        command=f"prefect deployment run quantize-serve/{production.DEPLOYMENT} --watch",
        versions=versions(),
        weights="random bf16 weights of Llama-3-8B's shapes: the accuracy figures are not model quality, the "
        "times are real"
        if not args.cpu_smoke
        else "the project's tiny reference model (CPU smoke)",
        work="production-shaped (localhub/datasets.py): UltraChat-shaped calibration, log-normal lengths, "
        "median ~1,000 tokens per conversation, the recipe's cap 2,048; the recipe's task set "
        "(gsm8k 5-shot generation, arc_challenge 25-shot, hellaswag 10-shot, mmlu 5-shot) on rows of "
        "the real tasks' shape under their real dataset ids, token-true under the served tokenizer, "
        "lm-eval's own task definitions",
        task_set=tasks,
    )
    if not args.cpu_smoke:
        res.data["build"] = wait_for_build(model_dir, None, args.build_timeout_s)
    res.save()
    extra = {"QS_RUNS_DIR": str(runs), "HF_DATASETS_OFFLINE": "0", "HF_HOME": str(home / "hf-home")}
    with local_stack(home, hub_token=production.STACK_TOKEN, deploy=False, extra_env=extra) as stack:
        api = HfApi(endpoint=stack.hub_endpoint, token=production.STACK_TOKEN)
        t0 = time.monotonic()
        base_sha = production.publish_base(
            api, model_dir, home / "scratch", keep=args.keep_model or args.cpu_smoke
        )
        c = recipe.calibration
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        publish_ultrachat_production(api, repo_id=c.dataset, train_sft=2 * c.num_samples, tokenizer=tokenizer)
        shas = publish_production_tasks(api, **(SMOKE_DATA if args.cpu_smoke else {}), tokenizer=tokenizer)
        res.data["hub_setup"] = {
            "base_model": production.BASE_ID,
            "base_sha": base_sha,
            "datasets": sorted(shas),
            "seconds": round(time.monotonic() - t0, 1),
        }
        res.save()
        if any(name in FLOW_RUNS for name in args.runs):
            stack.prefect("--no-prompt", "deploy", "--name", production.DEPLOYMENT)
        if args.base_reference:
            carried = carry_base_reference(Path(args.base_reference), home / "work")
            res.data["base_reference_carried"] = carried
        env = production.deployment_env(serving_python)
        plan = run_plan(recipe, base_overrides, env, home)
        done: list[str] = []
        for name, overrides, run_env in plan:
            if name not in args.runs:
                continue
            try:
                one_run(
                    stack,
                    res,
                    name,
                    overrides=overrides,
                    env=run_env,
                    runs=runs,
                    timeout_s=args.timeout_s,
                    session=session,
                )
            except Exception as exc:  # noqa: BLE001 - recorded; the next run still tells something
                log(f"{name}: failed: {exc!r}")
                res.data["errors"][name] = error_text(exc)
                res.save()
            done.append(name)
            if name == "first_release":
                keep_base_reference(
                    home / "work", state if args.cpu_smoke else Path(args.out).parent, res.roots
                )
        if "manual" in args.runs:  # first_release's recipe and overrides, by hand (benchmarks/manual.py)
            manual, manual_overrides = manual_recipe(base_overrides, recipe.hub.repo_id)
            try:
                setting = ManualSetting(
                    manual,
                    manual_overrides,
                    {**stack.env, **env},
                    home / "work-manual",
                    Path(serving_python),
                    ready_timeout_s=args.timeout_s / 2,
                )
                manual_run(res, setting, session=session, preceded_by=done)
            except Exception as exc:  # noqa: BLE001 - recorded beside what the run did so far
                log(f"manual: failed: {exc!r}")
                res.data["errors"]["manual"] = error_text(exc)
                res.save()
    r = res.data["runs"]
    res.data["summary"] = {
        name: {
            "wall_seconds": r[name]["wall_seconds"],
            "calibration_tokens": (r[name]["calibration"] or {}).get("tokens"),
            "compile_cache_hits": sum(b["compile_cache_hits"] for b in r[name]["boots"]),
            "base_reused_from": r[name]["base_reused_from"],
        }
        for name in r
    }
    record_ratio(res)
    res.data["targets"] = SCENARIO["targets"]
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
    p.add_argument(
        "--base-reference",
        help=f"a base reference a first release stored ({BASE_REFERENCE_FILE}, written beside --out; the CPU "
        "smoke's in --state): re_release runs without first_release, its base known from that run",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one more recipe override for every run, dotted key and a YAML value (e.g. "
        "calibration.beside_base=always); each run's record lists its overrides",
    )
    p.add_argument(
        "--runs",
        default=",".join(RUNS),
        help=f"which runs (always run in the order {', '.join(RUNS)}; a session may not hold them all: the "
        "others are kept from --out)",
    )
    args = p.parse_args(argv)
    picked = [r.strip() for r in args.runs.split(",") if r.strip()]
    if unknown := [r for r in picked if r not in RUNS]:
        p.error(f"--runs: unknown {', '.join(unknown)}; choose from {', '.join(RUNS)}")
    if not picked:
        p.error(f"--runs: name at least one of {', '.join(RUNS)}")
    args.runs = [r for r in RUNS if r in picked]  # the order they run in, whatever the order given
    if "re_release" in args.runs and "first_release" not in args.runs and not args.base_reference:
        p.error(
            "--runs: re_release needs first_release in the same invocation (it re-releases that run's "
            "base from its work dir and Hub repo, which live only as long as this host's scratch folder), "
            f"or --base-reference {BASE_REFERENCE_FILE} from a first release of another session"
        )
    if "re_release_warm" in args.runs and not {"first_release", "re_release", "warm_up"} & set(args.runs):
        p.error(
            "--runs: re_release_warm needs first_release, re_release or warm_up before it in the same "
            "invocation: it measures the host that run leaves (the base's download cached, a warm compile "
            "cache)"
        )
    if "re_release_warm" in args.runs and "first_release" not in args.runs and not args.base_reference:
        p.error(
            "--runs: re_release_warm needs first_release in the same invocation, or --base-reference "
            f"{BASE_REFERENCE_FILE}: a known base's re-release"
        )
    if not args.cpu_smoke and not args.model_dir:
        p.error("--model-dir is required on a GPU host (or --cpu-smoke)")
    cmd_run(args)


if __name__ == "__main__":
    main()
