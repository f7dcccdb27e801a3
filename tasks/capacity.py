"""The capacity rows as tasks: each boot's row measured, the base's at the recipe's utilization when it was
served lower, row (b) derived from the production boot's, the three summarized, and the shape's capacity with
dummy weights before any download (serve.preflight: measure)."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from quantize_serve.capacity import measure as capacity
from quantize_serve.capacity import shape as shape_capacity
from quantize_serve.core.errors import GateError
from quantize_serve.serving import gpu, host
from quantize_serve.serving.server import RunningServer, ServerSpec
from quantize_serve.serving.spec import sixteen_bit_kv_dtype
from quantize_serve.validate.preflight import BaseModelRef, ValidatedRecipe, model_shape_dir


@task(name="measure-capacity", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2)
def measure_capacity(server: RunningServer, spec: ServerSpec, name: capacity.Boot) -> capacity.CapacityConfig:
    return capacity.measure_capacity(server, spec, name=name)


@task(name="capacity-at-recipe-utilization")
def capacity_at_recipe_utilization(
    validated: ValidatedRecipe, measured: capacity.CapacityConfig, model_dir: str, served_at: float
) -> capacity.CapacityConfig:
    """A row served at ``served_at`` (the base beside calibration) as it stands at the recipe's
    gpu_memory_utilization (capacity.at_utilization)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    usable = gpu.usable_memory_bytes()  # a GPU host: only there is the base served below the recipe's
    return capacity.at_utilization(
        measured, validated.recipe, config, served_at=served_at, usable_bytes=usable
    )


@task(name="summarize-capacity")
def summarize_capacity(
    validated: ValidatedRecipe,
    base: BaseModelRef,
    configs: list[capacity.CapacityConfig],
    base_boot: capacity.BaseBoot | None = None,
) -> capacity.CapacityReport:
    config = base.config
    return capacity.summarize_capacity(
        validated.recipe,
        configs,
        config,
        device_memory_bytes=gpu.usable_memory_bytes(),
        base_boot=base_boot.reason if base_boot else None,
        fp8_kv_unavailable=host.serving_host_gap(None, "fp8"),
        host_note=validated.host_note(),
    )


def derived_sixteen_bit_kv(
    validated: ValidatedRecipe, base: BaseModelRef, production: capacity.CapacityConfig, checkpoint_dir: str
) -> capacity.CapacityConfig:
    """Row (b) from the production boot's, not booted (serve.sixteen_bit_kv_row: derive)."""
    return capacity.with_sixteen_bit_kv(
        production,
        validated.recipe,
        base.config,
        kv_cache_dtype=sixteen_bit_kv_dtype(Path(checkpoint_dir)),
        usable_bytes=gpu.usable_memory_bytes(),
    )


@task(name="measure-shape-capacity", cache_policy=NO_CACHE)
def measure_shape_capacity(validated: ValidatedRecipe, run_dir: Path) -> shape_capacity.ShapeCapacity:
    """serve.preflight: measure: the three configurations with dummy weights, before the base's weights
    are downloaded (only its config and tokenizer are); fails when the production one does not fit."""
    logger = get_run_logger()
    r = validated.recipe
    result = shape_capacity.measure_shape(
        r,
        model_shape_dir(r),
        out_dir=run_dir / "preflight",
        model=r.model.id,
        device_memory_bytes=gpu.usable_memory_bytes(),
        production_first=True,
        log=logger.info,
    )
    shape_capacity.write_files(result, run_dir / "preflight")
    logger.info("capacity before download:\n%s", result.markdown())
    production = result.row(capacity.Boot.PRODUCTION)
    if production.refused:
        raise GateError(
            f"the production configuration ({capacity.boot_label(r, production.name)}, TP "
            f"{production.tensor_parallel_size}) "
            f"does not fit: vLLM refused its dummy-weights boot: {production.refused}. Nothing was "
            "downloaded or quantized. Fix: raise serve.tensor_parallel_size or "
            "serve.gpu_memory_utilization, or lower serve.max_model_len"
        )
    return result
