"""GPU validation on one H200: the project's own stages on a Llama-3-8B-shaped model.

One driver, three sub-commands:

``build``
    An 8B Llama-3-shaped model (``benchmarks/configs/llama-3-8b.json``, vocab 128,256 kept) with
    random bf16 weights (seed 0), made on the GPU and saved. Needs only torch + transformers.
    Tokenizer: the project's reference tokenizer (``models/tiny-llama``, 1,024 ids) is saved
    into the folder. Llama-3's own tokenizer cannot be fetched offline, and its ids are all
    below 1,024, so every id it produces is a row of the 128,256-row embedding (a padded
    vocabulary, as many checkpoints have); the shapes that decide memory and capacity stay
    exactly Llama-3-8B's. Only bos/eos/pad ids in config.json are set to the tokenizer's.

``run``
    The measurements, each through the project's code, written to ``--out`` (JSON) after
    every stage so a partial run still leaves its figures:

    - ``quantize``: AWQ (W4A16_ASYM) and GPTQ (W4A16), both with calibrated fp8 KV scales, via
      ``quantize_serve.quantize.run.quantize_model`` (llm-compressor in a child process), calibrated
      on the project's corpus; GPU memory through NVML before (idle baseline), during (peak)
      and after each (target: back within 1 GiB of the baseline).
    - ``capacity``: the capacity stage's three configurations (``evidence.measure_boot``, the
      stress test on the production boot's server; ``summarize_capacity`` in GPU mode, device memory
      from NVML) at max_model_len 8192, gpu_memory_utilization 0.90.
    - ``stress``: ``run_stress_test`` on the W4A16+fp8 boot (the same server as its capacity
      row) at the planner's recommended concurrency, long prompts near 8,192 tokens.
    - ``flow``: the whole Prefect flow on the tiny AWQ recipe, GPU mode (``serve.memory_budget``
      and the Hub section dropped), in a child process; wall time and decision.

``flow-child``
    Internal: runs the flow for ``run``'s ``flow`` stage.

Device environment (see scripts/gpu/README.md): the pipeline wheel set on PYTHONPATH for this
driver; ``QS_SERVING_PYTHON`` pointing at a wrapper that runs the image's Python with the serving
wheel set on PYTHONPATH (the two sets pin different compressed-tensors).

``--rehearse`` runs the same code paths on a CPU machine with the reference model's shape (CPU
vLLM needs ``serve.memory_budget``), to catch mistakes before device time is spent.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
from benchmarks.harness import (  # noqa: E402
    GIB,
    ROOT,
    TOKENIZER,
    Results,
    build_random_model,
    driver_env,
    error_text,
    gib,
    load_scenario,
    logger,
    model_recipe,
    profile_of,
    require_gpu,
    versions,
    wait_for_build,
)

driver_env(prefect=True)  # before the product's imports, which read it

import yaml  # noqa: E402

from quantize_serve.capacity import planner  # noqa: E402
from quantize_serve.capacity.measure import (  # noqa: E402
    plan_for,
    plan_for_row,
    read_cache_info,
    summarize_capacity,
)
from quantize_serve.serving.spec import capacity_spec  # noqa: E402
from quantize_serve.core.settings import get_settings  # noqa: E402
from quantize_serve.gates.stress import plan_traffic, run_stress_test  # noqa: E402
from quantize_serve.quantize.run import quantize_model  # noqa: E402
from quantize_serve.recipe.load import parse_recipe  # noqa: E402
from quantize_serve.report.run_report import RunReport, report_of, stress_summary  # noqa: E402
from quantize_serve.serving import gpu  # noqa: E402
from quantize_serve.serving.boot import Boot  # noqa: E402
from quantize_serve.serving.server import ServerSpec, vllm_server  # noqa: E402
from benchmarks.evidence import ProfileFileSpec, evidence_lines, measure_boot, wait_until_idle  # noqa: E402
from quantize_serve.serving.vllm_log import read_log  # noqa: E402
from quantize_serve.validate.preflight import validate_recipe  # noqa: E402

SEARCH = load_scenario("h200")["search"]
log = logger("h200")


def wait_idle(baseline: int | None, *, timeout_s: float) -> tuple[int | None, float]:
    """GPU memory once it is back within 1 GiB of the baseline (or at the timeout)."""
    return wait_until_idle(baseline, within_bytes=GIB, timeout_s=timeout_s)


def device_total() -> int | None:
    info = gpu.memory_info(0)
    return info["total_bytes"] if info else None


# --------------------------------------------------------------------------------------------
# build
# --------------------------------------------------------------------------------------------


def cmd_build(args: argparse.Namespace) -> None:
    build_random_model(Path(args.model_dir), profile_of(args.rehearse)["config"], seed=args.seed, log=log)


# --------------------------------------------------------------------------------------------
# run
# --------------------------------------------------------------------------------------------


def stage_quantize(ctx: dict) -> None:
    res, profile, model_dir = ctx["results"], ctx["profile"], ctx["model_dir"]
    section = res.data.setdefault("quantize", {})
    baseline, _ = wait_idle(0, timeout_s=0)
    res.data["gpu_memory_idle_baseline_gib"] = gib(baseline)
    for method in ctx["methods"]:
        try:
            validated = validate_recipe(model_recipe(profile, method, model_dir))
            before = gpu.device_used_bytes()
            log(f"quantize {method}: GPU memory before {gib(before)} GiB")
            with gpu.PeakMemorySampler() as peak:
                result = quantize_model(
                    validated.recipe,
                    model_dir,
                    base_identity=ctx["base_identity"],
                    calibration_fingerprint=validated.calibration_fingerprint,
                    work_dir=ctx["work_dir"],
                    log=child_log(method),
                )
            after = gpu.device_used_bytes()
            settled, waited = wait_idle(before, timeout_s=15)
            section[method] = {
                "quantize_seconds": result.seconds,
                "cached": result.cached,
                "scheme": result.scheme,
                "checkpoint_dir": result.checkpoint_dir,
                "base_bytes": result.base_bytes,
                "quantized_bytes": result.quantized_bytes,
                "calibration_samples": validated.recipe.calibration.num_samples,
                "engine_versions": result.engine_versions,
                "gpu_memory_before_gib": gib(before),
                "gpu_memory_peak_gib": gib(peak.peak),
                "gpu_memory_after_quantize_gib": gib(after),
                "gpu_memory_after_settle_gib": gib(settled),
                "settle_seconds": waited,
                "back_to_baseline_within_1gib": None
                if after is None or before is None
                else after - before <= GIB,
            }
            log(f"quantize {method}: {section[method]}")
        except Exception as exc:
            res.data["errors"][f"quantize-{method}"] = error_text(exc)
            log(f"quantize {method} FAILED: {exc}")
        res.save()
    afters = [
        v["gpu_memory_after_quantize_gib"]
        for v in section.values()
        if isinstance(v, dict) and v.get("gpu_memory_after_quantize_gib") is not None
    ]
    if afters:
        res.data["gpu_memory_after_quantize_gib"] = max(afters)


def child_log(prefix: str):
    """The quantize child's output without tqdm's per-step redraws (AWQ redraws per grid point)."""

    def emit(line: str) -> None:
        if ("it/s" in line or "s/it" in line) and "100%" not in line:
            return
        print(f"  [{prefix}] {line}", flush=True)

    return emit


def stage_capacity(ctx: dict, *, with_stress: bool) -> None:
    res, profile, model_dir = ctx["results"], ctx["profile"], ctx["model_dir"]
    quant = res.data.get("quantize", {})
    method = next((m for m in ("awq", "gptq") if isinstance(quant.get(m), dict)), None)
    if method is None:
        raise RuntimeError("no quantized checkpoint: the quantize stage did not produce one")
    checkpoint = Path(quant[method]["checkpoint_dir"])
    base_config = json.loads((model_dir / "config.json").read_text())
    total = device_total()
    idle = gpu.device_used_bytes()
    if res.data.get("gpu_memory_idle_baseline_gib") is not None:
        idle = int(res.data["gpu_memory_idle_baseline_gib"] * GIB)
    probe = parse_recipe(model_recipe(profile, method, model_dir), base_dir=ROOT)
    plan_fp8 = plan_for(probe, base_config, Boot.PRODUCTION, block_size=16, device_memory_bytes=total)
    concurrency = max(1, min(plan_fp8.recommended_max_num_seqs, probe.serve.max_num_seqs))
    recipe = parse_recipe(model_recipe(profile, method, model_dir, concurrency=concurrency), base_dir=ROOT)
    logs = ctx["work_dir"] / "logs"
    cap: dict[str, Any] = {
        "checkpoint": method,
        "serve": recipe.serve.model_dump(mode="json"),
        "device_memory_bytes_nvml": total,
        "configs": {},
    }
    res.data["capacity"] = cap
    configs = []
    for name in Boot:
        spec = capacity_spec(recipe, name, name.model_dir(model_dir, checkpoint))
        used, waited = wait_idle(idle, timeout_s=60)  # the last boot's memory must be back
        log(f"capacity {name}: GPU memory {gib(used)} GiB (waited {waited} s); {spec.serve_command()}")
        log_path = logs / f"vllm-{name}.log"

        def while_up(server, measured, name=name, spec=spec) -> None:
            configs.append(measured)
            cap["configs"][name] = {
                "measured": measured.model_dump(mode="json"),
                "command": spec.serve_command(),
                "gpu_memory_used_serving_gib": gib(gpu.device_used_bytes()),
            }
            log(f"capacity {name}: {measured.kv_cache_tokens:,} KV tokens, boot {measured.boot_seconds} s")
            if with_stress and name is Boot.PRODUCTION:
                log(
                    f"stress: concurrency {concurrency} (planner's recommended_max_num_seqs "
                    f"{plan_fp8.recommended_max_num_seqs}, serve.max_num_seqs {recipe.serve.max_num_seqs})"
                )
                try:
                    stress = run_stress_test(
                        server,
                        recipe.gates.stress,
                        recipe.serve,
                        tokenizer_dir=str(checkpoint),
                        output_dir=ctx["work_dir"] / "stress",
                        log=log,
                    )
                    res.data["stress"] = stress_record(stress, stress_summary(stress), concurrency, plan_fp8)
                except Exception as exc:
                    res.data["errors"]["stress"] = error_text(exc)
                    log(f"stress FAILED to run: {exc}")

        try:
            with gpu.PeakMemorySampler() as peak:
                measure_boot(
                    recipe, name, name.model_dir(model_dir, checkpoint), log_path=log_path, while_up=while_up
                )
            cap["configs"][name]["gpu_memory_peak_gib"] = gib(peak.peak)
            cap["configs"][name]["vllm_log_lines"] = boot_lines(log_path)
        except Exception as exc:
            res.data["errors"][f"capacity-{name}"] = error_text(exc)
            cap["configs"].setdefault(name, {})["vllm_log_lines"] = boot_lines(log_path)
            log(f"capacity {name} FAILED: {exc}")
        res.save()
    if len(configs) == 3:
        report = summarize_capacity(recipe, configs, base_config, device_memory_bytes=total)
        checks = {p.name: p for p in report.planner}
        for c in report.configs:
            plan = plan_for_row(recipe, base_config, c, device_memory_bytes=total)
            cap["configs"][c.name].update(
                weights_gib=gib(c.weights_bytes),
                kv_cache_gib=gib(c.kv_cache_memory_bytes),
                kv_cache_tokens=c.kv_cache_tokens,
                num_blocks=c.num_blocks,
                block_size=c.block_size,
                max_concurrency=c.max_concurrency,
                boot_seconds=c.boot_seconds,
                predicted_kv_tokens=checks[c.name].predicted_kv_tokens,
                error_pct=checks[c.name].error_pct,
                predicted_weights_gib=gib(plan.weights_bytes),
                predicted_kv_cache_gib=gib(plan.kv_cache_memory_bytes),
                predicted_max_concurrency=round(plan.max_concurrency, 2),
            )
        cap.update(
            fp8_token_ratio=report.fp8_token_ratio,
            gain_quantized=report.gain_quantized,
            gain_fp8=report.gain_fp8,
            freed_weight_gib=gib(report.freed_weight_bytes),
            method=report.method,
            markdown=report.markdown(),
        )
        log("\n" + report.markdown())
    res.save()


def stress_record(stress: Any, summary: dict, concurrency: int, plan: Any) -> dict:
    samples = []
    metrics = Path(stress.output_dir) / "metrics.jsonl"
    if metrics.is_file():
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        t0 = rows[0]["t"] if rows else 0
        step = max(1, len(rows) // 60)
        samples = [
            {
                "t": round(r["t"] - t0, 1),
                "gpu_gib": gib(r.get("gpu_memory_bytes")),
                "kv_usage": r.get("vllm:kv_cache_usage_perc"),
                "running": r.get("vllm:num_requests_running"),
                "waiting": r.get("vllm:num_requests_waiting"),
            }
            for r in rows[::step]
        ]
    tp = stress.throughput
    return {
        **summary,
        "peak_gpu_memory_gib": gib(stress.peak_gpu_memory_bytes),
        "concurrency": concurrency,
        "planner_recommended_max_num_seqs": plan.recommended_max_num_seqs,
        "planner_max_concurrency": round(plan.max_concurrency, 2),
        "concurrency_steps": stress.concurrency_steps,
        "wrong_token_counts": stress.wrong_token_counts,
        "other_errors": stress.other_errors,
        "aborted": stress.aborted,
        "server_died": stress.server_died,
        "peak_running": stress.peak_running,
        "peak_waiting": stress.peak_waiting,
        "passed": stress.passed,
        "failures": stress.failures,
        "error_samples": stress.error_samples,
        "throughput": tp.model_dump(exclude={"command", "result_path"}) if tp else None,
        "gpu_memory_over_run": samples,
    }


VLLM_KEYS = (
    "Model loading took",
    "Available KV cache memory",
    "KV cache size",
    "Maximum concurrency",
    "Using ",
    "backend",
    "memory profiling",
    "non-torch",
    "torch peak",
    "CUDA graph",
    "Error",
    "error",
)


def boot_lines(path: Path) -> list[str]:
    """The boot log's last 25 lines that carry its figures, kernels or errors."""
    return evidence_lines(read_log(path), VLLM_KEYS, limit=25, width=300, last=True)


