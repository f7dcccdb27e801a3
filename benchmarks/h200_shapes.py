"""Issue 25's shapes on one H200 in production settings, measured row by row beside the planner.

Rows: Llama-3-8B, Llama-3-70B, Qwen2-72B and Qwen3-30B-A3B, each as the bf16 base (16-bit KV), W4A16
(16-bit KV) and W4A16 with the fp8 KV cache, all at tensor_parallel_size 1, in production mode: CUDA
graphs on (enforce_eager false), max_model_len 8192, gpu_memory_utilization 0.90, max_num_seqs 256,
max_num_batched_tokens 8192, random weights (vLLM --load-format dummy: sizes, kernels and memory
accounting are the real ones, the figures are capacity, not accuracy).

Each row is one boot through the project's own code, ``quantize_serve.capacity.shape.measure_shape``
(what `quantize-serve plan RECIPE --measure` and ``serve.preflight: measure`` run). A bf16 base the
planner says does not fit one GPU is recorded as such, with the planner's weights, and not booted;
every quantized row is booted, so a planner that is wrong about fitting shows as vLLM's refusal.
Beside each measured row:
- the planner as `quantize-serve plan` runs it from config.json alone: KV tokens, weights, activation,
  overhead, error % on KV tokens;
- where the boot's log has vLLM's CUDA-graph estimate (the "(estimated)" figure of "CUDA graph pool
  memory", what `plan --cudagraph-memory` takes; vLLM 0.26 logs one under its V1 model runner, the MoE
  rows' here), the plan given it instead of the planner's own estimate:
  the same figures again, beside the first, never instead of it;
- the kernels vLLM logged (linear kernels, MoE methods and backends; the project's kernel check,
  ``formats.kernel_problem``, for the W4A16 rows) and its memory lines (CUDA graph pool actual and
  estimated, the "Actual usage" split).
The target (issue 25) is at most 0.1 % error on KV tokens per row; the summary says, for both plans,
which rows meet it. Nothing is tuned to meet it here.

The JSON is written after every row, so a session that ends mid-way keeps what it measured. Rows
already in --out are kept; a row measured again replaces its old figures. ``--resume`` skips rows
already recorded (measured, or does-not-fit), so the measurement splits over sessions:
``--models``/``--rows`` pick the part for this one. ``--replan`` boots nothing: it recomputes the planner's
figures of the recorded rows with today's planner, after a planner change. ``--dry-run`` prints the rows with
the fit decision and the estimated time and boots nothing.

On the GPU host (scripts/gpu/README.md): ``bash scripts/gpu/host.sh launch-shapes [ARGS]``.
``--rehearse`` runs the same code on a CPU with the reference models' shapes and their recipes' CPU
settings (serve.memory_budget, enforce_eager, max_model_len 512); the tiny MoE gets a budget its bf16
weights do not fit (the does-not-fit path), and vLLM's CPU backend refuses its W4A16 rows (the
refusal path).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
from benchmarks.harness import (  # noqa: E402
    GIB,
    ROOT,
    SHAPES,
    TOKENIZER,
    Results,
    add_out_option,
    driver_env,
    load_scenario,
    logger,
    merge_row,
    out_path,
    require_gpu,
    shape_folder,
    shared_settings,
    versions,
)

driver_env()  # before the product's imports, which read it

from benchmarks.evidence import evidence_lines, graph_estimate_bytes, kernel_report  # noqa: E402
from quantize_serve.capacity.measure import plan_for  # noqa: E402
from quantize_serve.capacity.planner import (  # noqa: E402
    BLOCK_SIZE_CPU,
    BLOCK_SIZE_GPU,
    GPU_MEMORY_BYTES,
    CapacityPlan,
    kv_error_pct,
)
from quantize_serve.capacity.shape import ShapeRow, measure_shape  # noqa: E402
from quantize_serve.formats.choose import platform_of  # noqa: E402
from quantize_serve.recipe.load import load_recipe  # noqa: E402
from quantize_serve.serving import gpu  # noqa: E402
from quantize_serve.serving.boot import Boot  # noqa: E402
from quantize_serve.serving.vllm_log import memory_figures, read_log  # noqa: E402

SCENARIO = load_scenario("shapes")
MODELS, REHEARSE_MODELS = tuple(SCENARIO["models"]), tuple(SCENARIO["rehearse_models"])
# each shape's recipe and serve settings (shared.yaml: activation_peak.py's too)
SHAPE_SETTINGS = shared_settings()["shapes"]
RECIPES, SERVE, REHEARSE_SERVE = (SHAPE_SETTINGS[k] for k in ("recipes", "serve", "rehearse_serve"))
TARGET_PCT, ESTIMATE_S = SCENARIO["target_pct"], SCENARIO["estimate_s"]
RECORDED = ("measured", "does-not-fit")  # what --resume keeps; a refused or failed row is tried again
CONFIG_ALIASES = {"bf16": Boot.BASE}
log = logger("shapes")


# --------------------------------------------------------------------------------------------
# Which rows (pure)
# --------------------------------------------------------------------------------------------


def row_id(model: str, boot: Boot) -> str:
    return f"{model}/{boot}"


def all_rows(models: Iterable[str]) -> list[tuple[str, Boot]]:
    """Every (model, configuration), in the table's order."""
    return [(m, b) for m in models for b in Boot]


