"""The whole flow on the tiny mixture of experts on one GPU: quantized, served, gated and promoted.

``recipes/tiny-qwen3-moe-awq.yaml`` (``models/tiny-qwen3-moe``: Qwen3-MoE architecture, 8 experts, top-2)
runs through the flow as `quantize-serve run` runs a recipe (``flows.pipeline.quantize_serve`` with a
local, temporary Prefect API), in GPU mode as the gpu test tier and `make demo` run the tiny recipes
there (the recipe's serve.memory_budget, the CPU host's budget, is not applied on a GPU host, so vLLM
sizes each boot's KV cache from gpu_memory_utilization: validate/preflight.py for_this_host), against a
local Hub endpoint (``localhub``) that receives the candidate and the release. llm-compressor quantizes on
the GPU (AWQ W4A16_ASYM, every expert calibrated on every token, the routers left 16-bit).

Written to --out (benchmarks/results/capacity/h200_moe.json): the run's final state, decision and reasons, the
release and where the Hub's release ref points (it must be the gated commit), where it quantized, the
model's total and active parameters, the capacity rows with the planner beside them (the run's
report.json), and the kernels each boot's vLLM log names, with the project's kernel check
(``formats.kernel_problem``): on CUDA the W4A16 experts must get Marlin MoE
(``CompressedTensorsWNA16MarlinMoEMethod``). ``targets`` says which of issue 25's conditions hold:
COMPLETED, promoted, the ref on the gated commit, the experts on Marlin MoE.

Before anything starts, the host is checked as `quantize-serve run` and `make demo` check it. On a CPU
the refusal is the expected answer: vLLM's CPU backend serves no quantized mixture of experts
(``serving.host.CPU_MOE_REFUSALS``), so the driver records the one-screen refusal in --out, prints it
in one line and exits 2. ``--recipe recipes/tiny-llama-awq.yaml`` rehearses everything else on a CPU: this
driver, the flow with that recipe's CPU settings, the report read into the JSON.

On the GPU host (scripts/gpu/README.md): ``bash scripts/gpu/host.sh launch-moe``. Exit 0: every target
holds; 1: the run ended otherwise (the JSON says how); 2: refused before it started.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


from benchmarks.harness import (  # noqa: E402
    ROOT,
    Results,
    gib,
    load_scenario,
    logger,
    parse_sets,
    refuse,
    versions,
)
from localhub.client import hub_client_env  # noqa: E402
from localhub.server import start_local_hub  # noqa: E402
from quantize_serve.cli import render_error  # noqa: E402
from quantize_serve.core.errors import RecipeError, RecipeErrors  # noqa: E402
from quantize_serve.core.settings import get_settings  # noqa: E402
from quantize_serve.formats import choose as formats  # noqa: E402
from quantize_serve.recipe.load import load_recipe  # noqa: E402
from quantize_serve.report.run_report import RunReport, report_of, stress_summary  # noqa: E402
from quantize_serve.serving import gpu  # noqa: E402
from quantize_serve.serving.boot import Boot  # noqa: E402
from quantize_serve.serving.host import servable_overrides  # noqa: E402
from benchmarks.evidence import kernel_report  # noqa: E402
from quantize_serve.serving.vllm_log import read_log  # noqa: E402
from quantize_serve.validate.preflight import check_quantize_host, check_serving_host  # noqa: E402

RECIPE = load_scenario("moe")["recipe"]
TOKEN = "hf_local_h200_moe_endpoint_token"  # the local endpoint's own token, not a Hub secret
log = logger("moe")


# --------------------------------------------------------------------------------------------
# Before the run: what it runs with, and whether this host can
# --------------------------------------------------------------------------------------------


def run_overrides(on_gpu: bool) -> tuple[dict[str, Any], str]:
    """The recipe overrides of this run and why: GPU mode on a GPU (as the gpu tier and the demo run the
    tiny recipes), else what this CPU's vLLM serves (``servable_overrides``; none where it serves W4A16)."""
    if on_gpu:
        return {}, (
            "GPU mode: serve.memory_budget (the CPU host's budget) not applied, vLLM sizes each boot's KV "
            "cache from gpu_memory_utilization, as production does"
        )
    overrides, why = servable_overrides()
    return overrides, why or "CPU: the recipe's own settings (serve.memory_budget)"


def host_refusal(recipe_path: Path, overrides: dict[str, Any]) -> str | None:
    """Why this host cannot run the recipe (one screen, as `quantize-serve run` prints it), or None."""
    source = str(recipe_path.relative_to(ROOT)) if recipe_path.is_relative_to(ROOT) else recipe_path.name
    try:
        recipe = load_recipe(recipe_path, overrides)
        check_quantize_host(recipe, source=source)
        check_serving_host(recipe, source=source)
    except (RecipeError, RecipeErrors) as exc:
        return render_error(exc)
    return None


# --------------------------------------------------------------------------------------------
# After the run: its report into the JSON (pure)
# --------------------------------------------------------------------------------------------


