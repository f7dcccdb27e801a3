"""Measured capacity of the Llama-3-8B and -70B shapes with dummy weights, at TP 1 and TP 2, through
the project's own code (``quantize_serve.capacity.shape.measure_shape``, what `quantize-serve plan
RECIPE --measure` and ``serve.preflight: measure`` run), beside the planner and issue 14's table.

Run on a host with two GPUs (scripts/gpu/README.md, kind nvidia-h200-x2):
    python benchmarks/shape_capacity.py --out h200x2_shape.json
Settings (benchmarks/scenarios/shape.yaml) are issue 14's: max_model_len 8192, gpu_memory_utilization 0.90,
enforce_eager, max_num_batched_tokens 8192, max_num_seqs 256, W4A16 symmetric group 128 (lm_head 16-bit), fp8
KV. Weights are random: the figures are capacity, not accuracy.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
from benchmarks.harness import (  # noqa: E402
    ROOT,
    SHAPES,
    TOKENIZER,
    load_scenario,
    logger,
    require_gpu,
    shape_folder,
)
from quantize_serve.capacity.shape import measure_shape, write_files  # noqa: E402
from benchmarks.evidence import write_json_result  # noqa: E402
from quantize_serve.recipe.load import load_recipe  # noqa: E402
from quantize_serve.serving import gpu  # noqa: E402

SCENARIO = load_scenario("shape")
RECIPE, REHEARSE_RECIPE = ROOT / SCENARIO["recipe"], ROOT / SCENARIO["rehearse_recipe"]
SERVE = SCENARIO["serve"]
# Issue 14's table: (model, TP, boot) -> KV tokens; None: vLLM refused the boot
REFERENCE = {(model, tp, boot): tokens for model, tp, boot, tokens in SCENARIO["reference"]}
TOLERANCE_PCT = SCENARIO["tolerance_pct"]
log = logger("shape")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/capacity/h200x2_shape.json")
    p.add_argument("--work", type=Path, default=Path("/tmp/qs-shape"))
    p.add_argument("--models", default="Llama-3-8B,Llama-3-70B")
    p.add_argument("--tp", default="1,2")
    p.add_argument("--rehearse", action="store_true", help="CPU: the reference model's shape, TP 1")
    args = p.parse_args(argv)
    os.environ.setdefault(
        "VLLM_ALLREDUCE_USE_SYMM_MEM", "0"
    )  # two H200s: keep all-reduce off NVLink multicast
    require_gpu("shape_capacity.py", "--rehearse runs it on this CPU", rehearsing=args.rehearse)
    device, settings, recipe_path = gpu.usable_memory_bytes(), dict(SERVE), RECIPE
    if args.rehearse:
        args.models, args.tp, settings, recipe_path = "tiny-llama", "1", {}, REHEARSE_RECIPE
    result: dict = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "settings": settings,
        "device_memory_bytes": device,
        "tolerance_pct": TOLERANCE_PCT,
        "weights": "random (vLLM --load-format dummy): capacity only, no accuracy",
        "runs": [],
    }
    for name in args.models.split(","):
        for tp in map(int, args.tp.split(",")):
            out = args.work / f"{name}-tp{tp}"
            recipe = load_recipe(
                recipe_path,
                {
                    **settings,
                    "serve.tensor_parallel_size": tp,
                    "model.id": str(
                        shape_folder(SHAPES[name], args.work / "shapes" / name, tokenizer_dir=TOKENIZER)
                    ),
                },
            )
            t0 = time.monotonic()
            shape = measure_shape(
                recipe, recipe.model.id, out_dir=out, model=name, device_memory_bytes=device, log=log
            )
            write_files(shape, out)
            rows = []
            for r in shape.rows:
                ref = REFERENCE.get((name, tp, str(r.name)), "absent")
                measured = r.measured.kv_cache_tokens if r.measured else None
                rows.append(
                    {
                        "boot": r.name,
                        "kv_cache_dtype": r.kv_cache_dtype,
                        "weights_gib_per_gpu": round(
                            (r.measured.weights_bytes if r.measured else r.planned.weights_bytes) / 1024**3, 2
                        ),
                        "kv_tokens": measured,
                        "max_concurrency": r.measured.max_concurrency if r.measured else None,
                        "boot_seconds": r.measured.boot_seconds if r.measured else None,
                        "refused": r.refused,
                        "planner_kv_tokens": r.planned.kv_cache_tokens,
                        "planner_fits": r.planned.fits,
                        "planner_error_pct": r.error_pct,
                        "reference_kv_tokens": None if ref == "absent" else ref,
                        "vs_reference_pct": (
                            round(100 * (measured - ref) / ref, 3)
                            if isinstance(ref, int) and measured
                            else None
                        ),
                        "agrees_with_reference": None
                        if ref == "absent"
                        else (
                            (ref is None and r.refused is not None)
                            or (
                                isinstance(ref, int)
                                and measured is not None
                                and abs(measured - ref) / ref * 100 <= TOLERANCE_PCT
                            )
                        ),
                    }
                )
            result["runs"].append(
                {
                    "model": name,
                    "tensor_parallel_size": tp,
                    "rows": rows,
                    "seconds": round(time.monotonic() - t0, 1),
                    "table": shape.markdown(),
                }
            )
            write_json_result(args.out, result, roots=(args.work,))
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    checked = [r for run in result["runs"] for r in run["rows"] if r["agrees_with_reference"] is not None]
    planner = [
        abs(r["planner_error_pct"])
        for run in result["runs"]
        for r in run["rows"]
        if r["planner_error_pct"] is not None
    ]
    result["summary"] = {
        "reference_rows": len(checked),
        "reference_rows_within_tolerance": sum(bool(r["agrees_with_reference"]) for r in checked),
        "planner_max_abs_error_pct": max(planner) if planner else None,
    }
    write_json_result(args.out, result, roots=(args.work,))
    print(result["summary"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
