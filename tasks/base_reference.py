"""The base-reference cache (quantize_serve/report/base_reference.py): a known base's figures, capacity row
(a) and the base accuracy, and row (b) of each quantization format, looked up before the boots and kept after
them for the next release of the same base under the same conditions."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from quantize_serve.capacity import measure as capacity
from quantize_serve.core.portable import portable_path
from quantize_serve.core.settings import get_settings
from quantize_serve.gates.accuracy.run import AccuracyRun
from quantize_serve.report import base_reference
from quantize_serve.report.provenance import describe_hardware, serving_vllm_version
from quantize_serve.serving.spec import capacity_spec
from quantize_serve.validate.preflight import BaseModelRef, ValidatedRecipe


def boots_base_first(validated: ValidatedRecipe) -> bool:
    """Whether the run boots its base first whatever the base resolves to: no stored reference could be
    this base's (report/base_reference.py stored_for), or reuse is off. Known before the base resolves,
    so the base's boot can import while it downloads (flows/pipeline.py)."""
    settings, recipe = get_settings(), validated.recipe
    repo_id = None if recipe.model_is_local else recipe.model.id
    return not settings.reuse_base_reference or not base_reference.stored_for(settings.work_dir, repo_id)


@task(name="find-base-reference", cache_policy=NO_CACHE)
def find_base_reference(
    validated: ValidatedRecipe,
    base: BaseModelRef,
    base_boot: capacity.BaseBoot,
) -> tuple[str, base_reference.BaseReference | None]:
    """(the key of this run's base figures, the reference a previous run stored under it, if any)."""
    spec = capacity_spec(
        validated.recipe,
        capacity.Boot.BASE,
        Path(base.local_dir),
        tensor_parallel_size=base_boot.tensor_parallel_size,
    )
    try:
        lm_eval_version = importlib.metadata.version("lm_eval")
    except importlib.metadata.PackageNotFoundError:
        lm_eval_version = None
    factors = base_reference.reference_factors(
        validated.recipe,
        base.identity,
        spec.vllm_config(),
        vllm_version=serving_vllm_version(),
        hardware=describe_hardware(),
        lm_eval_version=lm_eval_version,
    )
    key = base_reference.reference_key(factors)
    settings = get_settings()
    found = base_reference.find_reference(settings.work_dir, key) if settings.reuse_base_reference else None
    logger = get_run_logger()
    if found:
        logger.info(
            "base %s: capacity row (%s) and base accuracy reused from run %s (same base sha, tasks, "
            "serve settings, vLLM version and hardware): the base is not booted",
            base.identity,
            capacity.Boot.BASE,
            found.run_id,
        )
        # the row says so wherever it is shown (the capacity table, report.json)
        found = found.model_copy(
            update={"capacity": found.capacity.model_copy(update={"reused_from": found.run_id})}
        )
    else:
        logger.info("base %s: no reference under key %s, the base is served", base.identity, key)
    return key, found


@task(name="record-base-reference", cache_policy=NO_CACHE)
def record_base_reference(
    validated: ValidatedRecipe,
    base: BaseModelRef,
    key: str,
    capacity_config: capacity.CapacityConfig,
    accuracy: Any,
    run_id: str,
    run_dir: Path,
) -> None:
    """Keep the base's figures for later runs of the same base (only a completed accuracy run)."""
    if not isinstance(accuracy, AccuracyRun):
        return
    factors = {"base": base.identity}
    reference = base_reference.BaseReference(
        key=key,
        run_id=run_id,
        run_dir=portable_path(str(run_dir)),
        capacity=capacity_config,
        accuracy=accuracy,
        factors=factors,
    )
    base_reference.save_reference(get_settings().work_dir, reference)


def reused_sixteen_bit_kv(
    validated: ValidatedRecipe, reference: base_reference.BaseReference | None
) -> base_reference.MeasuredRow | None:
    """Row (b) a previous release of this base in this format measured (report/base_reference.py), if any."""
    fmt = base_reference.format_key(validated.recipe)
    row = reference.sixteen_bit_kv.get(fmt) if reference and fmt else None
    if row:
        get_run_logger().info(
            "capacity row (%s) reused from run %s (same base, quantization format, serve settings, vLLM "
            "version and hardware): the quantized checkpoint is not booted with 16-bit KV",
            capacity.boot_label(validated.recipe, capacity.Boot.QUANTIZED_16BIT_KV),
            row.run_id,
        )
        row = row.model_copy(update={"capacity": row.capacity.model_copy(update={"reused_from": row.run_id})})
    return row


@task(name="record-16bit-kv-row", cache_policy=NO_CACHE)
def record_sixteen_bit_kv(
    validated: ValidatedRecipe, key: str, capacity_config: capacity.CapacityConfig, run_id: str
) -> None:
    """Keep row (b) for the next release of this base in this format (beside the base's figures)."""
    fmt = base_reference.format_key(validated.recipe)
    if fmt:
        row = base_reference.MeasuredRow(run_id=run_id, capacity=capacity_config)
        base_reference.add_sixteen_bit_kv(get_settings().work_dir, key, fmt, row)
