"""Issue 69: vLLM's host-memory KV tier (``--kv-offloading-backend native --kv-offloading-size GiB``) on the
Llama-3-8B shape, one GPU, recipes/llama3-8b-instruct-awq.yaml's serve section as written (CUDA graphs,
gpu_memory_utilization 0.90, max_model_len 8192, max_num_seqs 128, fp8 KV), served as W4A16 with random
weights (``--load-format dummy``, config.json with the compressed-tensors quantization_config): time and
memory, not accuracy. Two stages, one boot each, each under one 10-minute device call (``--dry-run`` prints
the estimate and its inputs: benchmarks/scenarios/kv-offload.yaml):

- ``on``: the production boot with the tier (serving/spec.py capacity_spec, serve.kv_offload of
  ``--tier-gib``, by default the most the host leaves beside capacity/host_tier.py's margin, whole GiB). Its
  GPU KV cache (capacity/measure.py measure_capacity) sizes the prefix-reuse workload as the flow does
  (tasks/kv_tier.py tier_plan: working_set x the GPU's tokens, capped at 90% of the tier's), run ``repeats``
  times (gates/prefix_reuse.py run_prefix_repeats, seeds ``seed + i``); then the workload without reuse
  through the same code: every prompt its own random tokens (``no_reuse_plan``), the same shape and
  concurrency. The boot's seconds and the host memory it took are recorded.
- ``off``: the same settings without the tier, the plan the first stage recorded, the same seeds: the same
  prompts.

Per workload, decide_offload (on against off, ``if_it_helps``) and a summary: prefix hit rate, TTFT p50/p99,
output tok/s (medians per side) and the decision's why. The JSON is written after every workload; a stage
recorded is skipped, one cut short runs its missing workloads; stages of two cards are never mixed.

The tier shows only where the working set exceeds the GPU cache yet stays inside 90% of the tier: on an H100
80 GB (~1.065M fp8 tokens) a ~100 GiB tier does; on an H200 (~1.95M tokens, 119 GiB) no tier a 128 GiB host
can pin does, and the driver refuses before booting (``--anyway``; ``--gpu-memory-utilization`` shrinks the
GPU cache, off the production settings, recorded so).

GPU host: ``bash scripts/gpu/host.sh launch kv-offload --stages on``, then ``--stages off``. ``--dry-run``:
any machine, no boot. ``--rehearse``: ``off`` on this CPU, the reference model's shape and recipe's CPU
settings, a small workload (vLLM's CPU backend cannot offload: ``on`` is recorded as not run on a CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script run from the checkout
from benchmarks.harness import GIB, ROOT, SHAPES, TOKENIZER, Results, add_out_option, driver_env  # noqa: E402
from benchmarks.harness import error_text, load_scenario, logger, now, out_path, require_gpu  # noqa: E402
from benchmarks.harness import shape_folder, versions  # noqa: E402

driver_env(prefect=True)  # before the product's imports; tasks/kv_tier.py imports Prefect

from benchmarks.evidence import boot_phases, evidence_lines  # noqa: E402
from quantize_serve.capacity.host_tier import HostMemory, HostTier  # noqa: E402
from quantize_serve.capacity.measure import CapacityConfig, measure_capacity, plan_for  # noqa: E402
from quantize_serve.capacity.planner import BLOCK_SIZE_CPU, BLOCK_SIZE_GPU, GPU_MEMORY_BYTES  # noqa: E402
from quantize_serve.capacity.shape import quantization_config  # noqa: E402
from quantize_serve.core.processes import process_tree  # noqa: E402
from quantize_serve.gates.prefix_reuse import PrefixFigures, PrefixPlan, decide_offload  # noqa: E402
from quantize_serve.gates.prefix_reuse import run_prefix_repeats  # noqa: E402
from quantize_serve.recipe.load import load_recipe  # noqa: E402
from quantize_serve.recipe.model import PrefixWorkload, Recipe  # noqa: E402
from quantize_serve.serving import gpu  # noqa: E402
from quantize_serve.serving.boot import Boot  # noqa: E402
from quantize_serve.serving.server import ServerSpec, vllm_server  # noqa: E402
from quantize_serve.serving.spec import capacity_spec  # noqa: E402
from quantize_serve.serving.vllm_log import read_log  # noqa: E402
from quantize_serve.validate.preflight import CPU_OFFLOAD_REFUSAL, ValidatedRecipe, check_host_tier  # noqa: E402
from tasks.kv_tier import tier_plan  # noqa: E402

SCENARIO = load_scenario("kv-offload")
RECIPE, REHEARSE_RECIPE = ROOT / SCENARIO["recipe"], ROOT / SCENARIO["rehearse_recipe"]
SERVE, REHEARSE_SERVE = SCENARIO["serve"], SCENARIO["rehearse_serve"]
BENCH, REHEARSE_BENCH, EST = SCENARIO["bench"], SCENARIO["rehearse_bench"], SCENARIO["estimate_s"]
STAGES, WORKLOADS = ("on", "off"), ("prefix", "no_reuse")
DONE, NOT_ON_CPU = "done", "not on CPU"
WEIGHTS_NOTE = "random weights (vLLM --load-format dummy): time and memory, not accuracy"
CPU_NOTE = (
    f"vLLM's CPU backend cannot offload (vLLM: '{CPU_OFFLOAD_REFUSAL}'; its KV cache already lives in host "
    "memory): the tier-on stage runs on a GPU only"
)
NOTES = [
    "prefix hit rate: GPU and tier prefix-cache hits per prompt token looked up (vllm:prefix_cache_* and "
    "vllm:external_prefix_cache_*, deltas over each run); tier hit rate: its hits per GPU miss it looked up",
    "the tier is write-through: it holds copies of the GPU's blocks, so the two hold max(GPU, tier) distinct "
    "tokens (host_tier.distinct_tokens_beyond_gpu)",
    "no-reuse workload: prefix_repetition with one prompt per prefix, not vLLM's random dataset (it repeats "
    "prompts with the reference tokenizer's 1,024 ids: kv_offload.py no_reuse_plan)",
]
# vLLM's log lines about the tier: the connector, its spec, the cross-layer KV layout it asks for
TIER_LOG_KEYS = ("ffload", "onnector", "cross layer", "KV cache size", "Maximum concurrency")
log = logger("kv-offload")


# Settings (pure)


def parse_stages(text: str) -> list[str]:
    stages = [s.strip() for s in text.split(",") if s.strip()]
    if not stages or any(s not in STAGES for s in stages):
        raise SystemExit(f"--stages {text!r}: choose from {', '.join(STAGES)} (comma-separated)")
    return list(dict.fromkeys(stages))


def workload_of(bench: dict[str, int], args: argparse.Namespace) -> PrefixWorkload:
    """The scenario's workload (``bench``: working_set in % of the GPU's KV tokens) with the options given."""
    keys = ("working_set", "prefix_len", "suffix_len", "output_len", "prompts_per_prefix", "repeats")
    given = {k: v for k in (*keys, "concurrency") if (v := getattr(args, k)) is not None}
    fields = {k: v for k, v in bench.items() if k in PrefixWorkload.model_fields}
    return PrefixWorkload(**fields | {"working_set": bench["working_set_pct"] / 100} | given)


def default_tier_gib(memory: HostMemory, share: float | None) -> tuple[int, str]:
    """The tier's size in whole GiB and how it was found: ``share`` of the available memory where given, else
    the most the host leaves beside the margin capacity/host_tier.py keeps free (HostMemory.room_bytes, within
    a cgroup's limit); never above that room."""
    room, margin = memory.room_bytes, memory.margin_bytes / GIB
    how = f"room: {memory.available_bytes / GIB:.1f} GiB available less the {margin:.1f} GiB margin"
    if memory.cgroup_limit_bytes is not None:
        how += f" (within the cgroup's {memory.cgroup_limit_bytes / GIB:.1f} GiB limit)"
    if share is not None:
        if (wanted := int(share * memory.available_bytes // GIB)) <= room // GIB:
            return wanted, f"--tier-share {share:g} of {memory.available_bytes / GIB:.1f} GiB available"
        how = f"--tier-share {share:g} capped at the {how}"
    return int(room // GIB), how


def recipe_overrides(rehearse: bool, tier_gib: float, workload: PrefixWorkload, util: float | None) -> dict:
    """Both stages' recipe overrides: the scenario's, the tier with its workload, and a GPU memory utilization
    where one was given (not the production setting)."""
    overrides = dict(REHEARSE_SERVE if rehearse else SERVE)
    if util is not None:
        overrides["serve.gpu_memory_utilization"] = util
    tier = {
        "backend": "native",
        "size_gib": tier_gib,
        "ship": "if_it_helps",
        "workload": workload.model_dump(),
    }
    return overrides | {"serve.kv_offload": tier}


def recipe_of(rehearse: bool, overrides: dict) -> Recipe:
    return load_recipe(REHEARSE_RECIPE if rehearse else RECIPE, overrides)


def planned_weights(recipe: Recipe, config: dict) -> int | None:
    """Under a fixed budget (CPU), the weights' bytes the budget is split with (no checkpoint: the planner's,
    as capacity/shape.py measure_shape takes them); None on a GPU, where vLLM profiles them."""
    if recipe.serve.memory_budget is None:
        return None
    return plan_for(recipe, config, Boot.PRODUCTION, block_size=BLOCK_SIZE_CPU).weights_bytes


def boot_spec(recipe: Recipe, folder: Path, config: dict, *, tier: bool) -> ServerSpec:
    """The production boot of ``folder`` (dummy weights), with the recipe's tier or without it."""
    spec = capacity_spec(
        recipe, Boot.PRODUCTION, folder, weights_bytes=planned_weights(recipe, config), kv_tier=tier
    )
    return spec.model_copy(update={"load_format": "dummy"})


def predicted_capacity(recipe: Recipe, config: dict, device_bytes: int | None) -> CapacityConfig:
    """The production boot's capacity as the planner predicts it (a dry run, the check before a boot)."""
    block = BLOCK_SIZE_CPU if recipe.serve.memory_budget is not None else BLOCK_SIZE_GPU
    p = plan_for(recipe, config, Boot.PRODUCTION, block_size=block, device_memory_bytes=device_bytes)
    figures = ("weights_bytes", "kv_cache_tokens", "num_blocks", "max_model_len", "max_concurrency")
    return CapacityConfig(
        **{k: max(0, getattr(p, k)) for k in figures},
        name=Boot.PRODUCTION,
        tensor_parallel_size=p.tensor_parallel_size,
        kv_cache_dtype=p.kv_cache_dtype,
        kv_cache_memory_bytes=max(0, p.kv_cache_memory_bytes),
        block_size=block,
        boot_seconds=0.0,
        derived="predicted by the planner (no boot)",
    )


def plan_of(recipe: Recipe, folder: Path, capacity: CapacityConfig) -> tuple[PrefixPlan, HostTier | None]:
    """The prefix-reuse plan as the flow makes it (tasks/kv_tier.py tier_plan) from a boot's capacity, and
    the tier by vLLM's block arithmetic."""
    src = "benchmarks/kv_offload.py"
    validated = ValidatedRecipe(recipe=recipe, source=src, recipe_sha256="-", calibration_fingerprint="-")
    return tier_plan(validated, str(folder), capacity)


def no_reuse_plan(plan: PrefixPlan, prompts: int) -> PrefixPlan:
    """The workload without reuse: vLLM's prefix_repetition dataset with one prompt per prefix, so each prompt
    is its own prefix_len + suffix_len uniformly random tokens (the prefix run's prompts but for the reuse),
    output_len out, at the plan's concurrency. Not vLLM's random dataset: with the reference tokenizer's
    1,024 ids it draws each prompt as consecutive ids from one of ~1,021 starting points, and 210 of 512
    prompts of 2,176 tokens shared their first 256 tokens with another (vLLM 0.32's dataset code, seed 1000;
    0.26 draws alike)."""
    in_flight = min(plan.concurrency, prompts)
    why = (
        f"{prompts:,} prompts of {plan.prefix_len + plan.suffix_len:,} random tokens, each its own "
        f"(prefix_repetition with one prompt per prefix: no prefix shared between requests), "
        f"{plan.output_len:,} output tokens each, {in_flight} in flight"
    )
    update = dict(num_prefixes=prompts, prompts=prompts, concurrency=in_flight, why=why)
    return plan.model_copy(update=update | {"working_set_tokens": prompts * plan.prefix_len})


def no_reuse_prompts(plan: PrefixPlan, given: int | None, per_slot: int) -> int:
    """``given``, else ``per_slot`` x the plan's concurrency, at most its prompts."""
    return given if given else min(plan.prompts, per_slot * plan.concurrency)


# The estimate (pure)


def estimate_inputs(rehearse: bool) -> dict[str, float]:
    keys = ("boot_s", "prefill_tokens_per_s", "decode_tokens_per_s", "bench_start_s")
    out = {k: EST[k] for k in (*keys, "tier_pin_s_per_gib", "stop_s", "stage_target_s")}
    return out | ({k: EST[f"rehearse_{k}"] for k in keys} if rehearse else {})


def run_seconds(plan: PrefixPlan, est: dict[str, float]) -> float:
    """One run: every prompt token computed (no hit: an upper bound), the outputs, the bench's start."""
    prompt = plan.prompts * (plan.prefix_len + plan.suffix_len) / est["prefill_tokens_per_s"]
    return prompt + plan.prompts * plan.output_len / est["decode_tokens_per_s"] + est["bench_start_s"]


def stage_estimate(
    stage: str, plan: PrefixPlan, rplan: PrefixPlan, repeats: int, tier_gib: float, est: dict[str, float]
) -> dict[str, Any]:
    parts = {
        "boot_s": est["boot_s"],
        "tier_pin_s": tier_gib * est["tier_pin_s_per_gib"] if stage == "on" else 0.0,
        "prefix_runs_s": repeats * run_seconds(plan, est),
        "no_reuse_runs_s": repeats * run_seconds(rplan, est),
        "stop_s": est["stop_s"],
    }
    total = sum(parts.values())
    return {k: round(v) for k, v in parts.items()} | {
        "total_s": round(total),
        "within_target": total <= est["stage_target_s"],
    }


# Figures and the summary (pure)

RATES = ("prefix_hit_rate", "gpu_hit_rate", "tier_hit_rate")  # PrefixFigures' properties


def figures_record(f: PrefixFigures) -> dict[str, Any]:
    """One run as the JSON keeps it: its figures and its hit rates."""
    return f.model_dump() | {k: None if (v := getattr(f, k)) is None else round(v, 4) for k in RATES}


def runs_of(data: dict, stage: str, workload: str) -> list[PrefixFigures]:
    w = ((data.get("stages") or {}).get(stage) or {}).get("workloads", {}).get(workload) or {}
    return [PrefixFigures.model_validate(r) for r in w.get("runs", [])] if w.get("status") == DONE else []


def side_summary(runs: list[PrefixFigures]) -> dict[str, Any]:
    """One side's runs of one workload: each figure's median over the repeats, and each run's."""
    keys = {k: k for k in (*RATES, "ttft_p50_ms", "ttft_p99_ms")} | {"output_tok_s": "output_throughput"}
    values = {k: [getattr(f, attr) for f in runs] for k, attr in keys.items()}
    out: dict[str, Any] = {
        k: None if None in v else round(statistics.median(v), 4) for k, v in values.items()
    }
    loaded = [f.kv_offload_load_bytes for f in runs if f.kv_offload_load_bytes is not None]
    return out | {
        "runs": {k: [None if x is None else round(x, 4) for x in v] for k, v in values.items()},
        "preemptions_max": max(f.preemptions or 0 for f in runs),
        "failed": sum(f.failed for f in runs),
        "peak_kv_cache_usage_max": max(f.peak_kv_cache_usage or 0 for f in runs),
        "tier_load_gib_median": round(statistics.median(loaded) / GIB, 2) if loaded else None,
    }


def summarize(data: dict) -> dict[str, Any]:
    """Per workload: each side's medians and, with both sides, decide_offload's verdict and why."""
    plan = PrefixPlan.model_validate(data["plan"]) if data.get("plan") else None
    stages = data.get("stages") or {}
    out: dict[str, Any] = {}
    for workload in WORKLOADS:
        on, off = runs_of(data, "on", workload), runs_of(data, "off", workload)
        entry: dict[str, Any] = {"off": side_summary(off) if off else None}
        entry["on"] = side_summary(on) if on else None
        if on and off:
            decision = decide_offload(on, off, "if_it_helps", plan=plan if workload == "prefix" else None)
            entry |= {"helped": decision.helped, "why": decision.why}
            if workload == "prefix":
                entry["report"] = decision.markdown()
        else:
            cpu = (stages.get("on") or {}).get("status") == NOT_ON_CPU
            entry["why"] = (
                CPU_NOTE if cpu else f"no decision: the {'off' if on else 'on'} stage is not recorded"
            )
        out[workload] = entry
    drops = [((stages.get(s) or {}).get("host_memory") or {}).get("available_drop_gib") for s in STAGES]
    if None not in drops:
        out["host_memory_the_tier_took_gib"] = round(drops[0] - drops[1], 2)
    return out | {"boot_seconds": {s: (stages.get(s) or {}).get("boot_seconds") for s in STAGES}}


def describe(label: str, s: dict[str, Any] | None) -> str:
    """One side's medians on one line."""
    if not s:
        return f"{label}: -"
    hit = "-" if s["prefix_hit_rate"] is None else f"{s['prefix_hit_rate']:.3f}"
    tier = "" if s["tier_hit_rate"] is None else f" (tier {s['tier_hit_rate']:.2f})"
    return (
        f"{label}: hit rate {hit}{tier}, TTFT p50 {s['ttft_p50_ms']:,.1f} ms p99 {s['ttft_p99_ms']:,.1f} ms, "
        f"output {s['output_tok_s']:,.1f} tok/s, failed {s['failed']}, preemptions {s['preemptions_max']}"
    )


def git(*a: str) -> str:
    try:
        done = subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def commit_info(given: str | None) -> dict[str, Any]:
    """``--commit`` (the device's copy may have no .git), else git's HEAD; whether tracked files changed."""
    head = given or git("rev-parse", "HEAD")
    dirty = None if given or not head else bool(git("status", "--porcelain", "--untracked-files=no"))
    return {"commit": head or "unknown", "tree_dirty": dirty}


def card() -> dict[str, Any] | None:
    """The GPU as NVML names it (gpu_smoke.py records it so too); None: no NVIDIA GPU here."""
    info = gpu.memory_info()
    return info and {
        "devices": gpu.describe_devices(),
        **info,
        "compute_capability": gpu.compute_capability(),
    }


def host_memory_record(available_before: int, pid: int, tier: HostTier | None) -> dict[str, Any]:
    """What the booted server holds of the host's memory: MemAvailable's drop since before the boot, and its
    process tree's resident set (the tier, pinned and zero-filled at vLLM's start, is resident)."""
    available = HostMemory.read().available_bytes
    try:
        rss = sum(p.memory_info().rss for p in process_tree(pid))
    except Exception:  # a process gone between the listing and the read
        rss = 0
    return {
        "available_before_gib": round(available_before / GIB, 2),
        "available_after_boot_gib": round(available / GIB, 2),
        "available_drop_gib": round((available_before - available) / GIB, 2),
        "server_tree_rss_gib": round(rss / GIB, 2),
        "tier_pinned_planned_gib": None if tier is None else round(tier.pinned_bytes / GIB, 2),
    }


# The run


class Run:
    """One invocation's settings, resolved against the result it adds to."""

    def __init__(self, args: argparse.Namespace, res: Results) -> None:
        self.args, self.res, self.rehearse, self.work = args, res, args.rehearse, args.work
        self.config_path = SHAPES["tiny-llama" if self.rehearse else SCENARIO["shape"]]
        self.config = json.loads(self.config_path.read_text())
        self.device = gpu.usable_memory_bytes()
        self.assumed_host = self.device is None and not self.rehearse  # a dry run away from the GPU host
        if self.assumed_host:
            gib = {k: int(EST[f"host_{k}_gib"] * GIB) for k in ("available", "total")}
            self.memory = HostMemory(available_bytes=gib["available"], total_bytes=gib["total"])
        else:
            self.memory = HostMemory.read()
        self.recorded = res.data.get("settings") if res.data.get("stages") else None
        if args.tier_gib is not None:
            self.tier_gib, self.tier_from = args.tier_gib, "--tier-gib"
        elif self.recorded:  # the size the recorded stage ran with
            self.tier_gib, self.tier_from = self.recorded["tier_gib"], self.recorded["tier_gib_from"]
        else:
            self.tier_gib, self.tier_from = default_tier_gib(self.memory, args.tier_share)
        bench = REHEARSE_BENCH if self.rehearse else BENCH
        self.workload, self.per_slot = workload_of(bench, args), bench["no_reuse_prompts_per_slot"]
        self.seed = args.seed if args.seed is not None else bench["seed"]
        self.run_timeout_s = float(bench["run_timeout_s"])
        self.overrides = recipe_overrides(
            self.rehearse, self.tier_gib, self.workload, args.gpu_memory_utilization
        )
        self.recipe = recipe_of(self.rehearse, self.overrides)
        self.est = estimate_inputs(self.rehearse)
        self._plan_folder: Path | None = None

    def settings(self) -> dict[str, Any]:
        r, util = self.recipe, self.args.gpu_memory_utilization
        return {
            "recipe": str((REHEARSE_RECIPE if self.rehearse else RECIPE).relative_to(ROOT)),
            "overrides": {k: v for k, v in self.overrides.items() if k != "serve.kv_offload"},
            "config": str(self.config_path.relative_to(ROOT)),
            "serve": r.serve.model_dump(mode="json", exclude={"kv_offload"}),
            "quantization": {"scheme": r.quantization.scheme, "group_size": r.quantization.group_size},
            "load_format": "dummy",
            "production_settings": util is None,
            "note": None if util is None else f"--gpu-memory-utilization {util}: not the production setting",
            "tier_gib": self.tier_gib,
            "tier_gib_from": self.tier_from,
            "workload": self.workload.model_dump(),
            "no_reuse_prompts": self.args.no_reuse_prompts,
            "no_reuse_prompts_per_slot": self.per_slot,
            "seed": self.seed,
            "run_timeout_s": self.run_timeout_s,
        }

    def check_against_recorded(self) -> None:
        """A result that holds stages is added to only with the settings it was measured with."""
        keys = ("recipe", "overrides", "serve", "tier_gib", "workload", "no_reuse_prompts", "seed")
        mine = self.settings()
        differ = [k for k in keys if self.recorded and mine.get(k) != self.recorded.get(k)]
        if differ:
            recorded = ", ".join(f"{k}={self.recorded.get(k)!r}" for k in differ)
            raise SystemExit(
                f"kv_offload.py: {self.res.path} holds stages of other settings: {recorded}; --fresh"
            )

    def folder(self, name: str = "model") -> Path:
        q = quantization_config(self.recipe.quantization)
        return shape_folder(
            self.config_path, self.work / name, tokenizer_dir=TOKENIZER, quantization_config=q
        )

    def predicted_plans(
        self, recipe: Recipe | None = None
    ) -> tuple[PrefixPlan, HostTier | None, CapacityConfig]:
        device = None if self.rehearse else self.device or int(GPU_MEMORY_BYTES[self.args.card])
        capacity = predicted_capacity(recipe or self.recipe, self.config, device)
        self._plan_folder = self._plan_folder or self.folder("plan-model")  # the config.json tier_plan reads
        return *plan_of(recipe or self.recipe, self._plan_folder, capacity), capacity

    def recorded_plan(self) -> PrefixPlan | None:
        return PrefixPlan.model_validate(self.res.data["plan"]) if self.res.data.get("plan") else None

    def no_reuse_plan(self, plan: PrefixPlan) -> PrefixPlan:
        if self.res.data.get("no_reuse_plan"):
            return PrefixPlan.model_validate(self.res.data["no_reuse_plan"])
        return no_reuse_plan(plan, no_reuse_prompts(plan, self.args.no_reuse_prompts, self.per_slot))

    def suggest_utilization(self) -> float | None:
        """The largest gpu_memory_utilization (0.01 steps, down to 0.30) whose planned GPU cache lets the
        working set fit 90% of this tier (the plan then not capped); None where none does."""
        for pct in range(round(self.recipe.serve.gpu_memory_utilization * 100) - 1, 29, -1):
            recipe = recipe_of(self.rehearse, self.overrides | {"serve.gpu_memory_utilization": pct / 100})
            try:
                plan, _, capacity = self.predicted_plans(recipe)
            except ValueError:  # no KV cache left at this utilization, nor lower
                return None
            if (
                plan.shows_tier
                and plan.working_set_tokens >= self.workload.working_set * capacity.kv_cache_tokens
            ):
                return pct / 100
        return None


def cannot_show(plan: PrefixPlan, run: Run) -> str:
    fix = "an H100 80 GB host (its ~1.065M fp8 KV tokens are ~65 GiB), or --anyway to measure it all the same"
    if (u := run.suggest_utilization()) is not None:
        fix += f", or --gpu-memory-utilization {u:.2f} (not the production setting; recorded so)"
    return f"the workload cannot show the tier here: {plan.why}. Fix: {fix}"


def run_stage(stage: str, run: Run, folder: Path) -> bool:
    """One stage: a boot, the plan (recorded once), the workloads not yet recorded; saved after each."""
    res, data = run.res, run.res.data
    record = data.setdefault("stages", {}).setdefault(stage, {})
    done = {w for w, r in record.setdefault("workloads", {}).items() if (r or {}).get("status") == DONE}
    pending = [w for w in WORKLOADS if w not in done]
    tier = stage == "on"
    spec = boot_spec(run.recipe, folder, run.config, tier=tier)
    kv_offload = None if spec.kv_offload is None else spec.kv_offload.vllm_config()
    record.update(
        status="running", tier=tier, started=now(), finished=None, error=None, kv_offload=kv_offload
    )
    record.update(command=spec.serve_command(), workloads_run_this_session=pending)
    res.save()
    log(f"stage {stage}: {spec.serve_command()}")
    t0, log_path = time.monotonic(), run.work / f"vllm-{stage}.log"
    before = HostMemory.read().available_bytes
    try:
        if tier and not run.rehearse:
            check_host_tier(run.recipe, source="benchmarks/kv_offload.py")
        with vllm_server(spec, log_path=log_path) as server:
            capacity = measure_capacity(server, spec, name=Boot.PRODUCTION)
            if (weights := planned_weights(run.recipe, run.config)) is not None:
                capacity = capacity.model_copy(update={"weights_bytes": weights})
            mine, host_tier = plan_of(run.recipe, folder, capacity)
            record["capacity"] = capacity.model_dump(mode="json", exclude={"held"})
            record["boot_seconds"] = server.boot_seconds
            record["host_memory"] = host_memory_record(before, server.pid, host_tier if tier else None)
            log(f"stage {stage}: booted in {server.boot_seconds} s, {capacity.kv_cache_tokens:,} KV tokens")
            log(f"stage {stage}: host memory {record['host_memory']}")
            if (plan := run.recorded_plan()) is None:
                plan = mine
                data.update(plan=plan.model_dump(), plan_from_stage=stage, no_reuse_plan=None)
                data["host_tier"] = None if host_tier is None else host_tier.model_dump()
                data["no_reuse_plan"] = run.no_reuse_plan(plan).model_dump()
                log(f"stage {stage}: plan: {plan.why}")
            elif mine.model_dump() != plan.model_dump():
                record["own_plan_differs"] = f"this boot would plan {mine.why}; the recorded plan runs"
                log(f"stage {stage}: {record['own_plan_differs']}")
            rplan = run.no_reuse_plan(plan)
            repeats = run.workload.repeats
            record["estimated_seconds"] = stage_estimate(stage, plan, rplan, repeats, run.tier_gib, run.est)
            res.save()
            if not plan.shows_tier and not run.rehearse and not run.args.anyway:
                raise RuntimeError(cannot_show(plan, run))
            for workload in pending:
                w0 = time.monotonic()
                log(f"stage {stage}: {workload} workload, {run.workload.repeats} runs")
                runs = run_prefix_repeats(
                    server,
                    plan if workload == "prefix" else rplan,
                    run.workload.repeats,
                    tokenizer_dir=str(folder),
                    output_dir=run.work / stage / workload,
                    seed=run.seed,
                    timeout_s=run.run_timeout_s,
                )
                kept = {"runs": [figures_record(f) for f in runs], "seconds": round(time.monotonic() - w0, 1)}
                record["workloads"][workload] = {"status": DONE, **kept}
                res.save()
                log(f"stage {stage}: {describe(workload, side_summary(runs))}")
        text = read_log(log_path)
        record.update(
            status=DONE, vllm_phases=boot_phases(text), vllm_lines=evidence_lines(text, TIER_LOG_KEYS)
        )
    except Exception as exc:  # recorded (a refused tier, a failed boot or run); the next stage still runs
        record.update(status="error", error=error_text(exc))
        if log_path.is_file():
            record["vllm_lines"] = evidence_lines(read_log(log_path), TIER_LOG_KEYS)
        log(f"stage {stage}: failed: {(str(exc).splitlines() or [type(exc).__name__])[0]}")
    record.update(finished=now(), seconds=round(time.monotonic() - t0, 1), vllm_log=str(log_path))
    data["summary"] = summarize(data)
    res.save()
    return record["status"] == DONE


def dry_run(run: Run, stages: list[str]) -> int:
    assumed = f"the planner's {run.args.card} and an assumed host ({EST['host_available_gib']:g} GiB free)"
    where = assumed if run.assumed_host else "this CPU's budget" if run.rehearse else "this host"
    log(f"dry run: planned for {where}; nothing boots")
    if (plan := run.recorded_plan()) is None:
        plan, tier, capacity = run.predicted_plans()
        log(f"GPU KV cache (planner): {capacity.kv_cache_tokens:,} tokens")
    else:
        tier = HostTier.model_validate(run.res.data["host_tier"]) if run.res.data.get("host_tier") else None
        log(f"plan recorded by stage {run.res.data.get('plan_from_stage')}")
    rplan, s = run.no_reuse_plan(plan), run.settings()
    log(f"settings: {s['recipe']} serve {s['serve']}; overrides {s['overrides']}; {s['load_format']} weights")
    log(f"tier: {run.tier_gib} GiB ({run.tier_from})")
    for line in tier.lines("the boot") if tier else []:
        log(line)
    log(f"prefix workload: {plan.why}")
    log(f"no-reuse workload: {rplan.why}")
    if not plan.shows_tier and not run.rehearse:
        log(f"warning: {cannot_show(plan, run)}")
    total = 0
    for stage in stages:
        if run.rehearse and stage == "on":
            log(f"stage on: {NOT_ON_CPU}: {CPU_NOTE}")
            continue
        e = stage_estimate(stage, plan, rplan, run.workload.repeats, run.tier_gib, run.est)
        total += e["total_s"]
        over = "" if e["within_target"] else f" (over the {run.est['stage_target_s']:g} s target)"
        log(f"stage {stage}: ~{e['total_s']} s{over}: {e}")
    log(f"estimated device seconds: {total} (~{total / 60:.1f} min); inputs {run.est} (upper bound: no hits)")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_out_option(p, "capacity/kv_offload.json", "capacity/kv_offload_rehearsal.json")
    options = [  # (flag, type or "flag", help)
        ("--work", Path, "model folder, logs, benches (default: qs-kv-offload in the temporary folder)"),
        ("--stages", str, "comma-separated, in order: on, off (default on,off)"),
        ("--tier-gib", float, "the tier's size (default: the most this host leaves, whole GiB)"),
        ("--tier-share", float, "size the tier as this share of the available host memory instead"),
        ("--working-set", float, "distinct prefix tokens, x the GPU's KV tokens"),
        ("--repeats", int, "runs of each workload on each side (2-5)"),
        ("--concurrency", int, "requests in flight (default serve.max_num_seqs)"),
        ("--no-reuse-prompts", int, "the no-reuse runs' prompts (default: per slot x concurrency)"),
        ("--seed", int, "run i of each workload sends the prompts of seed + i, on both sides"),
        ("--gpu-memory-utilization", float, "shrink the GPU cache (not the production setting; recorded)"),
        ("--commit", str, "the commit measured (the device's copy may have no .git)"),
        ("--anyway", "flag", "run where the plan cannot show the tier"),
        ("--fresh", "flag", "start --out afresh instead of adding to it"),
        ("--dry-run", "flag", "the stages, settings, plan and estimate; no boot"),
        ("--rehearse", "flag", "CPU: the reference model's shape, the off stage only"),
    ]
    for flag, kind, text in options:
        p.add_argument(flag, help=text, **({"action": "store_true"} if kind == "flag" else {"type": kind}))
    for flag in ("--prefix-len", "--suffix-len", "--output-len", "--prompts-per-prefix"):
        p.add_argument(flag, type=int)
    p.add_argument("--card", default="h100-80gb", choices=sorted(GPU_MEMORY_BYTES), help="--dry-run's card")
    p.set_defaults(work=Path(tempfile.gettempdir()) / "qs-kv-offload", stages="on,off")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    stages = parse_stages(args.stages)
    if not args.dry_run:
        on_cpu = "--rehearse runs its off stage on this CPU, --dry-run plans"
        require_gpu("kv_offload.py", on_cpu, rehearsing=args.rehearse, serves=("W4A16", "auto"))
    out = out_path(args)
    if args.fresh and out.is_file() and not args.dry_run:
        out.unlink()
    res = Results(out, roots=(args.work,))
    run = Run(args, res)
    run.check_against_recorded()
    this_card = (card() or {}).get("name") or "CPU (rehearsal)"
    if (recorded := res.data.get("card_name")) not in (None, this_card) and res.data.get("stages"):
        raise SystemExit(
            f"kv_offload.py: {out} holds stages measured on {recorded}; this host has {this_card}: the two "
            "sides must share a card (--fresh to start over here)"
        )
    if args.dry_run:
        return dry_run(run, stages)
    recorded_stages = res.data.get("stages") or {}
    done_already = {s for s, r in recorded_stages.items() if r.get("status") in (DONE, NOT_ON_CPU)}
    todo = [s for s in stages if s not in done_already]
    host = {"hostname": socket.gethostname(), "cpus": os.cpu_count(), "memory": run.memory.model_dump()}
    host |= {
        f"memory_{k}_gib": round(getattr(run.memory, f"{k}_bytes") / GIB, 1) for k in ("total", "available")
    }
    res.data.update(benchmark="kv_offload", question=SCENARIO["question"], weights=WEIGHTS_NOTE, notes=NOTES)
    res.data.update(
        rehearsal=args.rehearse, card=card(), card_name=this_card, host=host, settings=run.settings()
    )
    session = {"started": now(), "stages_asked": stages, "stages_run": todo, **commit_info(args.commit)}
    session |= {"versions": versions(), "estimate_inputs": run.est}
    res.data.setdefault("sessions", []).append(session)
    res.save()
    log(
        f"stages {stages}; recorded: {sorted(done_already) or 'none'}; tier {run.tier_gib} GiB "
        f"({run.tier_from})"
    )
    if not args.rehearse and not args.anyway and res.data.get("plan") is None:
        plan, *_ = run.predicted_plans()
        if not plan.shows_tier:  # before any boot: the planner's GPU cache against the tier
            res.data["refused"] = cannot_show(plan, run)
            res.save()
            print(f"kv_offload.py: {res.data['refused']}", file=sys.stderr, flush=True)
            return 3
    folder, failed = run.folder(), 0
    for stage in todo:
        if args.rehearse and stage == "on":
            log(f"stage on: {NOT_ON_CPU}: {CPU_NOTE}")
            res.data.setdefault("stages", {})["on"] = {"status": NOT_ON_CPU, "why": CPU_NOTE}
            continue
        failed += not run_stage(stage, run, folder)
    session.update(finished=now(), failed_stages=failed)
    res.data["summary"] = summarize(res.data)
    res.save()
    for workload in WORKLOADS:
        entry = res.data["summary"][workload]
        log(f"{workload}: {describe('off', entry['off'])}; {describe('on', entry['on'])}; {entry['why']}")
    log(f"written to {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
