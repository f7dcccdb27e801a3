"""Capacity stage: how much memory quantization freed and how much larger a batch now fits.

Three configurations under the same memory budget: (a) base model, 16-bit KV; (b) quantized,
16-bit KV; (c) quantized, fp8 KV. Each boot's capacity is read from vLLM itself: the labels of
``vllm:cache_config_info`` on ``/metrics``.

Two ways to hold the budget equal:
- GPU (``serve.memory_budget`` unset): vLLM's own accounting. Every boot gets
  ``gpu_memory_utilization`` x device memory; vLLM profiles weights and activations and gives
  the rest to the KV cache. Weight memory is what vLLM logs as "Model loading took X GiB".
- fixed budget (``serve.memory_budget`` set; what CPU runs use): the budget is the device
  memory the configurations share; each boot gets ``--kv-cache-memory-bytes`` = budget minus its
  weights, where weights = the tensor bytes in the checkpoint's safetensors files (exactly what
  vLLM loads: packed int4 + scales + zero points for W4A16, bf16 for the base). This is how
  freed weight memory shows up as KV memory on a GPU, without the CPU allocator's noise (the
  automatic CPU mode reads a node total that moves between boots on a shared machine).

Where the host's vLLM has no fp8 KV cache (a CPU without AVX-512: serving/host.py), a run serves
its production boot with a 16-bit KV cache (serve.kv_cache_dtype auto); the table then shows the
fp8-KV row as not available on this CPU, with the reason, instead of a measurement.

Every row says what it is (``CapacityConfig.source``) and what the boot it rests on held in vLLM's own
figures (``BootHeld``: its log's "KV cache size" line): measured (this run's boot of that configuration);
derived (the base served at a lower gpu_memory_utilization beside calibration, at_utilization; row (b)
from the production boot, with_sixteen_bit_kv); reused (an earlier run's row: report/base_reference.py).
"""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel, computed_field

from quantize_serve.capacity import planner
from quantize_serve.capacity.held import BootHeld, said, vllm_said
from quantize_serve.capacity.plan_table import ModelSummary
from quantize_serve.core.errors import GateError
from quantize_serve.core.model_files import GIB
from quantize_serve.recipe.model import Recipe
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.metrics import read_labels
from quantize_serve.serving.server import RunningServer, ServerSpec
from quantize_serve.serving.spec import capacity_spec, checkpoint_tensor_bytes
from quantize_serve.serving.vllm_log import AVAILABLE_KV, MODEL_LOADING

METHOD_FIXED = (
    "fixed budget: every configuration shares serve.memory_budget; each boot gets "
    "--kv-cache-memory-bytes = budget - weights, weights = tensor bytes of the checkpoint's "
    "safetensors files (what vLLM loads). KV figures are vLLM's own (vllm:cache_config_info)."
)
METHOD_GPU = (
    "device accounting: every boot gets gpu_memory_utilization x device memory; vLLM profiles "
    'weights ("Model loading took") and activations and gives the rest to the KV cache. KV '
    "figures are vLLM's own (vllm:cache_config_info)."
)
FP8_UNAVAILABLE = "not available on this CPU"