def parse_config(name: str) -> Boot:
    try:
        return CONFIG_ALIASES.get(name) or Boot(name)
    except ValueError:
        raise SystemExit(
            f"unknown configuration {name!r}; choose from {', '.join([*Boot, *CONFIG_ALIASES])}"
        ) from None


def select_rows(
    known: Iterable[str], *, models: str | None = None, rows: str | None = None
) -> list[tuple[str, Boot]]:
    """The rows asked for: ``models`` (comma-separated names) and ``rows`` (configurations, e.g.
    ``base,w4a16``, or whole rows, ``Qwen2-72B/w4a16-fp8kv``), both optional, in the table's order."""
    known = list(known)
    asked = [m.strip() for m in (models or "").split(",") if m.strip()]
    unknown = [m for m in asked if m not in known]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; choose from {', '.join(known)}")
    chosen = [m for m in known if m in asked or not asked]
    wanted_configs: set[Boot] = set()
    wanted_ids: set[str] = set()
    for item in (r.strip() for r in (rows or "").split(",") if r.strip()):
        if "/" in item:
            model, _, config = item.partition("/")
            if model not in known:
                raise SystemExit(
                    f"unknown model {model!r} in --rows {item!r}; choose from {', '.join(known)}"
                )
            wanted_ids.add(row_id(model, parse_config(config)))
        else:
            wanted_configs.add(parse_config(item))
    if not wanted_configs and not wanted_ids:
        return all_rows(chosen)
    return [(m, b) for m, b in all_rows(chosen) if b in wanted_configs or row_id(m, b) in wanted_ids]


def pending_rows(
    selected: list[tuple[str, Boot]], recorded: list[dict], *, resume: bool
) -> list[tuple[str, Boot]]:
    """``selected`` less, with ``resume``, the rows ``recorded`` already holds a result for."""
    if not resume:
        return selected
    done = {r["id"] for r in recorded if r.get("status") in RECORDED}
    return [(m, b) for m, b in selected if row_id(m, b) not in done]


def fit_decision(plan: CapacityPlan, boot: Boot) -> str | None:
    """None: boot this row. Else why it is recorded without a boot: the bf16 base the planner says does not
    fit (only the base: every quantized row is booted, so vLLM has the last word on those)."""
    if boot is Boot.BASE and not plan.fits:
        return f"does not fit, planner says {size(plan.weights_bytes)} weights ({plan.reason})"
    return None


def size(n: int) -> str:
    """Bytes as GiB, or as MiB below a tenth of one (the rehearsal's tiny shapes)."""
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB / 10 else f"{n / 2**20:.2f} MiB"


def estimate_seconds(model: str, boot: Boot, not_booted: str | None) -> int:
    return 0 if not_booted else ESTIMATE_S.get(model, 180)