def stage_flow(ctx: dict) -> None:
    res, profile = ctx["results"], ctx["profile"]
    result_path = ctx["work_dir"] / "flow_result.json"
    result_path.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # an ephemeral API of its own
    env.update(PREFECT_HOME=str(ctx["work_dir"] / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    argv = [sys.executable, __file__, "flow-child", "--result", str(result_path)]
    if not profile["flow_gpu_mode"]:
        argv.append("--keep-memory-budget")
    if ctx["search"]:
        argv.append("--search")
    t0 = time.monotonic()
    with gpu.PeakMemorySampler() as peak:
        proc = subprocess.run(argv, env=env, cwd=str(ROOT))
    wall = round(time.monotonic() - t0, 1)
    flow = json.loads(result_path.read_text()) if result_path.is_file() else {}
    res.data["flow_search" if ctx["search"] else "flow"] = {
        "recipe": "recipes/tiny-llama-awq.yaml",
        "gpu_mode": profile["flow_gpu_mode"],
        "serve_search": SEARCH if ctx["search"] else None,
        "wall_seconds": wall,
        "exit_code": proc.returncode,
        "gpu_memory_peak_gib": gib(peak.peak),
        **flow,
    }
    res.save()


def cmd_flow_child(args: argparse.Namespace) -> None:
    from flows.pipeline import quantize_serve  # Prefect (~2 s): only in the flow's own child process

    path = ROOT / "recipes/tiny-llama-awq.yaml"
    data = yaml.safe_load(path.read_text())
    data.pop("hub", None)  # no Hub on the device: measure the gates and the decision
    if not args.keep_memory_budget:
        data["serve"].pop("memory_budget", None)  # GPU mode: vLLM's own accounting
    if args.search:  # serve.search inside the whole flow: real boots pick max_num_seqs
        data["serve"]["search"] = SEARCH
    recipe = parse_recipe(data, source=str(path), base_dir=path.parent)
    t0 = time.monotonic()
    state = quantize_serve(recipe, return_state=True)
    report = report_of(state.result(raise_on_failure=False))
    out: dict[str, Any] = {
        "state": state.type.value,
        "flow_seconds": round(time.monotonic() - t0, 1),
        "serve": recipe.serve.model_dump(mode="json"),
    }
    if isinstance(report, RunReport):
        out.update(
            decision="passed" if report.decision.passed else "rejected",
            reasons=[
                f"{c.check}: {'pass' if c.passed else 'FAIL'}: {c.reason}" for c in report.decision.checks
            ],
            release=report.release.status if report.release else None,
            report_dir=report.report_dir,
            capacity={
                c.name: {
                    "kv_cache_tokens": c.kv_cache_tokens,
                    "weights_gib": gib(c.weights_bytes),
                    "kv_cache_gib": gib(c.kv_cache_memory_bytes),
                }
                for c in report.capacity.configs
            }
            if report.capacity
            else None,
            fp8_token_ratio=report.capacity.fp8_token_ratio if report.capacity else None,
            planner={p.name: p.error_pct for p in report.capacity.planner} if report.capacity else None,
            accuracy={
                f"{Path(c.task).stem}/{c.metric}": round(c.recovery, 4) if c.recovery is not None else None
                for c in report.accuracy
            },
            stress=stress_summary(report.stress),
            serve_search=None
            if report.profile is None
            else {
                "found_max_num_seqs": report.profile.found.max_num_seqs if report.profile.found else None,
                "boots": report.profile.boots,
                "stop_reason": report.profile.stop_reason,
                "points": [
                    {
                        "max_num_seqs": pt.max_num_seqs,
                        "passed": pt.passed,
                        "why": pt.why,
                        "boot_seconds": pt.boot_seconds,
                        "seconds": pt.seconds,
                    }
                    for pt in report.profile.points
                ],
                "serve_command": report.profile.serve_command,
            },
        )
        if report.serving_profile:
            try:
                out["pinned_profile"] = boot_pinned_profile(report, recipe)
            except Exception as exc:  # keep the flow's result
                out["pinned_profile"] = {"error": error_text(exc)}
    else:
        out.update(decision="error", error=str(report)[-3000:])
    Path(args.result).write_text(json.dumps(out, indent=2, default=str))
    print(json.dumps({k: out.get(k) for k in ("state", "decision", "flow_seconds")}), flush=True)


def boot_pinned_profile(report: Any, recipe: Any) -> dict[str, Any]:
    """Boot the run's serve-profile.yaml as production would (``vllm serve --config``, the model
    pointed at the local checkpoint) and compare its KV cache with the one the gates validated."""
    profile = report.serving_profile
    mapping = {k: v for k, v in yaml.safe_load(Path(profile.path).read_text()).items() if k != "revision"}
    mapping |= {"model": report.checkpoint.checkpoint_dir}  # a folder: no revision of the repo
    local = Path(report.report_dir) / "serve-profile.local.yaml"
    local.write_text(yaml.safe_dump(mapping, sort_keys=False))
    spec = ProfileFileSpec(
        **ServerSpec(model_dir=report.checkpoint.checkpoint_dir, serve=recipe.serve).model_dump(),
        config_path=str(local),
    )
    with vllm_server(spec, log_path=Path(report.report_dir) / "vllm-pinned-profile.log") as server:
        info = read_cache_info(server.get("/metrics"))
    validated = report.capacity.by_name(Boot.PRODUCTION)
    booted = int(info["num_gpu_blocks"]) * int(info["block_size"])
    return {
        "kv_cache_memory_bytes": profile.kv_cache_memory_bytes,
        "needs_free_gib": gib(profile.needs_free_bytes),
        "validated_kv_tokens": validated.kv_cache_tokens,
        "booted_kv_tokens": booted,
        "same": booted == validated.kv_cache_tokens,
        "command": profile.command,
        "elsewhere": [e.model_dump() for e in profile.elsewhere],
    }


def cmd_run(args: argparse.Namespace) -> None:
    if not args.dry_run:  # a dry run boots nothing
        require_gpu("h200.py run", "--rehearse runs it on this CPU", rehearsing=args.rehearse)
    profile = profile_of(args.rehearse)
    model_dir = Path(args.model_dir).resolve()
    work_dir = Path(args.work_dir).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = set(stages) - {"quantize", "capacity", "stress", "flow"}
    if unknown:
        raise SystemExit(f"unknown stage(s) {sorted(unknown)}; choose from quantize, capacity, stress, flow")
    res = Results(Path(args.out), roots=(work_dir.parent, get_settings().serving_python.parent))
    res.data.update(
        started=time.strftime("%Y-%m-%dT%H:%M:%S"),
        profile=profile["name"],
        stages_requested=stages,
        device=gpu.memory_info(0),
        serving_python=str(get_settings().serving_python),
    )
    res.data["versions"] = versions()
    log(f"versions: {res.data['versions']}")
    res.save()
    if args.dry_run:
        dry_run(profile, model_dir, res)
        return
    build = wait_for_build(
        model_dir, Path(args.build_pid_file) if args.build_pid_file else None, args.build_timeout_s
    )
    res.data["build"] = build
    res.save()
    ctx = {
        "results": res,
        "profile": profile,
        "model_dir": model_dir,
        "work_dir": work_dir,
        "methods": [m for m in args.methods.split(",") if m],
        "search": args.search,
        "base_identity": f"local:{profile['name']}-seed{args.seed}",
    }
    t_all = time.monotonic()
    timings = res.data.setdefault("stage_seconds", {})
    for stage in stages:
        if stage == "stress" and "capacity" in stages:
            continue  # runs inside the capacity stage, on its fp8 boot
        t0 = time.monotonic()
        log(f"stage {stage}: start")
        try:
            if stage == "quantize":
                stage_quantize(ctx)
            elif stage in ("capacity", "stress"):
                stage_capacity(ctx, with_stress="stress" in stages)
            elif stage == "flow":
                stage_flow(ctx)
        except Exception as exc:
            res.data["errors"][stage] = error_text(exc)
            log(f"stage {stage} FAILED: {exc}")
        timings[stage] = round(time.monotonic() - t0, 1)
        res.save()
    res.data["targets"] = targets(res.data)
    res.data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    res.data["total_seconds"] = round(time.monotonic() - t_all, 1)
    res.save()
    log(f"done in {res.data['total_seconds']} s; targets: {res.data['targets']}")


def targets(d: dict) -> dict:
    out: dict[str, Any] = {}
    cap = d.get("capacity") or {}
    if cap.get("fp8_token_ratio") is not None:
        out["fp8_token_ratio_2_within_1pct"] = abs(cap["fp8_token_ratio"] - 2.0) <= 0.02
        errs = [c.get("error_pct") for c in cap.get("configs", {}).values() if c.get("error_pct") is not None]
        out["planner_error_within_3pct"] = bool(errs) and all(abs(e) <= 3 for e in errs)
    st = d.get("stress")
    if st:
        out["stress_no_5xx_no_oom"] = (
            st.get("errors_5xx") == 0 and not st.get("server_died") and not st.get("server_restarts")
        )
        out["stress_passed"] = st.get("passed")
    base = d.get("gpu_memory_idle_baseline_gib")
    afters = [
        q.get("gpu_memory_after_quantize_gib")
        for q in (d.get("quantize") or {}).values()
        if isinstance(q, dict) and q.get("gpu_memory_after_quantize_gib") is not None
    ]
    if base is not None and afters:
        out["gpu_memory_after_quantize_within_1gib"] = all(a - base <= 1.0 for a in afters)
    return out


def dry_run(profile: dict, model_dir: Path, res: Results) -> None:
    """Everything that needs no model and no GPU: recipes, planner, stress plan, the flow's imports."""
    import flows.pipeline  # noqa: F401 - Prefect (~2 s): the flow stage's imports, checked before device time

    shape = planner.ModelShape.from_config(profile["config"])
    total = device_total() or int(143771 * 1024**2)
    out = {}
    for method in ("awq", "gptq"):
        recipe = parse_recipe(model_recipe(profile, method, model_dir), base_dir=ROOT)
        out[method] = {
            name: plan_for(
                recipe, profile["config"], name, block_size=16, device_memory_bytes=total
            ).model_dump(
                include={
                    "kv_cache_tokens",
                    "weights_bytes",
                    "kv_cache_memory_bytes",
                    "recommended_max_num_seqs",
                }
            )
            for name in Boot
        }
    rec = out["awq"][Boot.PRODUCTION]["recommended_max_num_seqs"]
    recipe = parse_recipe(model_recipe(profile, "awq", model_dir, concurrency=min(rec, 256)), base_dir=ROOT)
    schedule = plan_traffic(recipe.gates.stress, recipe.serve, str(TOKENIZER), seed=0)
    res.data["dry_run"] = {
        "parameters": shape.num_parameters(),
        "device_memory_bytes": total,
        "plans": out,
        "stress_schedule": [(c, len(p), sum(len(x.prompt) for x in p)) for c, p in schedule],
    }
    res.save()
    log(f"dry run: {json.dumps(res.data['dry_run'], indent=1)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="make and save the random-weight model")
    b.add_argument("--model-dir", required=True)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--rehearse", action="store_true", help="the reference model's shape, on any device")
    r = sub.add_parser("run", help="quantize, capacity, stress and flow stages; JSON to --out")
    r.add_argument("--model-dir", required=True)
    r.add_argument("--work-dir", required=True, help="checkpoints, vLLM logs, stress output")
    r.add_argument("--out", default=str(ROOT / "benchmarks/results/capacity/h200.json"))
    r.add_argument("--stages", default="quantize,capacity,stress,flow")
    r.add_argument("--methods", default="awq,gptq")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--build-pid-file", default=None, help="pid file of a build started earlier")
    r.add_argument("--build-timeout-s", type=float, default=900)
    r.add_argument("--rehearse", action="store_true", help="CPU rehearsal with the reference model's shape")
    r.add_argument("--dry-run", action="store_true", help="recipes, planner, stress plan and imports only")
    r.add_argument(
        "--search", action="store_true", help="flow stage with serve.search on (result key flow_search)"
    )
    f = sub.add_parser("flow-child", help=argparse.SUPPRESS)
    f.add_argument("--result", required=True)
    f.add_argument("--keep-memory-budget", action="store_true")
    f.add_argument("--search", action="store_true")
    args = parser.parse_args(argv)
    {"build": cmd_build, "run": cmd_run, "flow-child": cmd_flow_child}[args.command](args)


if __name__ == "__main__":
    main()
