"""Measured capacity of the Llama-3-8B and -70B shapes with dummy weights, at TP 1 and TP 2, through
the project's own code (``quantize_serve.capacity.shape.measure_shape``, what `quantize-serve plan
RECIPE --measure` and ``serve.preflight: measure`` run), beside the planner and issue 14's table.

Run on a host with two GPUs (scripts/gpu/README.md, kind nvidia-h200-x2):
    python benchmarks/shape_capacity.py --out h200x2_shape.json
Settings are issue 14's: max_model_len 8192, gpu_memory_utilization 0.90, enforce_eager,
max_num_batched_tokens 8192, max_num_seqs 256, W4A16 symmetric group 128 (lm_head 16-bit), fp8 KV.
Weights are random: the figures are capacity, not accuracy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RECIPE = ROOT / "recipes" / "llama3-8b-instruct-awq.yaml"
TOKENIZER = ROOT / "models" / "tiny-llama"  # the reference tokenizer: a dummy boot needs one, any will do
# The config.json of each shape measured here and in benchmarks/h200_shapes.py (the Qwen ones are the
# models' published config.json, which the planner's tests use too), and the reference models' own.
SHAPES = {"Llama-3-8B": ROOT / "benchmarks/configs/llama-3-8b.json",
          "Llama-3-70B": ROOT / "benchmarks/configs/llama-3-70b.json",
          "Qwen2-72B": ROOT / "tests/fixtures/configs/qwen2-72b.json",
          "Qwen3-30B-A3B": ROOT / "tests/fixtures/configs/qwen3-30b-a3b.json",
          "Mixtral-8x7B": ROOT / "tests/fixtures/configs/mixtral-8x7b.json",
          "tiny-llama": ROOT / "models/tiny-llama/config.json",
          "tiny-qwen3-moe": ROOT / "models/tiny-qwen3-moe/config.json"}
SERVE = {"serve.max_model_len": 8192, "serve.gpu_memory_utilization": 0.90, "serve.enforce_eager": True,
         "serve.max_num_batched_tokens": 8192, "serve.max_num_seqs": 256, "serve.kv_cache_dtype": "fp8",
         "quantization.scheme": "W4A16", "quantization.kv_cache_scales": False}
# Issue 14's table (vLLM 0.26.0 on nvidia-h200-x2, LLM(load_format="dummy")): (model, TP, boot) -> KV tokens;
# None: vLLM refused the boot ("No available memory for the cache blocks").
REFERENCE = {("Llama-3-70B", 1, "base"): None, ("Llama-3-70B", 2, "base"): 386_544,
             ("Llama-3-70B", 1, "w4a16"): 285_440, ("Llama-3-70B", 1, "w4a16-fp8kv"): 570_672,
             ("Llama-3-70B", 2, "w4a16-fp8kv"): 1_392_896}
TOLERANCE_PCT = 0.3
# --rehearse: the same code on a CPU host with the reference model's shape and recipe (CPU settings)
REHEARSE_RECIPE = ROOT / "recipes" / "tiny-llama-awq.yaml"


def shape_folder(name: str, work: Path) -> Path:
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SHAPES[name], folder / "config.json")
    for f in TOKENIZER.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copyfile(f, folder / f.name)
    return folder


def main(argv: list[str] | None = None) -> int:
    from quantize_serve.capacity.shape import measure_shape, write_files
    from quantize_serve.core.portable import write_json_result
    from quantize_serve.recipe.load import load_recipe
    from quantize_serve.serving import gpu

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/h200x2_shape.json")
    p.add_argument("--work", type=Path, default=Path("/tmp/qs-shape"))
    p.add_argument("--models", default="Llama-3-8B,Llama-3-70B")
    p.add_argument("--tp", default="1,2")
    p.add_argument("--rehearse", action="store_true", help="CPU: the reference model's shape, TP 1")
    args = p.parse_args(argv)
    os.environ.setdefault("VLLM_ALLREDUCE_USE_SYMM_MEM", "0")  # two H200s: keep all-reduce off NVLink multicast
    device, settings, recipe_path = gpu.usable_memory_bytes(), dict(SERVE), RECIPE
    if args.rehearse:
        args.models, args.tp, settings, recipe_path = "tiny-llama", "1", {}, REHEARSE_RECIPE
    elif device is None:
        raise SystemExit("no GPU: this benchmark measures GPU capacity (--rehearse runs it on CPU)")
    result: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "settings": settings,
                    "device_memory_bytes": device, "tolerance_pct": TOLERANCE_PCT,
                    "weights": "random (vLLM --load-format dummy): capacity only, no accuracy", "runs": []}
    for name in args.models.split(","):
        for tp in map(int, args.tp.split(",")):
            out = args.work / f"{name}-tp{tp}"
            recipe = load_recipe(recipe_path, {**settings, "serve.tensor_parallel_size": tp,
                                          "model.id": str(shape_folder(name, args.work / "shapes"))})
            t0 = time.monotonic()
            shape = measure_shape(recipe, recipe.model.id, out_dir=out, model=name, device_memory_bytes=device,
                                  log=lambda m: print(f"[shape {time.strftime('%H:%M:%S')}] {m}", flush=True))
            write_files(shape, out)
            rows = []
            for r in shape.rows:
                ref = REFERENCE.get((name, tp, str(r.name)), "absent")
                measured = r.measured.kv_cache_tokens if r.measured else None
                rows.append({
                    "boot": r.name, "kv_cache_dtype": r.kv_cache_dtype,
                    "weights_gib_per_gpu": round((r.measured.weights_bytes if r.measured else r.planned.weights_bytes)
                                                 / 1024**3, 2),
                    "kv_tokens": measured, "max_concurrency": r.measured.max_concurrency if r.measured else None,
                    "boot_seconds": r.measured.boot_seconds if r.measured else None, "refused": r.refused,
                    "planner_kv_tokens": r.planned.kv_cache_tokens, "planner_fits": r.planned.fits,
                    "planner_error_pct": r.error_pct,
                    "reference_kv_tokens": None if ref == "absent" else ref,
                    "vs_reference_pct": (round(100 * (measured - ref) / ref, 3)
                                         if isinstance(ref, int) and measured else None),
                    "agrees_with_reference": None if ref == "absent" else (
                        (ref is None and r.refused is not None) or
                        (isinstance(ref, int) and measured is not None
                         and abs(measured - ref) / ref * 100 <= TOLERANCE_PCT)),
                })
            result["runs"].append({"model": name, "tensor_parallel_size": tp, "rows": rows,
                                   "seconds": round(time.monotonic() - t0, 1), "table": shape.markdown()})
            write_json_result(args.out, result, roots=(args.work,))
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    checked = [r for run in result["runs"] for r in run["rows"] if r["agrees_with_reference"] is not None]
    planner = [abs(r["planner_error_pct"]) for run in result["runs"] for r in run["rows"]
               if r["planner_error_pct"] is not None]
    result["summary"] = {"reference_rows": len(checked),
                         "reference_rows_within_tolerance": sum(bool(r["agrees_with_reference"]) for r in checked),
                         "planner_max_abs_error_pct": max(planner) if planner else None}
    write_json_result(args.out, result, roots=(args.work,))
    print(result["summary"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