# --------------------------------------------------------------------------------------------
# One row's figures (pure)
# --------------------------------------------------------------------------------------------


def plan_given_estimate(
    recipe: Any, config: dict, boot: Boot, memory: dict[str, Any], *, block_size: int, device: int | None
) -> CapacityPlan | None:
    """The row's plan given vLLM's own CUDA-graph estimate (``memory``: ``memory_figures``'s); None when the
    log has none, or the boot took no graphs (eager, or a fixed budget, where vLLM does not profile)."""
    estimate = graph_estimate_bytes(memory)
    if estimate is None or recipe.serve.memory_budget is not None or recipe.serve.enforce_eager:
        return None
    return plan_for(
        recipe,
        config,
        boot,
        block_size=block_size,
        device_memory_bytes=device,
        cudagraph_memory_bytes=estimate,
    )


def replan(rows: list[dict], *, work: Path, device: int) -> list[dict]:
    """``rows`` with each recorded row's ``planner`` figures (and the plan given vLLM's CUDA-graph estimate,
    where the row has one) from today's planner (the measured figures stay as measured): after a planner
    change, the table says how the planner now does on what was measured."""
    out = []
    for r in rows:
        if r.get("status") in RECORDED and r.get("planner"):
            boot = parse_config(r["config"])
            recipe, config, _, plan = plan_row(r["model"], boot, work=work, rehearse=False, device=device)
            m = r.get("measured")
            r = {**r, "planner": plan_figures(plan, m["kv_tokens"] if m else None)}
            given = (
                plan_given_estimate(
                    recipe,
                    config,
                    boot,
                    r.get("vllm_memory") or {},
                    block_size=m["block_size"],
                    device=device,
                )
                if m
                else None
            )
            if given is not None:
                r["planner_given_vllm_graph_estimate"] = plan_figures(given, m["kv_tokens"])
            if (
                r["status"] == "does-not-fit"
            ):  # the reason quotes the plan; one that now fits is still said so
                r["reason"] = (
                    fit_decision(plan, boot) or f"the planner now fits it: measure it ({r['reason']})"
                )
        out.append(r)
    return out


def plan_figures(plan: CapacityPlan, measured: int | None, err: float | None = None) -> dict[str, Any]:
    """A plan's figures beside a measured row; ``err``: its error as already computed (measure_shape's)."""
    if err is None and measured:
        err = kv_error_pct(plan.kv_cache_tokens, measured)
    return {
        "kv_tokens": plan.kv_cache_tokens,
        "weights_gib": round(plan.weights_bytes / GIB, 3),
        "activation_gib": round(plan.activation_bytes / GIB, 3),
        "overhead_gib": round(plan.overhead_bytes / GIB, 3),
        "cuda_graph_gib": round(plan.cudagraph_bytes / GIB, 3),
        "cuda_graph_source": plan.cudagraph_source,
        "fits": plan.fits,
        "error_pct": err,
        "within_target": None if err is None else abs(err) <= TARGET_PCT,
    }


