"""Measured capacity of a model shape before its weights are downloaded (``--load-format dummy``).

A planner is arithmetic; a boot is the engine's own accounting. This stage boots vLLM from the
model's config.json and tokenizer alone, with random weights of the real shapes, for the three
configurations the flow compares: the base in 16 bits, the recipe's W4A16 scheme (config.json
then carries the compressed-tensors ``quantization_config`` llm-compressor writes for it, so vLLM
picks the same int4 kernel it will pick for the real checkpoint), and W4A16 with the recipe's KV
dtype. A configuration vLLM refuses (the weights leave no room for one request of max_model_len)
is a row with vLLM's reason, not a crash. Each row stands beside the planner's prediction.

On a GPU vLLM profiles the dummy weights and activations exactly as it will the real ones, so the
KV figures are what the real checkpoint gets (weights are random, sizes are not). On CPU
(``serve.memory_budget`` set) the budget is fixed: each boot gets budget - weights, with the
weights the planner's bytes for the shape (no checkpoint exists to read them from); the boot then
measures vLLM's block and per-token accounting.

A shape the planner has no model of (a sliding-window cache, multi-latent attention, another
architecture: UnplannableShapeError) is measured on a GPU all the same, its rows without a prediction:
this is the measured path the planner's refusal points to. A fixed budget needs the planner's weight
bytes, so on CPU such a shape is refused, saying so.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Collection
from pathlib import Path

from pydantic import BaseModel

from quantize_serve.capacity import planner
from quantize_serve.capacity.chart import capacity_chart
from quantize_serve.capacity.measure import (
    GIB,
    METHOD_FIXED,
    METHOD_GPU,
    CapacityConfig,
    boot_log_name,
    measure_capacity,
    plan_for,
)
from quantize_serve.serving.spec import capacity_spec
from quantize_serve.core.errors import RecipeError, ServerBootError, UnplannableShapeError
from quantize_serve.quantize.run import CHECKPOINT_FORMAT, weight_scheme
from quantize_serve.recipe.model import Recipe
from quantize_serve.recipe.quantization import QuantizationSection
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.server import vllm_server

WEIGHT_SUFFIXES = {".safetensors", ".bin", ".pth", ".pt", ".gguf"}


def quantization_config(q: QuantizationSection) -> dict:
    """The ``quantization_config`` llm-compressor writes into a checkpoint of this scheme
    (compressed-tensors, pack-quantized int4), built by compressed-tensors itself."""
    if q.llmcompressor_recipe is not None:
        raise RecipeError(
            "recipe",
            "quantization.llmcompressor_recipe",
            "(a raw recipe)",
            "a raw llm-compressor recipe does not say which checkpoint format it writes, so "
            "its shape cannot be booted without weights",
            "describe the scheme with quantization.scheme/group_size/ignore to measure "
            "capacity before quantizing, or run the flow without serve.preflight",
        )
    scheme, fmt = weight_scheme(q), CHECKPOINT_FORMAT[q.scheme]
    groups = {name: {**group, "format": fmt} for name, group in scheme["config_groups"].items()}
    if q.method in ("gptq", "smoothquant-gptq"):  # GPTQModifier writes its default activation ordering
        groups = {
            name: {**group, "weights": {**group["weights"], "actorder": "static"}}
            for name, group in groups.items()
        }
    return checkpoint_quantization_config(groups, ignore=scheme["ignore"], format=fmt)


def checkpoint_quantization_config(config_groups: dict, *, ignore: list[str], format: str) -> dict:
    """A compressed-tensors ``QuantizationConfig`` of these groups, as compressed-tensors'
    ModelCompressor.update_config writes it into a saved checkpoint's config.json."""
    import compressed_tensors
    from compressed_tensors.quantization import QuantizationConfig

    config = QuantizationConfig(
        config_groups=config_groups, ignore=ignore, format=format, quantization_status="compressed"
    )
    return {
        "version": compressed_tensors.__version__,
        "quant_method": "compressed-tensors",
        "sparsity_config": {},
        "transform_config": {},
        **config.model_dump(exclude=["quant_method"]),
    }