def read_report(report_path: Path, *, platform: str) -> dict[str, Any]:
    """The figures of a run's report.json and of the boot logs beside it: decision, release, quantization,
    parameters, capacity rows with the planner, and each boot's kernels (``platform``: where it served,
    ``formats.platform_of``; the kernel check expects that platform's kernels)."""
    report = RunReport.model_validate_json(Path(report_path).read_text())
    folder = Path(report_path).parent
    scheme = report.checkpoint.scheme
    kv = report.capacity.kv_cache_dtype if report.capacity else None  # the production boot's, as served
    kernels: dict[str, Any] = {}
    for boot in Boot:
        path = folder / boot.log_name(scheme, kv_cache_dtype=kv)  # named by what ran, as the flow names it
        text = read_log(path)
        kernels[str(boot)] = {
            "log": path.name if text else None,
            **(kernel_report(text, scheme if boot.quantized else "bf16", platform) if text else {}),
        }
    capacity = report.capacity
    checks = {p.name: p for p in capacity.planner} if capacity else {}
    rows = (
        []
        if capacity is None
        else [
            {
                "name": str(c.name),
                "kv_cache_dtype": c.kv_cache_dtype,
                "tensor_parallel_size": c.tensor_parallel_size,
                "weights_bytes": c.weights_bytes,
                "kv_cache_memory_bytes": c.kv_cache_memory_bytes,
                "kv_cache_tokens": c.kv_cache_tokens,
                "block_size": c.block_size,
                "max_model_len": c.max_model_len,
                "max_concurrency": c.max_concurrency,
                "boot_seconds": c.boot_seconds,
                "planner_kv_tokens": checks[c.name].predicted_kv_tokens if c.name in checks else None,
                "planner_error_pct": checks[c.name].error_pct if c.name in checks else None,
            }
            for c in capacity.configs
        ]
    )
    release = report.release
    model = capacity.model if capacity else None
    return {
        "run_id": report.run_id,
        "recipe": report.recipe,
        "overrides": report.overrides,
        "hardware": report.hardware,
        "vllm_version": report.vllm_version,
        "report_dir": folder.name,
        "decision": "passed" if report.decision.passed else "rejected",
        "reasons": [
            f"{c.check}: {'pass' if c.passed else 'FAIL'}: {c.reason}" for c in report.decision.checks
        ],
        "release": None
        if release is None
        else release.model_dump(
            include={"status", "repo_id", "ref", "commit_sha", "candidate_sha", "rejection_tag"}
        ),
        "quantization": report.checkpoint.model_dump(
            include={"method", "scheme", "device", "placement", "seconds", "base_bytes", "quantized_bytes"}
        ),
        "model": None if model is None else {**model.model_dump(), "summary": model.parameters_line()},
        "capacity": None
        if capacity is None
        else {
            "method": capacity.method,
            "rows": rows,
            "freed_weight_bytes": capacity.freed_weight_bytes,
            "fp8_token_ratio": capacity.fp8_token_ratio,
            "gain_quantized": capacity.gain_quantized,
            "gain_fp8": capacity.gain_fp8,
            "fp8_kv_unavailable": capacity.fp8_kv_unavailable,
        },
        "kernels": kernels,
        "platform": platform,
        "expected_moe_methods": list(
            formats.EXPECTED_MOE_METHODS.get((platform, formats.FAMILY.get(scheme, "")), ())
        ),
        "accuracy": [
            {"task": Path(c.task).stem, "metric": c.metric, "recovery": c.recovery, "passed": c.passed}
            for c in report.accuracy
        ],
        "stress": stress_summary(report.stress),
    }


def targets(result: dict[str, Any]) -> dict[str, bool | None]:
    """Issue 25's conditions on the run (None: not applicable here, e.g. the experts' kernel of a dense
    model or on a CPU)."""
    release = result.get("release") or {}
    is_moe = bool((result.get("model") or {}).get("num_moe_layers"))
    expected = result.get("expected_moe_methods") or []
    quantized = [
        k for name, k in (result.get("kernels") or {}).items() if name != str(Boot.BASE) and k.get("log")
    ]
    served = [m for k in quantized for m in k.get("moe_methods", [])]
    return {
        "completed": result.get("state") == "COMPLETED",
        "promoted": release.get("status") == "promoted",
        "release_ref_on_gated_commit": bool(release.get("commit_sha"))
        and (result.get("hub_tags") or {}).get(release.get("ref")) == release.get("commit_sha"),
        "kernel_check_passed": bool(quantized) and all(k.get("kernel_check") == "passed" for k in quantized),
        "experts_on_marlin_moe": (bool(served) and all(m in expected for m in served))
        if is_moe and expected
        else None,
    }


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