def assemble_row(
    model: str,
    row: ShapeRow,
    *,
    scheme: str,
    log_text: str = "",
    platform: str = "cpu",
    given: CapacityPlan | None = None,
    seconds: float | None = None,
    estimated_s: int = 0,
    log_file: str | None = None,
) -> dict[str, Any]:
    """One row of the JSON from ``measure_shape``'s row (measured, refused by vLLM, or not booted because
    it does not fit), its boot log, and ``given``: the plan with vLLM's CUDA-graph estimate."""
    m = row.measured
    status = "measured" if m else "refused" if row.refused else "does-not-fit"
    kernels = (
        kernel_report(log_text, scheme if row.name.quantized else "bf16", platform) if log_text else None
    )
    if kernels and not m:
        kernels["kernel_check"] = None  # a boot vLLM refused passes no check, whatever it had chosen by then
    out: dict[str, Any] = {
        "id": row_id(model, row.name),
        "model": model,
        "config": str(row.name),
        "scheme": scheme if row.name.quantized else "bf16",
        "kv_cache_dtype": row.kv_cache_dtype,
        "tensor_parallel_size": row.tensor_parallel_size,
        "status": status,
        "reason": row.refused or row.not_booted,
        "measured": None
        if m is None
        else {
            "kv_tokens": m.kv_cache_tokens,
            "num_blocks": m.num_blocks,
            "block_size": m.block_size,
            "weights_gib": round(m.weights_bytes / GIB, 3),
            "kv_cache_gib": round(m.kv_cache_memory_bytes / GIB, 3),
            "max_concurrency": m.max_concurrency,
            "boot_seconds": m.boot_seconds,
        },
        "planner": plan_figures(row.planned, m.kv_cache_tokens if m else None, row.error_pct),
        "planner_given_vllm_graph_estimate": None
        if given is None
        else plan_figures(given, m.kv_cache_tokens if m else None),
        "vllm_memory": memory_figures(log_text) if log_text else None,
        "kernels": kernels,
        "seconds": seconds,
        "estimated_seconds": estimated_s,
        "vllm_log": log_file,
        "vllm_lines": evidence_lines(log_text),
    }
    return out


def error_row(model: str, boot: Boot, error: str, *, seconds: float | None = None) -> dict[str, Any]:
    return {
        "id": row_id(model, boot),
        "model": model,
        "config": str(boot),
        "status": "error",
        "reason": error,
        "seconds": seconds,
    }


# --------------------------------------------------------------------------------------------
# The JSON (pure)
# --------------------------------------------------------------------------------------------


def summarize(rows: list[dict], order: list[str]) -> dict[str, Any]:
    """What the rows say against issue 25's target, for both plans, and what is left to measure."""
    by_id = {r["id"]: r for r in rows}
    measured = [r for r in rows if r.get("status") == "measured"]

    def against(key: str) -> dict[str, Any]:
        errs = {
            r["id"]: r[key]["error_pct"]
            for r in measured
            if r.get(key) and r[key].get("error_pct") is not None
        }
        within = sorted(i for i, e in errs.items() if abs(e) <= TARGET_PCT)
        return {
            "rows": len(errs),
            "within_target": len(within),
            "max_abs_error_pct": max((abs(e) for e in errs.values()), default=None),
            "over_target": {i: e for i, e in errs.items() if abs(e) > TARGET_PCT},
            "all_within_target": bool(errs) and len(within) == len(errs) == len(measured),
        }

    missing = [i for i in order if by_id.get(i, {}).get("status") not in RECORDED]
    return {
        "target_pct": TARGET_PCT,
        "rows": len(order),
        "recorded": len(order) - len(missing),
        "measured": len(measured),
        "does_not_fit": sum(r.get("status") == "does-not-fit" for r in rows),
        "missing": missing,
        "complete": not missing,
        "planner": against("planner"),
        "planner_given_vllm_graph_estimate": against("planner_given_vllm_graph_estimate"),
    }


# --------------------------------------------------------------------------------------------
# The boots
# --------------------------------------------------------------------------------------------


def plan_row(
    model: str, boot: Boot, *, work: Path, rehearse: bool, device: int | None
) -> tuple[Any, dict, Path, CapacityPlan]:
    """(the row's recipe, its config.json, its shape folder, the planner's plan) before any boot."""
    folder = shape_folder(SHAPES[model], work / "shapes" / model, tokenizer_dir=TOKENIZER)
    recipe = load_recipe(
        ROOT / RECIPES[model], {**(REHEARSE_SERVE[model] if rehearse else SERVE), "model.id": str(folder)}
    )
    config = json.loads((folder / "config.json").read_text())
    block = BLOCK_SIZE_CPU if recipe.serve.memory_budget is not None else BLOCK_SIZE_GPU
    return (
        recipe,
        config,
        folder,
        plan_for(recipe, config, boot, block_size=block, device_memory_bytes=device),
    )


