"""llm-compressor 0.14's own speed options, chosen by measurement: seconds per stage and held-out
perplexity recovery for each option set, against the options the project used before (TODAY).

Every option set is a set of recipe overrides (the flow's dotted keys) on top of TODAY, quantized from
scratch (a fresh work folder) through the project's quantization stage (``validate_recipe`` ->
``quantize_model`` -> the worker's ``oneshot``). OPTIONS lists every option of this version that trades
time, with llm-compressor's names, and why the ones not measured here were not.

Recovery: held-out perplexity as benchmarks/quantize.py measures it (``perplexity``: exp(mean token NLL)
over data/corpus/heldout.txt, the int4 checkpoint decompressed by compressed-tensors, on CPU), turned
into recovery as base / quantized (lower is better; ``recovery``).
The served gate (vLLM, fp8 KV, lm-eval) is not re-run per option set.

Rule: the fastest option set whose recovery stays within RECOVERY_TOLERANCE (harness.py) of today's and
whose every repeat is faster than today's fastest (a saving larger than the spread). Fastest by the
``calibrate`` stage
(llm-compressor's oneshot, the only stage the options act on): on CPU its CPU seconds, with the worker
on one thread (OMP_NUM_THREADS=1, set here for the child), on a GPU its wall seconds. On a 2-core
machine shared with other users, two torch threads turn someone else's load into OpenMP spin-waits:
today's AWQ calibrate took 4.5 s (8 CPU-s) on a quiet machine and 70 s (71 CPU-s) while another job ran.
One thread's CPU seconds measure the work; wall seconds are reported beside. Each figure is reported
per repeat; repeats are interleaved (the set order reverses every round) so a busy spell does not land
on one set. The basic pipeline is measured but not eligible (NOT_ELIGIBLE says why).

CPU (the reference model, models/tiny-llama, recipes tiny-llama-awq.yaml and tiny-llama-gptq.yaml;
about 4 minutes a repeat on 2 cores, 3 repeats by default):
    .venv/bin/python benchmarks/quantize_speed.py
writes benchmarks/results/release-time/quantize_speed.json (``--summarize-only`` recomputes the summary from
its runs).

GPU (``--gpu``: the Llama-3-8B shape with random bf16 weights, built by ``benchmarks/h200.py build`` if
missing, calibrated as recipes/llama3-8b-instruct-awq.yaml was when this was measured: 256 production-shaped
conversations from localhub/datasets.py, ~300k tokens, cap 2,048 (512 since calibration_length.json);
batch 1, the recipe's before this measurement set it to 4). Seconds only: a random model's perplexity means
nothing. It runs the CPU choice (the project's defaults, the baseline there), then the choice with each
option that only a GPU can judge (GPU_ONLY) and with all of them; resumable (finished runs in --out are kept):
    .venv/bin/python benchmarks/quantize_speed.py --gpu --model-dir M --work-dir W --out OUT.json
about 11 minutes a repeat of AWQ's four sets (--sets 'awq:*') on one H200 (an 8B AWQ with the project's
defaults takes ~175 s there, ~147 s of it calibrating; with today's old options 367 s). Then on CPU
    .venv/bin/python benchmarks/quantize_speed.py --gpu-recovery --out OUT.json
adds the reference model's recovery for each GPU set (at production's batch size where a set does not
set one), the calibration tokens each batch size keeps, and the GPU choice (about 4 minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
from benchmarks.harness import (  # noqa: E402
    RECOVERY_TOLERANCE,
    ROOT,
    Results,
    driver_env,
    gpu_recipe,
    on_reference,
    perplexity,
    production_calibration,
    quantize_once,
    require_gpu,
    tokens_kept_in_batches,
    versions,
    wait_for_build,
)

driver_env()  # before the product's imports, which read it

from benchmarks.evidence import write_json_result  # noqa: E402
from quantize_serve.quantize.calibration import tokenize_calibration  # noqa: E402
from quantize_serve.quantize.run import calibration_pipeline  # noqa: E402
from quantize_serve.serving import gpu  # noqa: E402
from quantize_serve.recipe.load import load_recipe  # noqa: E402
from quantize_serve.recipe.model import Recipe  # noqa: E402

OUT = ROOT / "benchmarks/results/release-time/quantize_speed.json"
PRODUCTION_BATCH_SIZE = 1  # calibration.batch_size of recipes/llama3-8b-instruct-awq.yaml before the GPU sets
# The options before this measurement, explicit (the recipe defaults now differ): llm-compressor's defaults.
TODAY = {
    "quantization.n_grid": 20,
    "quantization.duo_scaling": True,
    "calibration.pipeline": "independent",
    "calibration.propagate_error": True,
    "calibration.sequential_targets_per_subgraph": 1,
}
SEQUENTIAL = {"calibration.pipeline": "sequential"}
NO_PROPAGATE = {"calibration.propagate_error": False}
# (name, changes to TODAY) per method: each option alone, then the passes' two options together, then with
# the grid. GPTQ is one modifier, so independent and sequential are the same single pass for it.
CPU_SETS = {
    "awq": [
        ("today", {}),
        ("n_grid=10", {"quantization.n_grid": 10}),
        ("n_grid=5", {"quantization.n_grid": 5}),
        ("duo_scaling=false", {"quantization.duo_scaling": False}),
        ("duo_scaling=both", {"quantization.duo_scaling": "both"}),
        ("pipeline=sequential", SEQUENTIAL),
        ("pipeline=basic", {"calibration.pipeline": "basic"}),
        ("propagate_error=false", NO_PROPAGATE),
        ("sequential+no-propagate", {**SEQUENTIAL, **NO_PROPAGATE}),
        ("n_grid=10+sequential+no-propagate", {"quantization.n_grid": 10, **SEQUENTIAL, **NO_PROPAGATE}),
        ("n_grid=5+sequential+no-propagate", {"quantization.n_grid": 5, **SEQUENTIAL, **NO_PROPAGATE}),
    ],
    "gptq": [
        ("today", {}),
        ("propagate_error=false", NO_PROPAGATE),
        ("pipeline=basic", {"calibration.pipeline": "basic"}),
    ],
}
# Measured, but not eligible for the choice: what the reference model hides and a production model cannot
# afford.
NOT_ELIGIBLE = {
    "pipeline=basic": "holds every layer's calibration state at once (AWQ: each layer's cached inputs, for "
    "the 8B shape at ~300k calibration tokens about 13 GB a layer, ~430 GB in all; GPTQ: "
    "every Linear's Hessian, ~36 GiB) where the layer-by-layer pipelines hold one layer's; "
    "the worker's placement check assumes one layer",
    # per method ("METHOD:SET"):
    "gptq:propagate_error=false": "GPTQ's own design quantizes each layer on the inputs that the already "
    "quantized layers before it produce (its error compensation); the saving "
    "measured here (0.13 CPU-s of 1.38, the slowest repeat 1.35 s against "
    "today's fastest 1.36 s) is at the edge of the noise, too little to give "
    "that up",
}
# Options whose effect is per-step overhead on a device: measured in GPU mode only, on top of the choice.
GPU_ONLY = {
    "awq": [
        ("sequential_targets_per_subgraph=4", {"calibration.sequential_targets_per_subgraph": 4}),
        ("batch_size=4", {"calibration.batch_size": 4}),
    ],
    "gptq": [("sequential_targets_per_subgraph=4", {"calibration.sequential_targets_per_subgraph": 4})],
}
# Every option of llm-compressor 0.14 that trades time (signatures read from the installed package), where
# the project sets it, and how it was judged.
OPTIONS = [
    {
        "option": "AWQModifier.n_grid",
        "before": 20,
        "recipe": "quantization.n_grid",
        "measured": "cpu",
        "note": "points of the smoothing-scale grid per mapping; each is a forward of the mapping's parent "
        "module over all the calibration data",
    },
    {
        "option": "AWQModifier.duo_scaling",
        "before": True,
        "recipe": "quantization.duo_scaling",
        "measured": "cpu",
        "note": "true / false / 'both': n_grid points in every mode, so no time effect "
        "by construction (measured to confirm)",
    },
    {
        "option": "oneshot pipeline",
        "before": "independent",
        "recipe": "calibration.pipeline",
        "measured": "cpu",
        "note": "independent: one layer-by-layer pass per modifier (AWQ + the quantizer: two); sequential: "
        "one; basic: the whole model at once (NOT_ELIGIBLE); datafree: no data",
    },
    {
        "option": "oneshot propagate_error",
        "before": True,
        "recipe": "calibration.propagate_error",
        "measured": "cpu",
        "note": "the second forward per layer that feeds the next layer quantized outputs",
    },
    {
        "option": "oneshot sequential_targets_per_subgraph",
        "before": 1,
        "recipe": "calibration.sequential_targets_per_subgraph",
        "measured": "gpu (h200_quantize_speed.json)",
        "note": "decoder layers per step: fewer, larger steps for device memory; per-step overhead is a "
        "GPU's. At 4 the 8B's calibration took 140 s against 147 s, at a 40 GB higher device peak: kept at 1",
    },
    {
        "option": "oneshot batch_size",
        "before": "the recipe's calibration.batch_size (production 1, tiny 8)",
        "recipe": "calibration.batch_size",
        "measured": "gpu (h200_quantize_speed.json): the llama3 recipe now 4 (calibration 114 s, not 147 s)",
        "note": "fewer, larger forwards; llm-compressor's truncation collator cuts a batch to its shortest "
        "sample, so it also calibrates on fewer tokens. Its length-aware sampler (shuffle off, as the worker "
        "sets it) batches samples of similar length: on production-shaped data (localhub/datasets.py: "
        "log-normal, median 1,000 tokens, sigma 0.6, cut at 2,048) a batch of 4 drops about 1% of the "
        "tokens, 8 about 2.5%, 16 about 5-6% (256 samples, three draws)",
    },
    {
        "option": "oneshot sequential_prefetch",
        "before": False,
        "recipe": None,
        "measured": "no",
        "note": "overlaps loading the next batch from the offload device with compute; the worker keeps the "
        "activations on the model's device when they fit (sequential_offload_device), so there is nothing "
        "to prefetch; only QS_QUANTIZE_ON_DEVICE=false or a model larger than the device would use it",
    },
    {
        "option": "oneshot sequential_offload_device",
        "before": "the model's device (worker.placement)",
        "recipe": None,
        "measured": "no",
        "note": "already chosen per host by the worker's placement",
    },
    {
        "option": "AWQModifier.offload_device",
        "before": "None for dense models (cpu for MoE)",
        "recipe": None,
        "measured": "no",
        "note": "where AWQ keeps the cached layer inputs; dense models already keep them in "
        "place (llm-compressor's default); MoE offloads to save device memory",
    },
    {
        "option": "oneshot dataloader_num_workers",
        "before": 0,
        "recipe": None,
        "measured": "no",
        "note": "the calibration set is tokenized in memory before oneshot; workers would only collate",
    },
    {
        "option": "GPTQModifier.block_size",
        "before": 128,
        "recipe": None,
        "measured": "no",
        "note": "the width of GPTQ's lazy column batches: the same arithmetic in other slices; the reference "
        "model's layers are 128 and 384 columns wide (1-3 blocks), so only a GPU's kernels could tell",
    },
    {
        "option": "GPTQModifier.batched_quantization",
        "before": "auto",
        "recipe": None,
        "measured": "no",
        "note": "solves same-shape modules together (MoE experts); 'auto' is already on",
    },
    {
        "option": "GPTQModifier.actorder",
        "before": "static",
        "recipe": None,
        "measured": "no",
        "note": "column order; static costs nothing at serving time; an accuracy option, not a speed one",
    },
    {
        "option": "GPTQModifier.offload_hessians",
        "before": None,
        "recipe": None,
        "measured": "no",
        "note": "does not exist in 0.14 (GPTQModifier's fields: block_size, dampening_frac, actorder, "
        "batched_quantization)",
    },
]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def schedule(sets: dict[str, list[tuple[str, dict]]], repeats: int) -> list[tuple[int, str, str, dict]]:
    """(repeat, method, set, changes), interleaved: every set once per round, the order reversed every
    other round."""
    order = [(m, name, changes) for m, items in sets.items() for name, changes in items]
    return [
        (r, m, name, changes)
        for r in range(repeats)
        for m, name, changes in (order if r % 2 == 0 else order[::-1])
    ]


def median(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def summarize(
    runs: list[dict], sets: dict[str, list[tuple[str, dict]]], *, with_recovery: bool, measure: str
) -> dict:
    """Per method and set: each figure per repeat, medians, the deltas from the method's first set (today
    on CPU, the project's defaults on a GPU), and the fastest set within the rule, by the calibrate stage's
    ``measure`` (stage_cpu_seconds or stage_seconds)."""
    out: dict[str, Any] = {}
    for method, items in sets.items():
        rows = []
        for name, changes in items:
            mine = [r for r in runs if r["method"] == method and r["set"] == name and "error" not in r]
            if not mine:
                continue
            stages = list(mine[0]["stage_seconds"])
            row = {
                "set": name,
                "changes": changes,
                "repeats": len(mine),
                "seconds": [r["seconds"] for r in mine],
                "stage_seconds": {k: [r["stage_seconds"].get(k) for r in mine] for k in stages},
                "stage_cpu_seconds": {k: [r["stage_cpu_seconds"].get(k) for r in mine] for k in stages},
                "calibration_passes": [r["calibration_passes"] for r in mine],
                "load_average_1min": [r["load_average_1min"] for r in mine],
            }
            if with_recovery:
                row["heldout_ppl"] = [r["heldout_ppl"] for r in mine]
                row["recovery"] = [r["recovery"] for r in mine]
            if why := NOT_ELIGIBLE.get(f"{method}:{name}", NOT_ELIGIBLE.get(name)):
                row["not_eligible"] = why
            rows.append(row)
        today = next((r for r in rows if r["set"] == items[0][0]), None)
        for row in rows:
            row["median_calibrate_s"] = median(row["stage_seconds"]["calibrate"])
            row["median_calibrate_cpu_s"] = median(row["stage_cpu_seconds"]["calibrate"])
            row["median_total_s"] = median(row["seconds"])
            if today is None:
                continue
            row["calibrate_saved_s"] = round(today["median_calibrate_s"] - row["median_calibrate_s"], 2)
            row["calibrate_cpu_saved_s"] = round(
                today["median_calibrate_cpu_s"] - row["median_calibrate_cpu_s"], 2
            )
            row["total_saved_s"] = round(today["median_total_s"] - row["median_total_s"], 2)
            mine, theirs = row[measure]["calibrate"], today[measure]["calibrate"]
            row["saves_time"] = row is not today and max(mine) < min(theirs)
            if with_recovery:
                row["recovery_delta"] = round(min(row["recovery"]) - min(today["recovery"]), 5)
                row["within_tolerance"] = row["recovery_delta"] >= -RECOVERY_TOLERANCE
        eligible = [
            r
            for r in rows
            if r.get("saves_time") and r.get("within_tolerance", True) and "not_eligible" not in r
        ]
        best = min(eligible, key=lambda r: statistics.median(r[measure]["calibrate"]), default=None)
        out[method] = {"rows": rows, "fastest_within_tolerance": best["set"] if best else None}
    return out


def choice(summary: dict) -> dict:
    """Per method, the chosen set and what it saves, beside the defaults the project now resolves to."""
    out = {}
    for method, part in summary.items():
        row = next((r for r in part["rows"] if r["set"] == part["fastest_within_tolerance"]), None)
        keys = (
            "set",
            "changes",
            "calibrate_saved_s",
            "calibrate_cpu_saved_s",
            "total_saved_s",
            "recovery_delta",
        )
        out[method] = (
            {k: row.get(k) for k in keys}
            if row
            else {"set": None, "note": "no eligible set saves time within the tolerance: defaults unchanged"}
        )
        out[method]["project_defaults"] = project_defaults(method)
        if row:
            defaults, wanted = project_defaults(method), {**TODAY, **row["changes"]}
            out[method]["defaults_match_choice"] = all(
                defaults[k.split(".")[1]] == v for k, v in wanted.items() if k.split(".")[1] in defaults
            )
    return out


def project_defaults(method: str) -> dict[str, Any]:
    """The speed options the project's own tiny recipe resolves to now (no overrides)."""
    recipe = load_recipe(ROOT / f"recipes/tiny-llama-{method}.yaml")
    q = recipe.quantization
    awq = {"n_grid": q.n_grid, "duo_scaling": q.duo_scaling} if method == "awq" else {}
    return {**awq, **calibration_pipeline(recipe)}


