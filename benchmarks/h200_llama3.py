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
(benchmarks/results/h200_llama3.json when copied back).

``--rehearse`` runs the same steps on a CPU host with the reference model (CPU overrides: a
memory budget, short contexts, a small stress test), to catch mistakes before device time is spent.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["HF_HUB_OFFLINE"] = "0"  # the local endpoint is the Hub here (benchmarks.h200 defaults it to 1)
os.environ["HF_HUB_DISABLE_XET"] = "1"  # the local endpoint takes plain LFS uploads

from benchmarks.h200 import GIB, Nvml, PeakSampler, Results, gib, log, versions, wait_for_build

BASE_ID = "meta-llama/Meta-Llama-3-8B-Instruct"
DEPLOYMENT = "llama3"
TOKEN = "hf_local_h200_endpoint_token"  # the local endpoint's own token, not a Hub secret
PPL_TASK = [{"task": "../evals/tasks/qs_heldout_ppl.yaml"}]
REDIRECTED = ("gates.accuracy.tasks: the held-out perplexity task (evals/tasks/qs_heldout_ppl.yaml) instead of "
              "gsm8k, arc_challenge, hellaswag and mmlu: their data cannot be downloaded here, and random "
              "weights cannot pass a meaningful accuracy gate; the gate is perplexity recovery")
# CPU rehearsal only: the reference model on CPU vLLM (as recipes/tiny-llama-awq.yaml serves it)
REHEARSE_OVERRIDES = {
    "calibration.num_samples": 16, "calibration.max_seq_len": 256,
    "serve": {"max_model_len": 512, "max_num_seqs": 8, "gpu_memory_utilization": 0.9, "max_num_batched_tokens": 2048, "kv_cache_dtype": "fp8",
              "enforce_eager": True, "memory_budget": "8MiB"},
    "gates.stress": {"concurrency": 8, "num_requests": 16, "max_duration_s": 300, "prompt_tokens": [16, 64, 200],
                     "output_tokens": [8, 32], "long_prompt_share": 0.25, "overlong_prompts": 1,
                     "max_preemptions": 0, "request_timeout_s": 120},
    "gates.accuracy.batch_size": 8, "gates.accuracy.num_concurrent": 2,
}


def publish_base(api: Any, model_dir: Path, scratch: Path) -> str:
    """The base model under Meta's id, with an ``original/`` folder as Meta's repos have."""
    api.create_repo(BASE_ID, private=True, exist_ok=True)
    original = scratch / "original"
    original.mkdir(parents=True, exist_ok=True)
    (original / "params.json").write_text(json.dumps({"note": "placeholder for Meta's original/ weights"}))
    (original / "consolidated.00.pth").write_bytes(b"\0" * (8 << 20))  # 8 MiB placeholder, never needed
    api.upload_folder(repo_id=BASE_ID, folder_path=str(model_dir), commit_message="base model",
                      ignore_patterns=["build.json"])
    return api.upload_folder(repo_id=BASE_ID, folder_path=str(original), path_in_repo="original",
                             commit_message="original/ (Meta ships consolidated .pth weights here)").oid


def deployment_env(serving_python: str) -> dict[str, str]:
    import yaml

    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    (dep,) = [d for d in spec["deployments"] if d["name"] == DEPLOYMENT]
    return {**dep["work_pool"]["job_variables"]["env"], "QS_SERVING_PYTHON": serving_python}