class CapacityConfig(BaseModel):
    name: Boot
    tensor_parallel_size: int = 1  # the base may boot at a larger TP than the recipe's (BaseBoot)
    kv_cache_dtype: str
    weights_bytes: int
    kv_cache_memory_bytes: int
    kv_cache_tokens: int
    num_blocks: int
    block_size: int
    max_model_len: int
    max_concurrency: float
    boot_seconds: float
    # How a row not measured at the recipe's settings was derived from one that was (at_utilization,
    # with_sixteen_bit_kv), beginning with what it was derived from
    derived: str | None = None
    # What the boot the row rests on held (None: a row recorded before it was kept)
    held: BootHeld | None = None
    reused_from: str | None = None  # the earlier run whose row this is (report/base_reference.py)

    @computed_field
    @property
    def source(self) -> str:
        """measured, derived, or reused (from an earlier run)."""
        return "reused" if self.reused_from else "derived" if self.derived else "measured"

    def provenance(self) -> str:
        """What the row is, in one line: measured with what its boot held, derived from what, reused
        from which run."""
        own = (
            self.derived
            if self.derived
            else f"measured: its boot held {self.held.describe()}"
            if self.held
            else "measured"
        )
        return f"reused from run {self.reused_from}: {own}" if self.reused_from else own

    def figure(self) -> str:
        """The row as a person reads it on one line (the run's stage lines): its figures, and what it is
        (a derived row's first clause: what it was derived from)."""
        what = (
            self.derived.split("; ")[0]
            if self.derived
            else f'measured (vLLM: "{self.held.vllm_said}")'
            if self.held and self.held.vllm_said
            else "measured"
        )
        reused = f"reused from run {self.reused_from}, " if self.reused_from else ""
        return (
            f"{self.kv_cache_tokens:,} KV tokens ({self.kv_cache_dtype}), max concurrency "
            f"{self.max_concurrency:.1f} at {self.max_model_len} tokens: {reused}{what}"
        )


class PlannerCheck(BaseModel):
    name: Boot
    predicted_kv_tokens: int
    measured_kv_tokens: int
    error_pct: float


class CapacityReport(BaseModel):
    method: str
    base_boot: str | None = None  # why the base booted at another TP than the recipe's (BaseBoot.reason)
    budget_bytes: int | None
    configs: list[CapacityConfig]
    freed_weight_bytes: int
    fp8_token_ratio: float | None  # None: fp8_kv_unavailable
    gain_quantized: float
    gain_fp8: float | None
    planner: list[PlannerCheck]
    # Why this host's vLLM has no fp8 KV cache (a CPU without AVX-512), when the production boot
    # therefore serves a 16-bit one: the table's fp8-KV row says so instead of a measurement.
    fp8_kv_unavailable: str | None = None
    # The base model's parameters, total and active per token (None: a report made before they were
    # recorded, or a config the planner cannot model).
    model: ModelSummary | None = None
    # The candidate's quantization scheme: the table names the quantized rows by it (Boot.label).
    scheme: str | None = None
    # The production boot's KV dtype as it served: the table names its row by it (Boot.label).
    kv_cache_dtype: str | None = None
    # A recipe setting this host did not apply, and why (serve.memory_budget on a GPU host:
    # validate/preflight.py for_this_host)
    host_note: str | None = None

    def by_name(self, name: Boot) -> CapacityConfig:
        return next(c for c in self.configs if c.name == name)

    def label(self, name: Boot) -> str:
        """A row's name as the table and the run folder's boot logs name it: by what ran (Boot.label)."""
        return Boot(name).label(self.scheme, kv_cache_dtype=self.kv_cache_dtype)

    def markdown(self) -> str:
        rows = [
            "| configuration | KV dtype | weights GiB | KV cache GiB | KV tokens | max concurrency | "
            "planner KV tokens (error) | source |",
            "|---|---|---:|---:|---:|---:|---:|---|",
        ]
        checks = {p.name: p for p in self.planner}
        quantized = self.label(Boot.QUANTIZED_16BIT_KV)
        for c in self.configs:
            p = checks.get(c.name)
            tp = (
                f" (TP {c.tensor_parallel_size})"
                if c.tensor_parallel_size != self.configs[-1].tensor_parallel_size
                else ""
            )
            rows.append(
                f"| {self.label(c.name)}{tp} | {c.kv_cache_dtype} | {c.weights_bytes / GIB:.4f} | "
                f"{c.kv_cache_memory_bytes / GIB:.4f} | {c.kv_cache_tokens:,} | "
                f"{c.max_concurrency:.2f}x @ {c.max_model_len:,} | "
                + (f"{p.predicted_kv_tokens:,} ({p.error_pct:+.2f}%) |" if p else "- |")
                + f" {c.source} |"
            )
        if self.fp8_kv_unavailable:
            rows.append(
                f"| {Boot.PRODUCTION.label(self.scheme)} | fp8 | - | - | {FP8_UNAVAILABLE}: "
                f"{self.fp8_kv_unavailable} | - | - | - |"
            )
            fp8 = (
                f"fp8 KV {FP8_UNAVAILABLE}; the production boot serves the 16-bit KV cache of the "
                f"{quantized} row."
            )
        else:
            fp8 = (
                f"{quantized} + fp8 KV x{self.gain_fp8:.2f}; "
                f"fp8/16-bit KV tokens x{self.fp8_token_ratio:.3f}."
            )
        rows += [
            "",
            *([self.model.parameters_line(), ""] if self.model else []),
            f"Memory freed by quantization: {self.freed_weight_bytes / GIB:.4f} GiB "
            f"({self.freed_weight_bytes:,} bytes). Capacity over {Boot.BASE}: {quantized} "
            f"x{self.gain_quantized:.2f}, {fp8}",
            "",
            f"Method: {self.method}",
        ]
        if self.host_note:
            rows += ["", f"{self.host_note}."]
        if self.base_boot:
            rows += ["", f"Base boot: {self.base_boot}"]
        rows += ["", "Rows:", *(f"- {self.label(c.name)}: {c.provenance()}" for c in self.configs)]
        return "\n".join(rows)