def measure_row(
    model: str, boot: Boot, *, work: Path, rehearse: bool, device: int | None, platform: str, estimated_s: int
) -> dict[str, Any]:
    """One row: planned, then (unless it does not fit) booted through measure_shape, then assembled."""
    recipe, config, folder, plan = plan_row(model, boot, work=work, rehearse=rehearse, device=device)
    assemble = functools.partial(assemble_row, model, scheme=recipe.quantization.scheme, platform=platform)
    skip = fit_decision(plan, boot)
    if skip:
        row = ShapeRow(
            name=boot,
            kv_cache_dtype="auto",
            tensor_parallel_size=recipe.serve.tensor_parallel_size,
            planned=plan,
            not_booted=skip,
        )
        return assemble(row, seconds=0.0, estimated_s=0)
    out_dir = work / "boots" / model
    t0 = time.monotonic()
    shape = measure_shape(
        recipe,
        folder,
        out_dir=out_dir,
        model=model,
        device_memory_bytes=device,
        boots={boot},
        log=lambda msg: log(f"{model}: {msg}"),
    )
    seconds = round(time.monotonic() - t0, 1)
    row = shape.row(boot)
    log_path = out_dir / f"vllm-shape-{boot}.log"
    log_text = read_log(log_path)
    given = (
        plan_given_estimate(
            recipe, config, boot, memory_figures(log_text), block_size=row.measured.block_size, device=device
        )
        if row.measured
        else None
    )
    return assemble(
        row, log_text=log_text, given=given, seconds=seconds, estimated_s=estimated_s, log_file=str(log_path)
    )