# --------------------------------------------------------------------------------------------
# CPU: the reference model, with recovery.
# --------------------------------------------------------------------------------------------


def run_cpu(args: argparse.Namespace) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"  # before torch loads here; the worker inherits it (see the rule)

    sets = pick(CPU_SETS, args.sets)
    started = time.monotonic()
    results: dict[str, Any] = {
        "today": TODAY,
        "tolerance": RECOVERY_TOLERANCE,
        "repeats": args.repeats or 3,
        "machine": {
            "cpus": os.cpu_count(),
            "worker_threads": 1,
            "load_average_before": [round(x, 2) for x in os.getloadavg()],
        },
        "base_heldout_ppl": perplexity(ROOT / "models/tiny-llama"),
    }
    runs = []
    for repeat, method, name, changes in schedule(sets, results["repeats"]):
        try:
            run = on_reference(method, {**TODAY, **changes}, results["base_heldout_ppl"])
        except Exception as exc:  # recorded; the other sets still run
            run = {"error": f"{type(exc).__name__}: {str(exc)[-2000:]}"}
        run = {"method": method, "set": name, "repeat": repeat, **run}
        log(f"{method} {name} #{repeat}: {json.dumps({k: v for k, v in run.items() if k != 'placement'})}")
        runs.append(run)
    results["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    results["wall_minutes"] = round((time.monotonic() - started) / 60, 1)
    results["runs"] = runs
    write_cpu_summary(results, sets, args.out)


def write_cpu_summary(results: dict, sets: dict, out: Path) -> None:
    paragraphs = __doc__.split("\n\n")
    results.update(method="\n\n".join(paragraphs[1:3]), rule=paragraphs[3], options=OPTIONS)
    results["summary"] = summarize(results["runs"], sets, with_recovery=True, measure="stage_cpu_seconds")
    results["choice"] = choice(results["summary"])
    results["gpu"] = {
        "result": "h200_quantize_speed.json (then --gpu-recovery on CPU: the reference model's recovery)",
        "command": ".venv/bin/python benchmarks/quantize_speed.py --gpu --model-dir M --work-dir W "
        "--out OUT.json",
        "expected_duration": "about 11 minutes a repeat of the 4 AWQ sets on one H200 (resumable)",
        "sets": {m: [n for n, _ in items] for m, items in gpu_sets(results["summary"]).items()},
    }
    write_json_result(out, results)
    log(f"wrote {out}")


# --------------------------------------------------------------------------------------------
# GPU: the 8B shape, seconds only.
# --------------------------------------------------------------------------------------------


def gpu_sets(summary: dict) -> dict[str, list[tuple[str, dict]]]:
    """Per method: the GPU baseline (the CPU choice, which is what the project's defaults resolve to, or
    today where the CPU chose nothing), then the baseline with each GPU_ONLY option, then with all of them
    where there are several. Today's own options, no longer the flow's, are not re-run on the GPU."""
    sets = {}
    for method, only in GPU_ONLY.items():
        chosen = summary.get(method, {}).get("fastest_within_tolerance")
        changes = dict(next((c for n, c in CPU_SETS[method] if n == chosen), {}))
        base = chosen or "today"
        sets[method] = [(base, changes)] + [(f"{base}+{n}", {**changes, **c}) for n, c in only]
        if len(only) > 1:
            every = {k: v for _, c in only for k, v in c.items()}
            sets[method].append((f"{base}+" + "+".join(n for n, _ in only), {**changes, **every}))
    return sets


def run_gpu(args: argparse.Namespace) -> None:
    model_dir, work_dir = Path(args.model_dir).resolve(), Path(args.work_dir).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    res = Results(Path(args.out), roots=(work_dir,))
    res.data.update(device=gpu.memory_info(0), versions=versions(), today=TODAY, options=OPTIONS)
    res.data["build"] = wait_for_build(model_dir, None, 3600)
    calibration = production_calibration(work_dir, model_dir, 512)
    sets = pick(gpu_sets(json.loads(OUT.read_text())["summary"]), args.sets)
    runs = res.data.setdefault("runs", [])
    for repeat, method, name, changes in schedule(sets, args.repeats or 2):
        if any(
            r["method"] == method and r["set"] == name and r["repeat"] == repeat and "error" not in r
            for r in runs
        ):
            continue  # resumed: done before
        scratch = work_dir / "scratch"
        shutil.rmtree(scratch, ignore_errors=True)
        log(f"{method} {name} #{repeat} ...")
        try:
            run = quantize_once(gpu_recipe(method, model_dir, calibration), {**TODAY, **changes}, scratch)
            run.pop("checkpoint_dir")
        except Exception as exc:
            run = {"error": f"{type(exc).__name__}: {str(exc)[-2000:]}"}
        shutil.rmtree(scratch, ignore_errors=True)
        runs.append({"method": method, "set": name, "repeat": repeat, **run})
        log(f"{method} {name} #{repeat}: {runs[-1]}")
        res.data["summary"] = summarize(runs, sets, with_recovery=False, measure="stage_seconds")
        res.save()


def run_peak(args: argparse.Namespace) -> None:
    """``--peak``: one AWQ of the 8B shape with the recipe's own options (no option set), the model on the
    device as the flow places it on an empty GPU; its seconds and its device peak, reserved and allocated
    (what calibration beside a served base must be left: quantize/device.py beside_base), under
    ``device_peak``."""
    model_dir, work_dir = Path(args.model_dir).resolve(), Path(args.work_dir).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    res = Results(Path(args.out), roots=(work_dir,))
    res.data.update(device=gpu.memory_info(0), versions=versions())
    res.data["build"] = wait_for_build(model_dir, None, 3600)
    calibration = production_calibration(work_dir, model_dir, 512)
    scratch = work_dir / "scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    run = quantize_once(gpu_recipe("awq", model_dir, calibration), {}, scratch)
    run.pop("checkpoint_dir")
    shutil.rmtree(scratch, ignore_errors=True)
    res.data["device_peak"] = {"measured": time.strftime("%Y-%m-%dT%H:%M:%S"), "method": "awq", **run}
    log(f"device peak: {res.data['device_peak']}")
    res.save()


def run_gpu_recovery(args: argparse.Namespace) -> None:
    """``--gpu-recovery``: each GPU set of --out (a --gpu result) on the reference model, on CPU, with its
    recovery against the GPU baseline's, calibrated at production's batch size (the llama3 recipe's
    before the GPU options: 1) where a set does not set its own; then the GPU choice: the fastest set
    that saves time on the GPU and stays within RECOVERY_TOLERANCE on the reference model."""
    os.environ["OMP_NUM_THREADS"] = "1"
    res = Results(Path(args.out), roots=())
    sets = gpu_sets(json.loads(OUT.read_text())["summary"])
    base_ppl = perplexity(ROOT / "models/tiny-llama")
    rows = []
    for method, items in sets.items():
        if method not in res.data.get("summary", {}):
            continue  # not measured on the GPU
        for name, changes in items:
            overrides = {**TODAY, "calibration.batch_size": PRODUCTION_BATCH_SIZE, **changes}
            run = on_reference(method, overrides, base_ppl)
            rows.append({"method": method, "set": name, **{k: run[k] for k in ("heldout_ppl", "recovery")}})
            log(f"reference {method} {name}: {rows[-1]}")
    choice = {}
    for method, part in res.data["summary"].items():
        mine = [r for r in rows if r["method"] == method]
        for row in mine:
            row["recovery_delta"] = round(row["recovery"] - mine[0]["recovery"], 5)
            row["within_tolerance"] = row["recovery_delta"] >= -RECOVERY_TOLERANCE
        ok = {r["set"] for r in mine if r["within_tolerance"]}
        eligible = [r for r in part["rows"] if r.get("saves_time") and r["set"] in ok]
        best = min(eligible, key=lambda r: r["median_calibrate_s"], default=None)
        choice[method] = (
            {
                k: best[k]
                for k in ("set", "changes", "median_calibrate_s", "calibrate_saved_s", "total_saved_s")
            }
            if best
            else {
                "set": None,
                "note": "no set saves time on the GPU within the tolerance: defaults unchanged",
            }
        )
    res.data["calibration_tokens"] = tokens_kept(sets)
    res.data["reference_recovery"] = {
        "model": "models/tiny-llama, recipes/tiny-llama-METHOD.yaml, on CPU",
        "base_heldout_ppl": base_ppl,
        "batch_size_unless_set": PRODUCTION_BATCH_SIZE,
        "tolerance": RECOVERY_TOLERANCE,
        "rows": rows,
    }
    res.data["choice"] = choice
    res.save()
    log(f"GPU choice: {choice}")


def tokens_kept(sets: dict[str, list[tuple[str, dict]]]) -> dict[str, int]:
    """The GPU runs' calibration tokens that reach the model at each batch size of ``sets``
    (tokens_kept_in_batches)."""
    from transformers import AutoTokenizer

    tokenizer_dir = ROOT / "models/tiny-llama"  # the 8B build's tokenizer
    sizes = {c.get("calibration.batch_size", PRODUCTION_BATCH_SIZE) for i in sets.values() for _, c in i}
    with tempfile.TemporaryDirectory() as work:
        data = production_calibration(Path(work), tokenizer_dir, 512)
        # the recipe model alone: the 8B's serve settings are not checked against the tokenizer's model
        recipe = Recipe.model_validate(gpu_recipe("awq", tokenizer_dir, data))
        _, encoded = tokenize_calibration(recipe, AutoTokenizer.from_pretrained(tokenizer_dir))
    lengths = [len(x) for x in encoded["input_ids"]]
    return {f"batch_size={b}": tokens_kept_in_batches(lengths, b) for b in sorted(sizes)}


def pick(sets: dict[str, list[tuple[str, dict]]], names: str | None) -> dict[str, list[tuple[str, dict]]]:
    """The sets named in ``names`` ("awq:n_grid=10,gptq:today"; each method's first set, the one the
    others are compared with, always runs), or all; "awq:*" names every set of a method."""
    if not names:
        return sets
    wanted = {tuple(n.split(":", 1)) for n in names.split(",")}
    return {
        m: [s for i, s in enumerate(items) if i == 0 or (m, s[0]) in wanted or (m, "*") in wanted]
        for m, items in sets.items()
        if any(w[0] == m for w in wanted)
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, help="rounds of every set (default 3 on CPU, 2 with --gpu)")
    p.add_argument("--sets", help="method:set,... or method:* (the baseline always runs); default every set")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--summarize-only", action="store_true", help="recompute the summary from --out's runs")
    p.add_argument("--gpu", action="store_true", help="the 8B shape on a CUDA host (seconds only)")
    p.add_argument(
        "--peak", action="store_true", help="--gpu: one AWQ with the recipe's options, its device peak"
    )
    p.add_argument(
        "--gpu-recovery",
        action="store_true",
        help="on CPU: the reference model's recovery for each GPU set of --out, and the GPU choice",
    )
    p.add_argument("--model-dir", help="--gpu: the 8B model folder (made by benchmarks/h200.py build)")
    p.add_argument("--work-dir", help="--gpu: scratch and the calibration data")
    args = p.parse_args(argv)
    if args.gpu_recovery:
        run_gpu_recovery(args)
    elif args.summarize_only:
        write_cpu_summary(json.loads(args.out.read_text()), CPU_SETS, args.out)
    elif args.gpu:
        require_gpu("quantize_speed.py --gpu", "without --gpu it measures the reference model on this CPU")
        if not (args.model_dir and args.work_dir):
            p.error("--gpu needs --model-dir and --work-dir")
        run_peak(args) if args.peak else run_gpu(args)
    else:
        run_cpu(args)


if __name__ == "__main__":
    main()
