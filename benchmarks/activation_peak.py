"""Which part of a shape sets vLLM's profiled activation peak: variants of a shape, booted and compared.

Why: the planner's activation term is what decides its KV tokens to 0.1 % (issue 25), and on the H200
(``benchmarks/results/capacity/h200_shapes.json``, vLLM 0.26.0) the term calibrated on Llama fitted
Llama-3-8B and -70B
within 0.01 GiB but Qwen2-72B's peak was 0.30 GiB above it with graphs on (2.57 against 2.27 GiB) and
0.12 GiB eager. The two shapes differ in three things: Qwen2's q/k/v biases, its intermediate size (29,568,
not a multiple of 256) and its vocabulary (152,064). Each variant here changes one of them, so the peak that
moves names the cause; the MoE pair separates Qwen3-30B-A3B's eager peak from its compiled one (the planner's
sparse-layer compiled extra is calibrated on its compiled peak), and Mixtral-8x7B tests that term on an MoE
it was not calibrated on. vLLM logs at DEBUG here, so each row also keeps its memory profile's debug lines.
Measured (``benchmarks/results/capacity/h200_activation_peak.json``): a 4-layer Qwen2-72B peaks at its full
depth's
2.57 GiB, and so do one without its biases and one with Llama's intermediate size; one with Llama's vocabulary
peaks at Llama-3-70B's 2.21 GiB. The planner's compiled term (``compiled_pass_peak_bytes``) is what that
showed.

Each variant is a config.json of the base shape with a few keys overridden and ``--layers`` decoder
layers (default 4): the peak is one layer's live set plus hidden-sized tensors, so depth leaves it as
it is and a 4-layer shape boots in about a minute. The unmodified variants (``llama-3-70b``,
``qwen2-72b``) check that against the full-depth rows. One boot per (variant, configuration, mode)
through ``quantize_serve.capacity.shape.measure_shape`` (dummy weights; the serve settings of
``h200_shapes.py``: max_num_batched_tokens 8192, max_num_seqs 256, gpu_memory_utilization 0.90), in
``eager`` (enforce_eager) and ``graphs`` mode. Each row keeps vLLM's "Actual usage" split (weights,
peak activation, non-torch, graph pool) beside the planner's activation term and their difference.
Nothing is fitted here; the JSON is written after every row, and ``--resume`` skips recorded rows.

On the GPU host: ``bash scripts/gpu/host.sh launch-peak [ARGS]``. ``--rehearse`` runs the tiny reference
shapes on a CPU (the recipes' fixed budget: vLLM does not profile there, so no peak is recorded; it
checks the variants, boots and the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
from benchmarks import harness  # noqa: E402 - the benchmarks' shared module

harness.driver_env()  # before the product's imports, which read it

from quantize_serve.capacity.model_shape import ModelShape  # noqa: E402
from quantize_serve.capacity.planner import activation_peak_bytes  # noqa: E402
from quantize_serve.capacity.shape import measure_shape  # noqa: E402
from quantize_serve.recipe.load import load_recipe  # noqa: E402
from quantize_serve.serving import gpu  # noqa: E402
from quantize_serve.serving.boot import Boot  # noqa: E402
from benchmarks.evidence import evidence_lines  # noqa: E402
from quantize_serve.serving.vllm_log import compile_cache, memory_figures, read_log  # noqa: E402

SCENARIO = harness.load_scenario("peak")
SHAPE_SETTINGS = harness.shared_settings()["shapes"]  # the serve settings and recipes: h200_shapes.py's too
RECIPES, SERVE, REHEARSE_SERVE = (SHAPE_SETTINGS[k] for k in ("recipes", "serve", "rehearse_serve"))
# name -> (shape of harness.SHAPES, config.json keys overridden)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {k: tuple(v) for k, v in SCENARIO["variants"].items()}
REHEARSE_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    k: tuple(v) for k, v in SCENARIO["rehearse_variants"].items()
}
MODES = ("eager", "graphs")
# vLLM logs at DEBUG (VLLM_LOGGING_LEVEL) for these boots: its memory profile ("torch_peak_increase", ...)
# and whether it profiled CUDA-graph memory ("skipping profiling") are debug lines; a row keeps them.
DEBUG_EVIDENCE = (
    "torch_peak",
    "non_torch",
    "CUDA graph memory",
    "skipping profiling",
    "Free memory after profiling",
    "Directly load",
    "Compiling a graph",
    "torch.compile took",
)
BOOTS = {"base": Boot.BASE, "w4a16": Boot.QUANTIZED_16BIT_KV}
RECORDED = ("measured",)
log = harness.logger("peak")


def variant_folder(name: str, variants: dict[str, tuple[str, dict]], layers: int | None, work: Path) -> Path:
    """The variant's shape folder: its config.json (``variant_config``) and the reference tokenizer."""
    return harness.shape_folder(
        variant_config(name, variants, layers), work / "variants" / name, tokenizer_dir=harness.TOKENIZER
    )