class BaseBoot(BaseModel):
    """The TP the base model boots at: the recipe's, or (on GPUs, where the bf16 base does not fit
    the recipe's TP) the smallest that fits this host, with the reason."""

    tensor_parallel_size: int
    reason: str | None = None


def base_boot(
    recipe: Recipe, base_config: dict, *, device_memory_bytes: int | None, gpu_count: int
) -> BaseBoot:
    """Where the base boots (capacity row (a) and the accuracy baseline). A release that only fits
    quantized (a 70B on one H200) still needs its base served for the accuracy gate: at the smallest
    TP that fits, when this host has that many GPUs. Otherwise it raises GateError naming what the
    base needs, before anything is quantized. CPU runs (``serve.memory_budget``) keep the recipe's TP."""
    tp = recipe.serve.tensor_parallel_size
    if recipe.serve.memory_budget is not None or not device_memory_bytes:
        return BaseBoot(tensor_parallel_size=tp)
    plan = plan_for(
        recipe,
        base_config,
        Boot.BASE,
        block_size=planner.BLOCK_SIZE_GPU,
        device_memory_bytes=device_memory_bytes,
    )
    if plan.fits:
        return BaseBoot(tensor_parallel_size=tp)
    why = f"the bf16 base does not fit at TP {tp}: {plan.reason}"
    heads = planner.ModelShape.from_config(base_config).num_heads
    fitting = [
        t
        for t in planner.TP_SIZES
        if t > tp
        and heads % t == 0
        and plan_for(
            recipe,
            base_config,
            Boot.BASE,
            block_size=planner.BLOCK_SIZE_GPU,
            device_memory_bytes=device_memory_bytes,
            tensor_parallel_size=t,
        ).fits
    ]
    if fitting and fitting[0] <= gpu_count:
        return BaseBoot(
            tensor_parallel_size=fitting[0],
            reason=f"{why}; measured at TP {fitting[0]}, the smallest "
            f"that fits (the planner), on {fitting[0]} of this host's {gpu_count} GPUs",
        )
    fits_at = f"it fits at TP {fitting[0]}" if fitting else f"it fits at no TP up to {planner.TP_SIZES[-1]}"
    raise GateError(
        f"{why}; {fits_at}, and this host has {gpu_count} GPU(s). The accuracy gate compares "
        "the release with its base served the same way, so the base must be served. Nothing was "
        f"quantized. Fix: run on a host with at least {fitting[0] if fitting else 'more'} GPUs (the "
        f"release keeps serve.tensor_parallel_size {tp}), or lower serve.max_model_len"
    )