def write_folder(folder: Path, config: dict, files: list[Path], quantization_config: dict | None) -> Path:
    """``folder`` made afresh: ``files`` copied in, ``config`` its config.json (with ``quantization_config``
    when given)."""
    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for f in files:
        shutil.copyfile(f, folder / f.name)
    if quantization_config is not None:
        config = {**config, "quantization_config": quantization_config}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def weightless_folder(base_dir: Path, folder: Path, *, quantization_config: dict | None = None) -> Path:
    """``folder`` (made afresh) with ``base_dir``'s config.json and tokenizer files but no weights,
    config.json carrying ``quantization_config`` when given: what a dummy-weights boot reads."""
    base_dir = Path(base_dir)
    files = [
        f
        for f in base_dir.iterdir()
        if f.is_file() and f.suffix not in WEIGHT_SUFFIXES and f.name != "config.json"
    ]
    return write_folder(
        folder, json.loads((base_dir / "config.json").read_text()), files, quantization_config
    )


def shape_folders(base_dir: Path, q: QuantizationSection, out_dir: Path) -> dict[Boot, Path]:
    """A weightless model folder per boot: the base's, and for the quantized boots the same with the
    scheme's quantization_config."""
    base = weightless_folder(base_dir, Path(out_dir) / "shape-base")
    quantized = weightless_folder(
        base_dir, Path(out_dir) / "shape-w4a16", quantization_config=quantization_config(q)
    )
    return {boot: quantized if boot.quantized else base for boot in Boot}


class ShapeRow(BaseModel):
    """One configuration: measured (or refused by vLLM, with its reason) beside the planner."""

    name: Boot
    kv_cache_dtype: str
    tensor_parallel_size: int
    measured: CapacityConfig | None = None
    refused: str | None = None
    not_booted: str | None = None  # why this configuration was not booted (it stays planned only)
    planned: planner.CapacityPlan | None = None  # None: the planner has no model of the shape (unplanned)
    error_pct: float | None = None


class ShapeCapacity(BaseModel):
    model: str
    method: str
    rows: list[ShapeRow]
    max_model_len: int | None = None  # the recipe's (None: a report made before it was recorded)
    unplanned: str | None = None  # why the rows have no prediction: the planner's refusal of the shape
    scheme: str | None = None  # the recipe's: the quantized rows are named by it (Boot.label)

    def configs(self) -> list[CapacityConfig]:
        return [r.measured for r in self.rows if r.measured]

    def row(self, name: Boot) -> ShapeRow:
        return next(r for r in self.rows if r.name == name)

    def markdown(self) -> str:
        tp = self.rows[0].tensor_parallel_size
        max_len = self.max_model_len or next(r.planned.max_model_len for r in self.rows if r.planned)
        lines = [
            f"| configuration (TP {tp}) | weights GiB per GPU | KV tokens | max concurrency @ {max_len:,} | "
            "planner KV tokens (error) |",
            "|---|---:|---:|---:|---:|",
        ]
        for r in self.rows:
            p, name = r.planned, r.name.label(self.scheme, kv_cache_dtype=r.kv_cache_dtype)
            plan = "-" if p is None else f"{p.kv_cache_tokens:,}" if p.fits else f"does not fit: {p.reason}"
            if r.measured:
                m = r.measured
                err = f" ({r.error_pct:+.2f}%)" if r.error_pct is not None else ""
                lines.append(
                    f"| {name} ({r.kv_cache_dtype}) | {m.weights_bytes / GIB:.2f} | "
                    f"{m.kv_cache_tokens:,} | {m.max_concurrency:.2f}x | {plan}{err} |"
                )
            else:
                why = r.not_booted or "production was refused first"  # a report made before not_booted
                what = f"refused by vLLM: {r.refused}" if r.refused else f"not booted: {why}"
                weights = "-" if p is None else f"{p.weights_bytes / GIB:.2f} (planned)"
                lines.append(f"| {name} ({r.kv_cache_dtype}) | {weights} | {what} | - | {plan} |")
        lines += [
            "",
            f"Model shape: {self.model}. Weights are random (vLLM --load-format dummy); sizes, "
            "kernels and memory accounting are the real ones. Method: " + self.method,
        ]
        if self.unplanned:
            lines += ["", f"No planner prediction: {self.unplanned}"]
        return "\n".join(lines)