def variant_config(name: str, variants: dict[str, tuple[str, dict]], layers: int | None) -> dict[str, Any]:
    """The variant's config.json: its base shape's (``SHAPES``), the variant's keys overridden, ``layers``
    deep."""
    shape, overrides = variants[name]
    config = {**json.loads(harness.SHAPES[shape].read_text()), **overrides}
    if layers:
        config["num_hidden_layers"] = layers
        for key in ("max_window_layers",):  # Qwen2's window bound follows the depth it was written for
            if key in config:
                config[key] = min(config[key], layers)
    return config


def row_id(variant: str, boot: str, mode: str, nth: int = 1) -> str:
    """``variant/config/mode``; the n-th boot of the same row (``--boots``) adds ``#n``."""
    return f"{variant}/{boot}/{mode}" + (f"#{nth}" if nth > 1 else "")


def planner_activation_gib(variant: str, *, variants: dict, layers: int | None, mode: str) -> float:
    """Today's planner's activation term for the variant (from its config.json, as the boot's plan has it)."""
    act = activation_peak_bytes(
        ModelShape.from_config(variant_config(variant, variants, layers), source=variant),
        max_num_batched_tokens=SERVE["serve.max_num_batched_tokens"],
        tensor_parallel_size=SERVE["serve.tensor_parallel_size"],
        compiled=mode == "graphs",
    )
    return harness.gib(act)


def replan(rows: list[dict]) -> list[dict]:
    """``rows`` with today's planner's activation term beside each recorded peak (the measured figures
    stay)."""
    out = []
    for r in rows:
        if r.get("status") in RECORDED and r.get("variant") in VARIANTS:
            planned = planner_activation_gib(
                r["variant"], variants=VARIANTS, layers=r.get("layers"), mode=r["mode"]
            )
            peak = (r.get("vllm_actual_usage_gib") or {}).get("peak_activation")
            r = {
                **r,
                "planner_activation_gib": planned,
                "peak_minus_planner_gib": None if peak is None else round(peak - planned, 3),
            }
        out.append(r)
    return out