def run_flow(recipe_path: Path, overrides: dict[str, Any], work: Path) -> dict[str, Any]:
    """The flow on ``recipe_path`` against a local Hub endpoint, everything under ``work``: its final state
    and, when it produced a report, the report's path and the Hub's tags of the release repo."""
    from huggingface_hub import HfApi  # ~0.5 s: only the run needs it

    get_settings.cache_clear()  # QS_RUNS_DIR and QS_WORK_DIR are set by main
    with (
        start_local_hub(work / "hub", tokens=(TOKEN,)) as hub,
        hub_client_env(hub.endpoint, cache_dir=work / "hf-cache"),
    ):
        os.environ["HF_TOKEN"] = TOKEN
        from flows.pipeline import quantize_serve  # Prefect (~2 s), once PREFECT_HOME and the Hub are set

        t0 = time.monotonic()
        state = quantize_serve(str(recipe_path), overrides=overrides, return_state=True)
        out: dict[str, Any] = {
            "state": state.type.value,
            "state_message": state.message,
            "flow_seconds": round(time.monotonic() - t0, 1),
        }
        report = report_of(state.result(raise_on_failure=False))
        if isinstance(report, RunReport):
            out["report_path"] = str(Path(report.report_dir) / "report.json")
            if report.release and report.release.repo_id:
                refs = HfApi(endpoint=hub.endpoint, token=TOKEN).list_repo_refs(report.release.repo_id)
                out["hub_tags"] = {t.name: t.target_commit for t in refs.tags}
        else:
            out["error"] = f"{type(report).__name__}: {report}"[-3000:]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--recipe",
        default=RECIPE,
        help=f"default {RECIPE}; recipes/tiny-llama-awq.yaml rehearses the driver on a CPU",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one more recipe override, dotted key and a YAML value (e.g. quantization.scheme=W4A16); "
        "the report lists it",
    )
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/capacity/h200_moe.json")
    p.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "qs-h200-moe",
        help="the run's folders: Prefect home, local Hub, checkpoints, runs",
    )
    args = p.parse_args(argv)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.environ.update(
        QS_RUNS_DIR=str(work / "runs"), QS_WORK_DIR=str(work / "work"), PREFECT_HOME=str(work / "prefect")
    )
    os.environ.pop("PREFECT_API_URL", None)  # a local, temporary API, as `quantize-serve run` uses
    recipe_path = (ROOT / args.recipe) if not Path(args.recipe).is_absolute() else Path(args.recipe)
    on_gpu = gpu.usable_memory_bytes() is not None
    platform = formats.platform_of(gpu.compute_capability())
    overrides, why = run_overrides(on_gpu)
    overrides.update(parse_sets(args.set))
    res = Results(args.out, roots=(work,))
    res.data = {
        "benchmark": "h200_moe",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "recipe_file": args.recipe,
        "run_overrides": overrides,
        "why": why,
        "device": gpu.describe_devices() or "no GPU",
        "platform": platform,
    }
    log(f"{args.recipe} on {res.data['device']} ({platform}); overrides {overrides}: {why}")
    refusal = host_refusal(recipe_path, overrides)
    if refusal:
        res.data.update(
            status="refused before the run", refusal=refusal, finished=time.strftime("%Y-%m-%dT%H:%M:%S")
        )
        res.save()
        one_line = " ".join(line.strip() for line in refusal.splitlines())
        refuse(
            "h200_moe.py",
            f"refused before the run (nothing started): {one_line}",
            f"the screen is in {args.out}",
        )
    res.data.update(status="running", versions=versions())
    res.save()
    baseline = gpu.device_used_bytes()
    t0 = time.monotonic()
    with gpu.PeakMemorySampler() as peak:
        flow = run_flow(recipe_path, overrides, work)
    res.data.update(flow)
    if flow.get("report_path") and Path(flow["report_path"]).is_file():
        res.data.update(read_report(Path(flow["report_path"]), platform=platform))
    after = gpu.device_used_bytes()
    res.data.update(
        status="finished",
        wall_seconds=round(time.monotonic() - t0, 1),
        gpu_memory_idle_baseline_gib=gib(baseline),
        gpu_memory_peak_gib=gib(peak.peak),
        gpu_memory_after_gib=gib(after),
        finished=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    res.data["targets"] = targets(res.data)
    res.save()
    for row in (res.data.get("capacity") or {}).get("rows", []):
        log(
            f"capacity {row['name']}: {row['kv_cache_tokens']:,} KV tokens (planner "
            f"{row['planner_kv_tokens']}, {row['planner_error_pct']}%)"
        )
    for name, k in (res.data.get("kernels") or {}).items():
        log(
            f"kernels {name}: {k.get('kernels')} {k.get('moe_methods')} backends {k.get('moe_backends')}: "
            f"{k.get('kernel_check')}"
        )
    log(
        f"{res.data['state']} in {res.data['wall_seconds']} s; decision {res.data.get('decision')}, release "
        f"{(res.data.get('release') or {}).get('status')}; targets {res.data['targets']}; written to "
        f"{args.out}"
    )
    return 0 if all(v is not False for v in res.data["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