def published_model(recipe: Recipe, checkpoint_dir: str | Path) -> str:
    """How a published command or profile names the model: the Hub repo id, or (no hub section)
    the checkpoint folder's name; never this machine's path."""
    return recipe.hub.repo_id if recipe.hub else Path(checkpoint_dir).name


def published_serve_command(recipe: Recipe, checkpoint_dir: str | Path) -> str:
    """The published `vllm serve <repo id> --revision <release ref> ...` of the production boot."""
    spec = capacity_spec(recipe, Boot.PRODUCTION, Path(checkpoint_dir), as_published=True)
    return spec.serve_command(published_model(recipe, checkpoint_dir))


def label_number(info: dict[str, str], key: str) -> float | None:
    """A numeric label of vllm:cache_config_info, or None when vLLM left it unset.

    Unset fields are exported as the string "None": on CUDA, kv_cache_memory_bytes is unset
    whenever the cache is sized from gpu_memory_utilization (vLLM 0.26).
    """
    try:
        return float(info[key])
    except (KeyError, ValueError):
        return None


def read_cache_info(metrics_text: str) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info`` (vLLM's capacity figures) on ``/metrics``."""
    info = read_labels(metrics_text, "vllm:cache_config_info")
    if info is None:
        raise GateError("vLLM's /metrics has no vllm:cache_config_info; is this a vLLM >= 0.10 server?")
    return info


def measure_capacity(server: RunningServer, spec: ServerSpec, *, name: Boot) -> CapacityConfig:
    """Read one boot's KV capacity from vLLM's /metrics and its weight memory (see module doc), with what
    the boot held as vLLM logged it (``held``)."""
    info = read_cache_info(server.get("/metrics"))
    num_blocks = int(info["num_gpu_blocks"])
    block_size = int(info["block_size"])
    tokens = int(label_number(info, "kv_cache_size_tokens") or num_blocks * block_size)
    max_len = spec.serve.max_model_len
    log_path = Path(server.log_path)
    log_text = log_path.read_text(errors="replace") if log_path.is_file() else ""
    if spec.kv_cache_memory_bytes is not None:
        weights = checkpoint_tensor_bytes(Path(spec.model_dir))
    else:
        found = MODEL_LOADING.findall(log_text)
        weights = int(float(found[-1]) * GIB) if found else checkpoint_tensor_bytes(Path(spec.model_dir))
    kv_bytes = label_number(info, "kv_cache_memory_bytes") or spec.kv_cache_memory_bytes
    if kv_bytes is None:  # sized by vLLM from gpu_memory_utilization: its log says how much
        found = AVAILABLE_KV.findall(log_text)
        kv_bytes = float(found[-1]) * GIB if found else 0
    fixed = spec.kv_cache_memory_bytes is not None
    return CapacityConfig(
        name=Boot(name),
        tensor_parallel_size=spec.serve.tensor_parallel_size,
        kv_cache_dtype=info.get("cache_dtype", spec.effective_kv_dtype),
        weights_bytes=weights,
        kv_cache_memory_bytes=int(kv_bytes),
        kv_cache_tokens=tokens,
        num_blocks=num_blocks,
        block_size=block_size,
        max_model_len=max_len,
        max_concurrency=round(label_number(info, "kv_cache_max_concurrency") or tokens / max_len, 2),
        boot_seconds=server.boot_seconds,
        held=BootHeld(
            kv_cache_tokens=tokens,
            gpu_memory_utilization=None if fixed else spec.serve.gpu_memory_utilization,
            kv_cache_memory_bytes=spec.kv_cache_memory_bytes,
            vllm_said=vllm_said(log_text),
            log=log_path.name,
        ),
    )


def at_utilization(
    measured: CapacityConfig,
    recipe: Recipe,
    base_config: dict,
    *,
    served_at: float,
    usable_bytes: int,
) -> CapacityConfig:
    """A row served at ``served_at`` (the base, scored beside calibration in the memory a lower
    gpu_memory_utilization leaves) as it stands at the recipe's. vLLM (0.26, v1 gpu_worker) sizes the
    cache as ceil(usable x utilization) minus what the profiled boot needs besides it (weights, activation
    peak, non-torch memory), none of which depends on the utilization: the KV bytes move by exactly the
    difference of the two ceilings, and the blocks by that over one block's bytes. The blocks' remainder at
    ``served_at`` is unknown, so the row is at most one block short of a boot at the recipe's settings. Under
    a fixed budget (serve.memory_budget) the utilization sizes nothing: the row stays as measured."""
    target = recipe.serve.gpu_memory_utilization
    if recipe.serve.memory_budget is not None or served_at == target:
        return measured
    delta = math.ceil(usable_bytes * target) - math.ceil(usable_bytes * served_at)
    plan = plan_for_row(recipe, base_config, measured, device_memory_bytes=usable_bytes)
    per_token = plan.kv_bytes_per_token_per_gpu
    blocks = measured.num_blocks + delta // (per_token * measured.block_size)
    tokens = blocks * measured.block_size
    held = measured.held or BootHeld(
        kv_cache_tokens=measured.kv_cache_tokens, gpu_memory_utilization=served_at
    )
    return measured.model_copy(
        update={
            "kv_cache_memory_bytes": measured.kv_cache_memory_bytes + delta,
            "num_blocks": blocks,
            "kv_cache_tokens": tokens,
            "max_concurrency": round(tokens / measured.max_model_len, 2),
            "held": held,
            "derived": f"derived at gpu_memory_utilization {target:.2f} from its boot at {served_at:.2f}, "
            f"which held {measured.kv_cache_tokens:,} tokens; that boot served beside calibration, "
            f"{measured.num_blocks:,} blocks{said(held)}; at the recipe's {target:.2f} by vLLM's sizing, "
            f"{delta / GIB:+.2f} GiB of KV cache: {blocks - measured.num_blocks:+,} blocks (at most one "
            "short of a boot there)",
        }
    )


# The fp8 KV cache path's own memory: a boot of (c) gives its KV cache this much less than a boot of (b) gives
# its own (30.7 MiB for the 8B on one H200), so row (b) derived from (c) may be this short of a booted (b). On
# a model whose quantization frees less than this (the demo's 2 MB tiny model) the derived (b) may hold fewer
# tokens than the base.
FP8_PATH_OWN_BYTES = 32 * 2**20


def with_sixteen_bit_kv(
    production: CapacityConfig,
    recipe: Recipe,
    base_config: dict,
    *,
    kv_cache_dtype: str,
    usable_bytes: int | None,
) -> CapacityConfig:
    """Row (b) from the production boot (c) (serve.sixteen_bit_kv_row: derive): the same checkpoint under
    the same budget, so vLLM gives the KV cache the same bytes, and the blocks are those bytes over one
    16-bit block's (vLLM 0.26 sizes num_blocks as the available bytes over a block's, floored).
    ``kv_cache_dtype``: what the boot of (b) would name (sixteen_bit_kv_dtype). On one H200 the 8B's two
    boots (benchmarks/results/capacity/h200.json) gave (c) 30.7 MiB less KV memory than (b), the fp8 path's
    own
    weights: the row derived from (c) is 17 blocks (272 tokens, 0.03%) short of the one booted. Where (c)
    served a 16-bit KV cache itself (a CPU without fp8 KV), it is (b)."""
    row = production.model_copy(update={"name": Boot.QUANTIZED_16BIT_KV, "boot_seconds": 0.0})
    held = production.held or BootHeld(kv_cache_tokens=production.kv_cache_tokens)
    if not production.kv_cache_dtype.startswith("fp8"):
        return row.model_copy(
            update={
                "held": held,
                "derived": f"the production boot's figures, which held {production.kv_cache_tokens:,} "
                f"tokens; not booted again: that boot served a 16-bit KV cache{said(held)}",
            }
        )
    row = row.model_copy(update={"kv_cache_dtype": kv_cache_dtype})
    per_token = plan_for_row(
        recipe, base_config, row, device_memory_bytes=usable_bytes
    ).kv_bytes_per_token_per_gpu
    blocks = production.kv_cache_memory_bytes // (per_token * production.block_size)
    tokens = blocks * production.block_size
    return row.model_copy(
        update={
            "num_blocks": blocks,
            "kv_cache_tokens": tokens,
            "max_concurrency": round(tokens / production.max_model_len, 2),
            "held": held,
            "derived": f"derived from the production boot, which held {production.kv_cache_tokens:,} "
            f"{production.kv_cache_dtype} tokens{said(held)}; not booted: that boot's "
            f"{production.kv_cache_memory_bytes / GIB:.2f} GiB of KV cache at {per_token:,} bytes a 16-bit "
            f"token, by vLLM's sizing; a boot of this row may hold up to {FP8_PATH_OWN_BYTES // per_token:,} "
            f"more, the fp8 path's own {FP8_PATH_OWN_BYTES / 2**20:.0f} MiB (on one H200 the 8B's held 0.03% "
            "more)",
        }
    )


def plan_for(
    recipe: Recipe,
    base_config: dict,
    name: Boot,
    *,
    block_size: int,
    device_memory_bytes: int | None = None,
    tensor_parallel_size: int | None = None,
    cudagraph_memory_bytes: int | None = None,
) -> planner.CapacityPlan:
    """The planner's prediction for one configuration, in the same mode as the measurement
    (``tensor_parallel_size``: another TP than the recipe's; ``cudagraph_memory_bytes``: vLLM's
    CUDA-graph estimate from a boot's log, for a vLLM that takes one from the budget)."""
    boot = Boot(name)
    kv = "auto" if boot.sixteen_bit_kv else recipe.serve.kv_cache_dtype
    scheme = recipe.quantization.scheme if boot.quantized else "bf16"
    fixed = recipe.serve.memory_budget is not None
    return planner.plan_capacity(
        planner.ModelShape.from_config(base_config),
        scheme=scheme,
        kv_cache_dtype=kv,
        device_memory_bytes=int(recipe.serve.memory_budget) if fixed else int(device_memory_bytes or 0),
        gpu_memory_utilization=1.0 if fixed else recipe.serve.gpu_memory_utilization,
        max_model_len=recipe.serve.max_model_len,
        max_num_batched_tokens=recipe.serve.batched_tokens,
        block_size=block_size,
        tensor_parallel_size=tensor_parallel_size or recipe.serve.tensor_parallel_size,
        mode="fixed_budget" if fixed else "gpu",
        group_size=recipe.quantization.group_size,
        ignore=tuple(recipe.quantization.ignore),
        enforce_eager=recipe.serve.enforce_eager,  # CUDA graphs: vLLM's estimate leaves the KV budget
        cudagraph_memory_bytes=cudagraph_memory_bytes,
    )


def fits_at(
    recipe: Recipe,
    base_config: dict,
    name: Boot,
    utilization: float,
    *,
    device_memory_bytes: int | None,
    tensor_parallel_size: int | None = None,
) -> bool:
    """Whether the planner fits that boot on a GPU at ``utilization`` (the recipe's other settings): its
    weights, activations, CUDA graphs and one max_model_len request's KV cache."""
    serve = recipe.serve.model_copy(update={"gpu_memory_utilization": utilization})
    return plan_for(
        recipe.model_copy(update={"serve": serve}),
        base_config,
        name,
        block_size=planner.BLOCK_SIZE_GPU,
        device_memory_bytes=device_memory_bytes,
        tensor_parallel_size=tensor_parallel_size,
    ).fits


def plan_for_row(
    recipe: Recipe, base_config: dict, row: CapacityConfig, *, device_memory_bytes: int | None = None
) -> planner.CapacityPlan:
    """The planner's prediction for a measured row: its configuration, block size and TP."""
    return plan_for(
        recipe,
        base_config,
        row.name,
        block_size=row.block_size,
        device_memory_bytes=device_memory_bytes,
        tensor_parallel_size=row.tensor_parallel_size,
    )


def summarize_capacity(
    recipe: Recipe,
    configs: list[CapacityConfig],
    base_config: dict,
    *,
    device_memory_bytes: int | None = None,
    base_boot: str | None = None,
    fp8_kv_unavailable: str | None = None,
    host_note: str | None = None,
) -> CapacityReport:
    """Derived figures and the planner's predictions beside the measured ones. ``host_note``: a recipe
    setting this host did not apply (ValidatedRecipe.host_note).

    ``fp8_kv_unavailable``: why this host cannot serve an fp8 KV cache (serving.host). When the
    production boot (c) served a 16-bit KV cache for that reason, it measured the configuration of
    (b) again: the report keeps (a) and (b) and shows the fp8-KV row as not available, with the reason."""
    by = {c.name: c for c in configs}
    a, b, c = by[Boot.BASE], by[Boot.QUANTIZED_16BIT_KV], by[Boot.PRODUCTION]
    if c.kv_cache_dtype.startswith("fp8"):
        fp8_kv_unavailable = None  # measured after all (a GPU, or a CPU that has it)
    configs = [a, b] if fp8_kv_unavailable else [a, b, c]
    checks = []
    for cfg in configs:
        plan = plan_for_row(recipe, base_config, cfg, device_memory_bytes=device_memory_bytes)
        checks.append(
            PlannerCheck(
                name=cfg.name,
                predicted_kv_tokens=plan.kv_cache_tokens,
                measured_kv_tokens=cfg.kv_cache_tokens,
                error_pct=planner.kv_error_pct(plan.kv_cache_tokens, cfg.kv_cache_tokens),
            )
        )
    return CapacityReport(
        method=METHOD_FIXED if recipe.serve.memory_budget is not None else METHOD_GPU,
        base_boot=base_boot,
        budget_bytes=int(recipe.serve.memory_budget) if recipe.serve.memory_budget is not None else None,
        configs=configs,
        freed_weight_bytes=a.weights_bytes - b.weights_bytes,
        fp8_token_ratio=None
        if fp8_kv_unavailable
        else round(c.kv_cache_tokens / max(b.kv_cache_tokens, 1), 4),
        gain_quantized=round(b.kv_cache_tokens / max(a.kv_cache_tokens, 1), 4),
        gain_fp8=None if fp8_kv_unavailable else round(c.kv_cache_tokens / max(a.kv_cache_tokens, 1), 4),
        planner=checks,
        fp8_kv_unavailable=fp8_kv_unavailable,
        model=ModelSummary.of(planner.ModelShape.from_config(base_config)),
        scheme=recipe.quantization.scheme,
        kv_cache_dtype=c.kv_cache_dtype,
        host_note=host_note,
    )


def boot_label(recipe: Recipe, boot: Boot) -> str:
    """A boot's name by what it runs (Boot.label): the recipe's scheme and its production KV dtype."""
    return Boot(boot).label(recipe.quantization.scheme, kv_cache_dtype=recipe.production_kv_cache_dtype)


def boot_log_name(recipe: Recipe, boot: Boot, *, kind: str = "") -> str:
    """The file a boot of ``recipe`` logs to in its run folder (Boot.log_name): ``vllm-w8a8-16bitkv.log``."""
    return Boot(boot).log_name(
        recipe.quantization.scheme, kv_cache_dtype=recipe.production_kv_cache_dtype, kind=kind
    )