def measure_shape(
    recipe: Recipe,
    base_dir: str | Path,
    *,
    out_dir: Path,
    model: str,
    device_memory_bytes: int | None = None,
    production_first: bool = False,
    boots: Collection[Boot] | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> ShapeCapacity:
    """Boot the three configurations of ``base_dir``'s shape with dummy weights, one at a time,
    and measure each like the flow's capacity stage does (``capacity.measure_capacity``).

    ``production_first`` (the flow's preflight): boot the production configuration first and boot
    no other when vLLM refuses it, since the run stops there anyway; rows keep the Boot order.
    ``boots``: boot only these configurations (a benchmark measuring row by row); the others are
    rows planned only."""
    folders = shape_folders(Path(base_dir), recipe.quantization, out_dir)
    base_config = json.loads((Path(base_dir) / "config.json").read_text())
    fixed = recipe.serve.memory_budget is not None
    block = planner.BLOCK_SIZE_CPU if fixed else planner.BLOCK_SIZE_GPU
    tp = recipe.serve.tensor_parallel_size
    plans, unplanned = planned_rows(
        recipe, base_config, block_size=block, device_memory_bytes=device_memory_bytes
    )
    specs, rows = {}, {}
    for boot in Boot:
        planned = plans[boot]
        weights = planned.weights_bytes if planned else None  # None: on a GPU, vLLM profiles them
        # the GPU's capacity only: no host-memory tier pinned for a boot that serves nothing
        spec = capacity_spec(recipe, boot, folders[boot], weights_bytes=weights, kv_tier=False)
        specs[boot] = spec.model_copy(update={"load_format": "dummy", "warm_up": False})
        rows[boot] = ShapeRow(
            name=boot, kv_cache_dtype=specs[boot].effective_kv_dtype, planned=planned, tensor_parallel_size=tp
        )
    order = (
        [Boot.PRODUCTION, *(b for b in Boot if b is not Boot.PRODUCTION)] if production_first else list(Boot)
    )
    for boot in order:
        spec, row, planned = specs[boot], rows[boot], rows[boot].planned
        if boots is not None and boot not in boots:
            row.not_booted = "not asked for"
            continue
        log(f"shape capacity {boot}: {spec.serve_command()}")
        try:
            with vllm_server(spec, log_path=out_dir / boot_log_name(recipe, boot, kind="shape")) as server:
                measured = measure_capacity(server, spec, name=boot)
        except ServerBootError as exc:
            row.refused = str(exc).splitlines()[0]
            log(f"shape capacity {boot}: refused: {row.refused}")
        else:
            if fixed:  # no checkpoint to read: the budget was split with the planner's weight bytes
                measured = measured.model_copy(update={"weights_bytes": planned.weights_bytes})
            row.measured = measured
            if planned is not None:
                row.error_pct = planner.kv_error_pct(planned.kv_cache_tokens, measured.kv_cache_tokens)
            log(
                f"shape capacity {boot}: {measured.kv_cache_tokens:,} KV tokens "
                f"(planner {f'{planned.kv_cache_tokens:,}' if planned else '-'})"
            )
        if production_first and boot is Boot.PRODUCTION and row.refused:
            for other in Boot:  # the run stops here: the other rows stay planned only
                if other is not boot:
                    rows[other].not_booted = "production was refused first"
            break
    return ShapeCapacity(
        model=model,
        method=METHOD_FIXED if fixed else METHOD_GPU,
        rows=[rows[b] for b in Boot],
        max_model_len=recipe.serve.max_model_len,
        unplanned=unplanned,
        scheme=recipe.quantization.scheme,
    )


def planned_rows(
    recipe: Recipe, base_config: dict, *, block_size: int, device_memory_bytes: int | None
) -> tuple[dict[Boot, planner.CapacityPlan | None], str | None]:
    """The planner's row of each configuration, or none with the reason when it has no model of the
    shape (a GPU boot measures it all the same; a fixed budget cannot be split without its weights)."""
    try:
        return {
            boot: plan_for(
                recipe, base_config, boot, block_size=block_size, device_memory_bytes=device_memory_bytes
            )
            for boot in Boot
        }, None
    except UnplannableShapeError as exc:
        if recipe.serve.memory_budget is not None:
            raise RecipeError(
                "recipe",
                "serve.memory_budget",
                str(recipe.serve.memory_budget),
                f"a fixed budget is split between weights and KV cache with the planner's weight bytes (no "
                f"checkpoint exists yet to read them from), and the planner has no model of this shape: "
                f"{exc.field} = {exc.value}",
                "measure on the GPU host (serve.memory_budget unset): vLLM profiles the weights itself",
            ) from None
        return dict.fromkeys(Boot), f"{exc.field} = {exc.value}: {exc.problem}"


def write_files(result: ShapeCapacity, folder: Path) -> dict[str, Path]:
    """shape-capacity.json, .md and (when a configuration booted) the flow's capacity chart."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"json": folder / "shape-capacity.json", "markdown": folder / "shape-capacity.md"}
    paths["json"].write_text(result.model_dump_json(indent=2))
    paths["markdown"].write_text(result.markdown() + "\n")
    if result.configs():
        paths["chart"] = capacity_chart(result.configs(), folder / "shape-capacity.png")
    return paths