def stage_seconds(api_url: str, run_id: str) -> tuple[dict[str, Any], dict[str, float]]:
    """The flow run (state, wall) and each stage's seconds: the time between the run's "stage done"
    log lines (tasks.report.Progress), the first counted from the run's start."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
        logs, page = [], None
        while page is None or len(page) == 200:  # the API's page size
            page = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])),
                                    limit=200, offset=len(logs))
            logs += page
    marks = sorted((log.timestamp, log.message.removeprefix("stage done: ")) for log in logs
                   if log.message.startswith("stage done: "))
    stages, last = {}, run.start_time
    for when, stage in marks:
        stages[stage] = round((when - last).total_seconds(), 1) if last else None
        last = when
    flow = {"state": run.state.type.value if run.state else None,
            "state_message": run.state.message if run.state else None,
            "seconds": round(run.total_run_time.total_seconds(), 1), "run_id": str(run.id)}
    return flow, stages


def cmd_run(args: argparse.Namespace) -> None:
    from huggingface_hub import HfApi

    from localhub.datasets import publish_ultrachat
    from quantize_serve.core.settings import get_settings
    from quantize_serve.recipe.load import load_recipe
    from scripts.local_stack import local_stack

    state = Path(args.state).resolve()
    model_dir = Path(args.model_dir).resolve()
    home = state / "llama3-stack"
    shutil.rmtree(home, ignore_errors=True)
    runs, work = home / "runs", home / "work"
    res = Results(Path(args.out), roots=(state, get_settings().serving_python.parent))
    nvml = Nvml()
    recipe = load_recipe(ROOT / "recipes/llama3-8b-instruct-awq.yaml")
    overrides: dict[str, Any] = {"gates.accuracy.tasks": PPL_TASK}
    if args.rehearse:
        overrides.update(REHEARSE_OVERRIDES)
    serving_python = str(get_settings().serving_python)
    res.data.update(started=time.strftime("%Y-%m-%dT%H:%M:%S"), rehearse=args.rehearse, device=nvml.info(),
                    command=f"prefect deployment run quantize-serve/{DEPLOYMENT} --watch",
                    deployment_parameters={"overrides": overrides}, redirected=REDIRECTED,
                    weights="random bf16 weights of Llama-3-8B's shapes (seed 0): accuracy figures are not "
                            "model quality; the gate is perplexity recovery", versions=versions())
    res.save()
    res.data["build"] = wait_for_build(model_dir, Path(args.build_pid_file) if args.build_pid_file else None,
                                       args.build_timeout_s)
    baseline = nvml.used()
    res.data["gpu_memory_idle_baseline_gib"] = gib(baseline)
    res.save()
    t_all = time.monotonic()
    extra = {"QS_RUNS_DIR": str(runs), "QS_WORK_DIR": str(work), "HF_DATASETS_OFFLINE": "0",
             "HF_HOME": str(home / "hf-home")}  # a fresh HF cache: the dataset comes from the endpoint
    with local_stack(home, hub_token=TOKEN, deploy=False, extra_env=extra) as stack:
        api = HfApi(endpoint=stack.hub_endpoint, token=TOKEN)
        t0 = time.monotonic()
        base_sha = publish_base(api, model_dir, home / "scratch")
        if not (args.keep_model or args.rehearse):  # the Hub holds it now; the run downloads its own copy (disk: 64 GiB hosts)
            for shard in model_dir.glob("*.safetensors"):
                shard.unlink()
        res.data["disk_free_gib_after_publish"] = gib(shutil.disk_usage(state).free)
        c = recipe.calibration
        publish_ultrachat(api, repo_id=c.dataset, train_sft=2 * c.num_samples)  # split train_sft, as the recipe
        res.data["hub_setup"] = {"base_model": BASE_ID, "base_sha": base_sha, "calibration_dataset": c.dataset,
                                 "split": c.split, "seconds": round(time.monotonic() - t0, 1)}
        log(f"local Hub: {BASE_ID}@{base_sha[:12]}, {c.dataset}:{c.split} ({res.data['hub_setup']['seconds']} s)")
        stack.prefect("--no-prompt", "deploy", "--name", DEPLOYMENT,
                      "--param", f"overrides={json.dumps(overrides)}",
                      "--job-variable", json.dumps({"env": deployment_env(serving_python)}))
        t0 = time.monotonic()
        with PeakSampler(nvml) as peak:
            rc, output, run_id = stack.run_deployment(DEPLOYMENT, pool="gpu", timeout=args.timeout_s,
                                                      echo=lambda line: print(line[:300], flush=True))
        wall = round(time.monotonic() - t0, 1)
        (state / "llama3-watch.log").write_text(output)
        flow, stages = stage_seconds(stack.api_url, run_id) if run_id else ({}, {})
        reports = sorted(runs.glob("*/report.json"))
        report = json.loads(reports[-1].read_text()) if reports else {}
        release = report.get("release") or {}
        tags = {}
        if release.get("repo_id"):
            tags = {t.name: t.target_commit for t in api.list_repo_refs(release["repo_id"]).tags}
        downloaded = sorted({str(p.relative_to(snap)) for snap in (work / "hub").glob("models--*/snapshots/*")
                             for p in snap.rglob("*") if p.is_file()})
    after = nvml.used()
    for _ in range(30):  # the stack is stopped: the GPU should be back at the idle baseline
        if after is None or baseline is None or after - baseline <= GIB // 4:
            break
        time.sleep(1)
        after = nvml.used()
    decision = report.get("decision") or {}
    res.data.update(
        exit_code=rc, wall_seconds=wall, flow=flow, stage_seconds=stages,
        decision="passed" if decision.get("passed") else ("rejected" if decision else None),
        reasons=[f"{c['check']}: {'pass' if c['passed'] else 'FAIL'}: {c['reason']}" for c in decision.get("checks", [])],
        release={k: release.get(k) for k in ("status", "repo_id", "ref", "commit_sha")},
        hub_tags=tags,
        promoted_tag_is_gated_commit=bool(release.get("commit_sha")) and tags.get(recipe.hub.release_ref) == release.get("commit_sha"),
        base_download_files=downloaded,
        original_folder_downloaded=any(n.startswith("original/") for n in downloaded),
        capacity={c["name"]: {k: c.get(k) for k in ("kv_cache_tokens", "max_concurrency", "weights_bytes")}
                  for c in (report.get("capacity") or {}).get("configs", [])},
        gpu_memory_peak_gib=gib(peak.peak), gpu_memory_after_gib=gib(after),
        gpu_memory_back_at_baseline=None if after is None or baseline is None else after - baseline <= GIB // 4,
        total_seconds=round(time.monotonic() - t_all, 1), finished=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    res.save()
    log(f"done: rc {rc}, {flow.get('state')}, decision {res.data['decision']}, release {release.get('status')}, "
        f"tags {tags}, wall {wall} s")


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
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    main()