def measure_row(
    variant: str,
    boot: str,
    mode: str,
    *,
    variants: dict,
    layers: int | None,
    work: Path,
    rehearse: bool,
    device: int | None,
    nth: int = 1,
) -> dict[str, Any]:
    shape = variants[variant][0]
    folder = variant_folder(variant, variants, layers, work)
    settings = {
        **(REHEARSE_SERVE[shape] if rehearse else SERVE),
        "serve.enforce_eager": mode == "eager",
        "model.id": str(folder),
    }
    recipe = load_recipe(harness.ROOT / RECIPES[shape], settings)
    out_dir = (
        work / "boots" / variant / mode
    )  # the same served path every boot: vLLM's compile-cache key holds it
    t0 = time.monotonic()
    result = measure_shape(
        recipe,
        folder,
        out_dir=out_dir,
        model=variant,
        device_memory_bytes=device,
        boots={BOOTS[boot]},
        log=lambda msg: log(f"{variant} {mode}: {msg}"),
    )
    row = result.row(BOOTS[boot])
    log_path = out_dir / f"vllm-shape-{BOOTS[boot]}.log"
    text = read_log(log_path)
    if nth > 1 and log_path.is_file():  # the next boot of the row writes the same log: keep this one's apart
        log_path = Path(shutil.copyfile(log_path, log_path.with_name(f"{log_path.stem}-{nth}.log")))
    usage = memory_figures(text)["actual_usage_gib"]
    planned = harness.gib(row.planned.activation_bytes)
    peak = usage.get("peak_activation")
    return {
        "id": row_id(variant, boot, mode, nth),
        "variant": variant,
        "boot_of_row": nth,
        "compile_cache": compile_cache(text),
        "shape": shape,
        "overrides": variants[variant][1],
        "layers": layers,
        "config": boot,
        "mode": mode,
        "status": "measured" if row.measured else "refused" if row.refused else "not-booted",
        "reason": row.refused or row.not_booted,
        "vllm_actual_usage_gib": usage,
        "planner_activation_gib": planned,
        "peak_minus_planner_gib": None if peak is None else round(peak - planned, 3),
        "kv_tokens": row.measured.kv_cache_tokens if row.measured else None,
        "seconds": round(time.monotonic() - t0, 1),
        "vllm_log": str(log_path),
        "vllm_lines": evidence_lines(text),
        "vllm_debug_lines": [
            line.strip()[:1500] for line in text.splitlines() if any(k in line for k in DEBUG_EVIDENCE)
        ][:20],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_out_option(p, "capacity/h200_activation_peak.json", "capacity/activation_peak_rehearsal.json")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "qs-activation-peak")
    p.add_argument("--variants", help="comma-separated, default all: " + ", ".join(VARIANTS))
    p.add_argument("--configs", default="w4a16", help="comma-separated: base (bf16), w4a16; default w4a16")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated: eager, graphs; default both")
    p.add_argument(
        "--layers", type=int, default=4, help="decoder layers of every variant (0: the shape's own)"
    )
    p.add_argument(
        "--boots",
        type=int,
        default=1,
        help="boots of each row, one after another; the later ones "
        "serve the same path, so vLLM's compile cache can hold their graphs (a cold and a warm boot)",
    )
    p.add_argument("--resume", action="store_true", help="skip rows --out already holds")
    p.add_argument("--rehearse", action="store_true", help="CPU: the tiny reference shape's variants")
    p.add_argument(
        "--replan", action="store_true", help="no boot: today's planner beside each recorded row of --out"
    )
    args = p.parse_args(argv)
    if args.replan:
        out = args.out or harness.ROOT / "benchmarks/results/capacity/h200_activation_peak.json"
        res = harness.Results(out, roots=(args.work,))
        res.data["rows"] = replan(res.data.get("rows", []))
        res.save()
        for r in res.data["rows"]:
            log(
                f"{r['id']}: vLLM peak {(r.get('vllm_actual_usage_gib') or {}).get('peak_activation')} GiB, "
                f"planner {r.get('planner_activation_gib')} GiB"
            )
        return 0

    variants = REHEARSE_VARIANTS if args.rehearse else VARIANTS
    picked = args.variants.split(",") if args.variants else list(variants)
    configs, modes = args.configs.split(","), args.modes.split(",")
    for name, allowed, what in (
        (picked, variants, "variant"),
        (configs, BOOTS, "configuration"),
        (modes, MODES, "mode"),
    ):
        unknown = [n for n in name if n not in allowed]
        if unknown:
            raise SystemExit(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(allowed)}")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "DEBUG")  # the boots inherit it (DEBUG_EVIDENCE)
    harness.require_gpu(
        "activation_peak.py", "--rehearse runs it on this CPU", rehearsing=args.rehearse
    )  # CUDA's memory profile
    device = gpu.usable_memory_bytes()
    out = harness.out_path(args)
    res = harness.Results(out, roots=(args.work,))
    done = (
        {r["id"] for r in res.data.get("rows", []) if r.get("status") in RECORDED} if args.resume else set()
    )
    todo = [
        (v, c, m, n)
        for v in picked
        for c in configs
        for m in modes
        for n in range(1, args.boots + 1)
        if row_id(v, c, m, n) not in done
    ]
    log(f"{len(todo)} boot(s): " + ", ".join(row_id(*t) for t in todo))
    res.data.update(
        benchmark="activation_peak",
        rehearse=args.rehearse,
        layers=args.layers or None,
        settings=SERVE if not args.rehearse else REHEARSE_SERVE,
        device_memory_bytes=device,
        weights="random (vLLM --load-format dummy): memory only",
    )
    res.data.setdefault("sessions", []).append(
        {
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "device": gpu.describe_devices(),
            "versions": harness.versions(),
        }
    )
    failed = 0
    for variant, config, mode, nth in todo:
        try:
            row = measure_row(
                variant,
                config,
                mode,
                variants=variants,
                layers=args.layers or None,
                work=args.work,
                rehearse=args.rehearse,
                device=device,
                nth=nth,
            )
        except Exception as exc:  # recorded, and the next row still runs
            failed += 1
            row = {
                "id": row_id(variant, config, mode, nth),
                "status": "error",
                "reason": f"{type(exc).__name__}: {exc}",
            }
        res.data["rows"] = harness.merge_row(res.data.get("rows", []), row, [])  # by id
        res.save()
        log(
            f"{row['id']}: {row['status']}; vLLM peak "
            f"{row.get('vllm_actual_usage_gib', {}).get('peak_activation')} GiB, planner "
            f"{row.get('planner_activation_gib')} GiB, compile cache {row.get('compile_cache')}, "
            f"{row.get('seconds')} s"
        )
    log(f"written to {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
