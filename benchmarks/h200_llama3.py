"""The production path on a GPU host: `prefect deployment run quantize-serve/llama3 --watch`.

What a platform team does, on one H200 with no registry and no Hub (scripts/gpu/README.md):

1. A local Hub endpoint (``localhub``, token required) holds
   - ``meta-llama/Meta-Llama-3-8B-Instruct``: the 8B Llama-3-shaped model ``benchmarks/h200.py
     build`` makes (random bf16 weights, the reference tokenizer), plus an ``original/`` folder like
     Meta's (a small placeholder: the download must skip it);
   - ``HuggingFaceH4/ultrachat_200k``: chat rows the project makes, split ``train_sft``, a
     ``messages`` column, as the recipe reads it.
2. A Prefect server, the ``gpu`` process work pool and its worker, the ``gpu`` concurrency limit,
   and ``prefect deploy`` of the ``llama3`` deployment from prefect.yaml.
3. Exactly ``prefect deployment run quantize-serve/llama3 --watch``.

What the deployment is given, and why (recorded in the result and in the run's report):
- parameter ``overrides`` -> ``gates.accuracy.tasks``: the held-out perplexity task. Random weights
  cannot pass a meaningful accuracy gate, and gsm8k, ARC, HellaSwag and MMLU cannot be downloaded
  here; the gate compares the quantized model's perplexity with the base's (recovery), and the
  decision is what the gates say.
- job variable ``env``: the deployment's env with ``QS_SERVING_PYTHON`` pointing at this host's
  vLLM (the serving wheel set), everything else as in prefect.yaml.

Measured: time to decision with each task's seconds, the decision and its reasons, the promoted
tag against the gated commit, GPU memory before and after. Written to ``--out``
(benchmarks/results/capacity/h200_llama3.json when copied back).

``--rehearse`` runs the same steps on a CPU host with the reference model (CPU overrides: a
memory budget, short contexts, a small stress test), to catch mistakes before device time is spent.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
from benchmarks import harness  # noqa: E402 - the benchmarks' shared module
from benchmarks import production_stack as production  # noqa: E402 - the local Hub and deployment

harness.driver_env(local_hub=True)  # before the product's imports, which read it

from localhub.datasets import publish_ultrachat  # noqa: E402
from quantize_serve.core.settings import get_settings  # noqa: E402
from quantize_serve.recipe.load import load_recipe  # noqa: E402
from quantize_serve.serving import gpu  # noqa: E402
from scripts.local_stack import local_stack  # noqa: E402

SCENARIO = harness.load_scenario("llama3")
PPL_TASK = SCENARIO["accuracy_tasks"]
REDIRECTED = (
    "gates.accuracy.tasks: the held-out perplexity task (evals/tasks/qs_heldout_ppl.yaml) instead of "
    "gsm8k, arc_challenge, hellaswag and mmlu: their data cannot be downloaded here, and random "
    "weights cannot pass a meaningful accuracy gate; the gate is perplexity recovery"
)
REHEARSE_OVERRIDES = harness.shared_settings()["llama3_rehearse_overrides"]
log = harness.logger("llama3")


def cmd_run(args: argparse.Namespace) -> None:
    harness.require_gpu("h200_llama3.py", "--rehearse runs it on this CPU", rehearsing=args.rehearse)
    from huggingface_hub import HfApi  # after HF_HUB_OFFLINE is set: huggingface_hub reads it on import

    state = Path(args.state).resolve()
    model_dir = Path(args.model_dir).resolve()
    home = state / "llama3-stack"
    shutil.rmtree(home, ignore_errors=True)
    runs, work = home / "runs", home / "work"
    res = harness.Results(Path(args.out), roots=(state, get_settings().serving_python.parent))
    recipe = load_recipe(harness.ROOT / SCENARIO["recipe"])
    overrides: dict[str, Any] = {"gates.accuracy.tasks": PPL_TASK}
    if args.rehearse:
        overrides.update(REHEARSE_OVERRIDES)
    serving_python = str(get_settings().serving_python)
    res.data.update(
        started=time.strftime("%Y-%m-%dT%H:%M:%S"),
        rehearse=args.rehearse,
        device=gpu.memory_info(0),
        command=f"prefect deployment run quantize-serve/{production.DEPLOYMENT} --watch",
        deployment_parameters={"overrides": overrides},
        redirected=REDIRECTED,
        weights="random bf16 weights of Llama-3-8B's shapes (seed 0): accuracy figures are not "
        "model quality; the gate is perplexity recovery",
        versions=harness.versions(),
    )
    res.save()
    res.data["build"] = harness.wait_for_build(
        model_dir, Path(args.build_pid_file) if args.build_pid_file else None, args.build_timeout_s
    )
    baseline = gpu.device_used_bytes()
    res.data["gpu_memory_idle_baseline_gib"] = harness.gib(baseline)
    res.save()
    t_all = time.monotonic()
    extra = {
        "QS_RUNS_DIR": str(runs),
        "QS_WORK_DIR": str(work),
        "HF_DATASETS_OFFLINE": "0",
        "HF_HOME": str(home / "hf-home"),
    }  # a fresh HF cache: the dataset comes from the endpoint
    with local_stack(home, hub_token=production.STACK_TOKEN, deploy=False, extra_env=extra) as stack:
        api = HfApi(endpoint=stack.hub_endpoint, token=production.STACK_TOKEN)
        t0 = time.monotonic()
        base_sha = production.publish_base(
            api, model_dir, home / "scratch", keep=args.keep_model or args.rehearse
        )
        res.data["disk_free_gib_after_publish"] = harness.gib(shutil.disk_usage(state).free)
        c = recipe.calibration
        publish_ultrachat(
            api, repo_id=c.dataset, train_sft=2 * c.num_samples
        )  # split train_sft, as the recipe
        res.data["hub_setup"] = {
            "base_model": production.BASE_ID,
            "base_sha": base_sha,
            "calibration_dataset": c.dataset,
            "split": c.split,
            "seconds": round(time.monotonic() - t0, 1),
        }
        log(
            f"local Hub: {production.BASE_ID}@{base_sha[:12]}, {c.dataset}:{c.split} "
            f"({res.data['hub_setup']['seconds']} s)"
        )
        stack.prefect(
            "--no-prompt",
            "deploy",
            "--name",
            production.DEPLOYMENT,
            "--param",
            f"overrides={json.dumps(overrides)}",
            "--job-variable",
            json.dumps({"env": production.deployment_env(serving_python)}),
        )
        t0 = time.monotonic()
        with gpu.PeakMemorySampler() as peak:
            rc, output, run_id = stack.run_deployment(
                production.DEPLOYMENT,
                pool="gpu",
                timeout=args.timeout_s,
                echo=lambda line: print(line[:300], flush=True),
            )
        wall = round(time.monotonic() - t0, 1)
        (state / "llama3-watch.log").write_text(output)
        flow, stages = production.stage_seconds(stack.api_url, run_id) if run_id else ({}, {})
        reports = sorted(runs.glob("*/report.json"))
        report = json.loads(reports[-1].read_text()) if reports else {}
        release = report.get("release") or {}
        tags = {}
        if release.get("repo_id"):
            tags = {t.name: t.target_commit for t in api.list_repo_refs(release["repo_id"]).tags}
        downloaded = sorted(
            {
                str(p.relative_to(snap))
                for snap in (work / "hub").glob("models--*/snapshots/*")
                for p in snap.rglob("*")
                if p.is_file()
            }
        )
    after = gpu.device_used_bytes()
    for _ in range(30):  # the stack is stopped: the GPU should be back at the idle baseline
        if after is None or baseline is None or after - baseline <= harness.GIB // 4:
            break
        time.sleep(1)
        after = gpu.device_used_bytes()
    decision = report.get("decision") or {}
    res.data.update(
        exit_code=rc,
        wall_seconds=wall,
        flow=flow,
        stage_seconds=stages,
        decision="passed" if decision.get("passed") else ("rejected" if decision else None),
        reasons=[
            f"{c['check']}: {'pass' if c['passed'] else 'FAIL'}: {c['reason']}"
            for c in decision.get("checks", [])
        ],
        release={k: release.get(k) for k in ("status", "repo_id", "ref", "commit_sha")},
        hub_tags=tags,
        promoted_tag_is_gated_commit=bool(release.get("commit_sha"))
        and tags.get(recipe.hub.release_ref) == release.get("commit_sha"),
        base_download_files=downloaded,
        original_folder_downloaded=any(n.startswith("original/") for n in downloaded),
        capacity={
            c["name"]: {k: c.get(k) for k in ("kv_cache_tokens", "max_concurrency", "weights_bytes")}
            for c in (report.get("capacity") or {}).get("configs", [])
        },
        gpu_memory_peak_gib=harness.gib(peak.peak),
        gpu_memory_after_gib=harness.gib(after),
        gpu_memory_back_at_baseline=None
        if after is None or baseline is None
        else after - baseline <= harness.GIB // 4,
        total_seconds=round(time.monotonic() - t_all, 1),
        finished=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    res.save()
    log(
        f"done: rc {rc}, {flow.get('state')}, decision {res.data['decision']}, release "
        f"{release.get('status')}, tags {tags}, wall {wall} s"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--state", required=True, help="scratch folder (the stack, runs, caches)")
    p.add_argument("--model-dir", required=True, help="the model `benchmarks/h200.py build` makes")
    p.add_argument("--out", required=True)
    p.add_argument("--rehearse", action="store_true")
    p.add_argument("--keep-model", action="store_true", help="keep the built weights after publishing them")
    p.add_argument("--build-pid-file")
    p.add_argument("--build-timeout-s", type=float, default=900)
    p.add_argument("--timeout-s", type=float, default=3000)
    cmd_run(p.parse_args(argv))


if __name__ == "__main__":
    main()