def describe_row(r: dict) -> str:
    if r["status"] != "measured":
        return f"{r['id']}: {r['status']}: {r.get('reason')}"
    p, g, m = r["planner"], r.get("planner_given_vllm_graph_estimate"), r["measured"]
    given = f"; with vLLM's graph estimate {g['kv_tokens']:,} ({g['error_pct']:+.3f}%)" if g else ""
    k = r.get("kernels") or {}
    kernels = ", ".join(k.get("kernels", []) + k.get("moe_methods", [])) or "-"
    return (
        f"{r['id']}: {m['kv_tokens']:,} KV tokens, weights {m['weights_gib']} GiB; planner "
        f"{p['kv_tokens']:,} ({p['error_pct']:+.3f}%){given}; kernels {kernels}; {r['seconds']} s "
        f"(estimated {r['estimated_seconds']} s)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_out_option(p, "capacity/h200_shapes.json", "capacity/h200_shapes_rehearsal.json")
    p.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "qs-h200-shapes",
        help="shape folders and vLLM logs",
    )
    p.add_argument("--models", help=f"comma-separated, default all: {', '.join(MODELS)}")
    p.add_argument(
        "--rows",
        help="configurations (base or bf16, w4a16, w4a16-fp8kv) or rows (MODEL/CONFIG), "
        "comma-separated; default all",
    )
    p.add_argument(
        "--resume", action="store_true", help="skip rows --out already holds (measured or does-not-fit)"
    )
    p.add_argument("--fresh", action="store_true", help="start --out afresh instead of adding to it")
    p.add_argument(
        "--dry-run", action="store_true", help="the rows, fit decisions and estimated time; no boot"
    )
    p.add_argument("--rehearse", action="store_true", help="CPU: the reference models' shapes, CPU settings")
    p.add_argument(
        "--replan",
        action="store_true",
        help="no boot: recompute the planner's figures of the rows "
        "--out holds with today's planner (after a planner change), and the summary",
    )
    args = p.parse_args(argv)
    models = REHEARSE_MODELS if args.rehearse else MODELS
    out = out_path(args)
    if not (args.dry_run or args.replan):  # they boot nothing
        require_gpu(
            "h200_shapes.py", "--rehearse runs it on this CPU, --dry-run plans", rehearsing=args.rehearse
        )
    device = gpu.usable_memory_bytes()
    platform = platform_of(gpu.compute_capability())
    order = [row_id(m, b) for m, b in all_rows(models)]
    selected = select_rows(models, models=args.models, rows=args.rows)
    if args.fresh and out.is_file():
        out.unlink()
    res = Results(out, roots=(args.work,))
    if args.replan:
        res.data["rows"] = replan(
            res.data.get("rows", []),
            work=args.work,
            device=res.data.get("device_memory_bytes") or int(GPU_MEMORY_BYTES["h200"]),
        )
        res.data["summary"] = summarize(res.data["rows"], order)
        res.data["replanned"] = time.strftime("%Y-%m-%d")
        res.save()
        for r in res.data["rows"]:
            log(describe_row(r))
        return 0
    todo = pending_rows(selected, res.data.get("rows", []), resume=args.resume)

    plans = []  # (model, boot, why not booted, estimated seconds); a dry run on a CPU plans for an H200
    for model, boot in todo:
        *_, plan = plan_row(
            model,
            boot,
            work=args.work,
            rehearse=args.rehearse,
            device=device or int(GPU_MEMORY_BYTES["h200"]),
        )
        skip = fit_decision(plan, boot)
        plans.append((model, boot, skip, estimate_seconds(model, boot, skip)))
    total = sum(e for *_, e in plans)
    log(
        f"{len(todo)} row(s) to measure of {len(selected)} selected ({len(order)} in the table), estimated "
        f"{total} s (~{total / 60:.0f} min) " + ("on this CPU" if args.rehearse else "on the H200")
    )
    for i, (model, boot, skip, est) in enumerate(plans, 1):
        log(f"  {i:2}. {row_id(model, boot):28} " + (f"not booted: {skip}" if skip else f"~{est} s"))
    if args.dry_run:
        return 0

    res.data.update(
        benchmark="h200_shapes",
        rehearse=args.rehearse,
        target_pct=TARGET_PCT,
        settings=({m: REHEARSE_SERVE[m] for m in models} if args.rehearse else SERVE),
        recipes={m: RECIPES[m] for m in models},
        configs={m: str(SHAPES[m].relative_to(ROOT)) for m in models},
        device_memory_bytes=device,
        platform=platform,
        weights="random (vLLM --load-format dummy): capacity only, no accuracy",
    )
    session = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "device": gpu.describe_devices(),
        "rows": [row_id(m, b) for m, b in todo],
        "estimated_seconds": total,
        "versions": versions(),
    }
    res.data.setdefault("sessions", []).append(
        session
    )  # one per run: a measurement split over sessions says so
    res.save()
    left = total
    failed = 0
    for i, (model, boot, skip, est) in enumerate(plans, 1):
        log(
            f"row {i}/{len(plans)} {row_id(model, boot)}: "
            + (f"estimated ~{est} s; ~{left} s left in this session's rows" if not skip else "no boot")
        )
        t0 = time.monotonic()
        try:
            row = measure_row(
                model,
                boot,
                work=args.work,
                rehearse=args.rehearse,
                device=device,
                platform=platform,
                estimated_s=est,
            )
        except Exception as exc:  # recorded, and the next row still runs
            failed += 1
            row = error_row(
                model, boot, f"{type(exc).__name__}: {exc}"[-2000:], seconds=round(time.monotonic() - t0, 1)
            )
        left -= est
        res.data["rows"] = merge_row(res.data.get("rows", []), row, order)
        res.data["summary"] = summarize(res.data["rows"], order)
        res.save()
        log(describe_row(row))
    session.update(finished=time.strftime("%Y-%m-%dT%H:%M:%S"), failed_rows=failed)
    res.data["summary"] = summarize(res.data.get("rows", []), order)
    res.save()
    s = res.data["summary"]
    log(
        f"recorded {s['recorded']}/{s['rows']} rows (missing: {', '.join(s['missing']) or 'none'}); within "
        f"{TARGET_PCT}% on KV tokens: planner {s['planner']['within_target']}/{s['planner']['rows']}, given "
        f"vLLM's graph estimate {s['planner_given_vllm_graph_estimate']['within_target']}/"
        f"{s['planner_given_vllm_graph_estimate']['rows']}; written to {out}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
