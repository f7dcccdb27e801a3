"""Every release format of issue 16 on one H200: the Llama-3-8B shape with dummy (random) weights,
served in the production configuration (CUDA graphs on, max_model_len 8192, gpu_memory_utilization
0.90, fp8 KV cache) and measured through the project's own code (quantize_serve/formats/choose.py): KV
capacity from vLLM's /metrics (``capacity.measure_capacity``), `vllm bench serve` at the target
concurrency (``formats.run_format_bench``: fresh random prompts per run, prefix caching off), the
linear kernel vLLM chose and the kernel check (``formats.kernel_problem``), and the release chosen
by ``formats.choose`` under the "most KV capacity" rule (the "most throughput" winner is reported too).

Candidates: W4A16 (compressed-tensors pack-quantized, group 128, symmetric), FP8_DYNAMIC and INT8
W8A8, each with the fp8 KV cache; the bf16 base with a 16-bit KV cache is the reference row. With
``--kv16`` the W4A16 checkpoint is also booted with a 16-bit KV cache (capacity only) for its
``kv_cache_tokens_16bit_kv``. Weights are random: accuracy means nothing here, recovery is null.

    python benchmarks/h200_schemes.py --out h200_schemes.json  # on the GPU host (host.sh launch-schemes)
    .venv/bin/python benchmarks/h200_schemes.py --rehearse --out /tmp/s.json --work /tmp/qs-schemes
        # CPU rehearsal: the reference model's shape, recipes/tiny-llama-awq.yaml's serve settings,
        # W8A8 and FP8_DYNAMIC only, a tiny bench
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Collection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
from benchmarks.evidence import write_json_result  # noqa: E402
from benchmarks.harness import ROOT, TOKENIZER, load_scenario, logger, require_gpu, shape_folder  # noqa: E402
from quantize_serve.capacity import planner  # noqa: E402
from quantize_serve.capacity.measure import measure_capacity  # noqa: E402
from quantize_serve.capacity.shape import checkpoint_quantization_config  # noqa: E402
from quantize_serve.quantize.run import CHECKPOINT_FORMAT  # noqa: E402
from quantize_serve.formats import choose as formats  # noqa: E402
from quantize_serve.recipe.load import load_recipe  # noqa: E402
from quantize_serve.recipe.quantization import FormatRule  # noqa: E402
from quantize_serve.serving import gpu  # noqa: E402
from quantize_serve.serving.boot import Boot  # noqa: E402
from quantize_serve.serving.server import ServerSpec, vllm_server  # noqa: E402
from quantize_serve.serving.vllm_log import read_log  # noqa: E402

SCENARIO = load_scenario("schemes")
RECIPE, SHAPE, SERVE = ROOT / SCENARIO["recipe"], ROOT / SCENARIO["shape"], SCENARIO["serve"]
CANDIDATES = [tuple(c) for c in SCENARIO["candidates"]]  # (name, scheme, method), each with the fp8 KV cache
BENCH = SCENARIO["bench"]
REHEARSE_RECIPE, REHEARSE_SERVE = ROOT / SCENARIO["rehearse_recipe"], SCENARIO["rehearse_serve"]
REHEARSE_CANDIDATES = [c for c in CANDIDATES if c[1] in SCENARIO["rehearse_schemes"]]
REHEARSE_BENCH = SCENARIO["rehearse_bench"]
WEIGHTS_NOTE = (
    "random (vLLM --load-format dummy): capacity, throughput, latency and kernels only; accuracy "
    "means nothing with random weights, so recovery is null and no accuracy gate was run"
)
log = logger("schemes")


def preset_quantization_config(
    preset: str, *, ignore: Collection[str] = ("lm_head",), format: str | None = None
) -> dict:
    """compressed-tensors' preset scheme ``preset`` (W4A16, W8A8, FP8_DYNAMIC, ...) on every Linear as the
    ``quantization_config`` llm-compressor writes for it, in ``format`` (default: the format the project's
    checkpoints of that scheme have, quantize.run.CHECKPOINT_FORMAT)."""
    from compressed_tensors.quantization import (
        preset_name_to_scheme,
    )  # imports torch: only when a folder is made

    fmt = format or CHECKPOINT_FORMAT[preset]
    group = {**preset_name_to_scheme(preset, ["Linear"]).model_dump(), "format": fmt}
    return checkpoint_quantization_config({"group_0": group}, ignore=list(ignore), format=fmt)


def scheme_folder(config: Path, scheme: str | None, work: Path) -> Path:
    """A weightless folder of the shape ``config`` with the scheme's quantization_config as llm-compressor
    writes it (none: the bf16 base)."""
    quantization = preset_quantization_config(scheme) if scheme else None
    return shape_folder(
        config, work / (scheme or "bf16"), tokenizer_dir=TOKENIZER, quantization_config=quantization
    )


def boot_spec(recipe, folder: Path, scheme: str | None, kv: str, *, warm_up: bool):
    """The dummy-weights boot; under a fixed budget (CPU) the KV bytes are the budget less the planner's
    weight bytes for the scheme (no checkpoint to read them from)."""
    serve, kv_bytes, planned = recipe.serve, None, None
    if serve.memory_budget is not None:
        planned = planner.plan_capacity(
            planner.ModelShape.from_config(json.loads((folder / "config.json").read_text())),
            scheme=scheme or "bf16",
            kv_cache_dtype=kv,
            device_memory_bytes=int(serve.memory_budget),
            gpu_memory_utilization=1.0,
            max_model_len=serve.max_model_len,
            max_num_batched_tokens=serve.batched_tokens,
            block_size=planner.BLOCK_SIZE_CPU,
            mode="fixed_budget",
            group_size=128,
            ignore=("lm_head",),
        ).weights_bytes
        kv_bytes = max(int(serve.memory_budget) - planned, 1)
    spec = ServerSpec(
        model_dir=str(folder),
        serve=serve,
        kv_cache_dtype=kv,
        kv_cache_memory_bytes=kv_bytes,
        load_format="dummy",
        warm_up=warm_up,
    )
    return spec, planned


def measure(
    recipe,
    args,
    *,
    name: str,
    scheme: str | None,
    method: str,
    kv: str,
    settings,
    platform: str,
    reference: bool,
    bench: bool = True,
):
    """One boot: (its FormatRow, the boot facts). Failures are recorded in the row, never raised."""
    folder = scheme_folder(args.config, scheme, args.work / "folders")
    spec, planned_weights = boot_spec(recipe, folder, scheme, kv, warm_up=not args.rehearse)
    out = args.work / name
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / f"vllm-{name}.log"
    row = formats.FormatRow(
        name=name, method=method, scheme=scheme or "bf16", kv_cache_dtype=kv, reference=reference
    )
    facts: dict = {"name": name, "command": spec.serve_command(), "log": f"{name}/{log_path.name}"}
    t0 = time.monotonic()
    log(f"{name}: {spec.serve_command()}")
    try:
        with vllm_server(spec, log_path=log_path) as server:
            facts["boot_seconds"] = server.boot_seconds
            config = measure_capacity(server, spec, name=Boot.BASE if reference else Boot.PRODUCTION)
            if planned_weights is not None:  # fixed budget: no checkpoint to read the weight bytes from
                config = config.model_copy(update={"weights_bytes": planned_weights})
            row.kv_cache_dtype, row.weights_bytes = config.kv_cache_dtype, config.weights_bytes
            row.kv_cache_tokens, row.max_concurrency = config.kv_cache_tokens, config.max_concurrency
            log_text = read_log(server.log_path)
            row.kernels = formats.boot_kernels(log_text)
            if not reference:
                row.kernels, problem = formats.kernel_problem(scheme, platform, log_text)
                if problem:
                    row.failures.append("kernel check: " + problem)
            log(
                f"{name}: booted in {server.boot_seconds} s; {config.kv_cache_tokens:,} KV tokens, "
                f"{config.weights_bytes / 1024**3:.2f} GiB weights, kernels {row.kernels}"
            )
            if bench:
                try:
                    row.runs = formats.run_format_bench(
                        server,
                        tokenizer_dir=str(folder),
                        settings=settings,
                        output_dir=out,
                        timeout_s=args.bench_timeout,
                    )
                except RuntimeError as exc:
                    row.failures.append(f"throughput: {str(exc).splitlines()[0]}")
                bad = [r for r in row.runs if r.failed]
                if bad:
                    row.failures.append(f"throughput: {sum(r.failed for r in bad)} requests failed")
                log(
                    f"{name}: output tok/s {[r.output_throughput for r in row.runs]}, p99 TTFT "
                    f"{[r.p99_ttft_ms for r in row.runs]} ms, mean TPOT {[r.mean_tpot_ms for r in row.runs]} "
                    "ms"
                )
    except Exception as exc:  # noqa: BLE001 - a refused boot is a result
        row.failures.append(f"boot: {str(exc).splitlines()[0]}")
        log(f"{name}: FAILED: {row.failures[-1]}")
    facts["seconds"] = round(time.monotonic() - t0, 1)
    return row, facts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/release-formats/h200_schemes.json")
    p.add_argument("--work", type=Path, default=Path("/tmp/qs-schemes"))
    p.add_argument("--concurrency", type=int, default=None, help="default 64 (4 on --rehearse)")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--only", default="", help="comma-separated candidate names (default: all)")
    p.add_argument(
        "--kv16", action="store_true", help="also boot W4A16 with a 16-bit KV cache (capacity only)"
    )
    p.add_argument("--no-reference", action="store_true", help="skip the bf16 reference boot")
    p.add_argument("--bench-timeout", type=float, default=600.0)
    p.add_argument("--rehearse", action="store_true", help="CPU: the reference model's shape, a tiny bench")
    args = p.parse_args(argv)
    # the rehearsal serves W8A8 and FP8_DYNAMIC with a 16-bit KV cache (scenario rehearse_schemes)
    require_gpu(
        "h200_schemes.py", "--rehearse runs it on this CPU", rehearsing=args.rehearse, serves=("W8A8", "auto")
    )
    if args.rehearse:
        recipe = load_recipe(REHEARSE_RECIPE, REHEARSE_SERVE)
        args.config, candidates, bench = TOKENIZER / "config.json", REHEARSE_CANDIDATES, dict(REHEARSE_BENCH)
        # vLLM CPU fails every request of a dummy-weights fp8-KV boot (random k_scale, "k_scale must be
        # positive"), so the rehearsal serves a 16-bit KV cache: the same code paths, real requests.
        kv = "auto"
    else:
        recipe = load_recipe(RECIPE, SERVE)
        args.config, candidates, bench, kv = SHAPE, CANDIDATES, dict(BENCH), "fp8"
    if args.concurrency:
        bench["concurrency"] = args.concurrency
    if args.repeats:
        bench["repeats"] = args.repeats
    if args.only:
        candidates = [c for c in candidates if c[0] in args.only.split(",")]
    settings = formats.BenchSettings(num_prompts=4 * bench["concurrency"], **bench)
    rule = FormatRule(rule="kv_capacity", **settings.model_dump())  # the rule's settings are the bench's
    cc = gpu.compute_capability()
    platform = formats.platform_of(cc)
    device = gpu.describe_devices() or f"CPU ({platform})"
    result: dict = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "device": device,
        "compute_capability": list(cc) if cc else None,
        "platform": platform,
        "device_memory_bytes": gpu.usable_memory_bytes(),
        "shape": "Llama-3-8B" if not args.rehearse else "tiny-llama",
        "rehearsal": args.rehearse,
        "weights": WEIGHTS_NOTE,
        "settings": {
            "serve": recipe.serve.model_dump(mode="json"),
            "candidate_kv_cache_dtype": kv,
            "reference_kv_cache_dtype": "auto",
            "load_format": "dummy",
            "prefix_caching": "off (--no-enable-prefix-caching); each run's random prompts are new",
        },
        "bench": settings.model_dump(),
        "boots": [],
        "rows": [],
    }
    rows: list = []

    def save(choice=None) -> None:
        result["rows"] = [r.summary() for r in rows]
        if choice is not None:
            result.update(choice)
        write_json_result(args.out, result, roots=(args.work,))

    boot = functools.partial(measure, recipe, args, settings=settings, platform=platform)

    def keep(row, facts: dict) -> None:
        rows.append(row)
        result["boots"].append(facts)
        save()

    for name, scheme, method in candidates:
        keep(*boot(name=name, scheme=scheme, method=method, kv=kv, reference=False))
    if not args.no_reference:
        keep(*boot(name="bf16", scheme=None, method="base", kv="auto", reference=True))
    if args.kv16:
        w4 = next((r for r in rows if r.scheme == "W4A16"), None)
        if w4 is not None:
            kv16 = {"scheme": "W4A16", "method": "rtn (dummy weights)", "kv": "auto", "reference": False}
            row, facts = boot(name="w4a16-16bit-kv", **kv16, bench=False)  # capacity only
            w4.kv_cache_tokens_16bit = row.kv_cache_tokens
            result["boots"].append(
                {**facts, "kv_cache_tokens": row.kv_cache_tokens, "failures": row.failures}
            )
            save()
    # The release under the rule (most KV capacity), and who would win on throughput alone.
    by_kv = formats.choose([r.model_copy(deep=True) for r in rows], rule, settings, device)
    passing = [r for r in by_kv.rows if r.passed and r.output_throughput is not None]
    by_tp = max(passing, key=lambda r: r.output_throughput) if passing else None
    save(
        {
            "rule": rule.model_dump(),
            "rule_text": formats.describe_rule(rule),
            "winner": by_kv.winner,
            "reason": by_kv.reason,
            "pareto": by_kv.pareto,
            "winner_by_throughput": by_tp.name if by_tp else None,
            "winner_by_throughput_reason": (
                f"under 'most output tok/s at concurrency {settings.concurrency}' (no latency limit) the "
                f"release would be {by_tp.name} with {by_tp.output_throughput:,.1f} tok/s"
                if by_tp
                else None
            ),
            "table": by_kv.markdown(),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
    )
    result["rows"] = [r.summary() for r in by_kv.rows]
    write_json_result(args.out, result, roots=(args.work,))
    print(by_kv.markdown(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
