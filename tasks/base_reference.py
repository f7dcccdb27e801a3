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


def reference_stored(validated: ValidatedRecipe) -> bool:
    """Whether the store holds a reference that could be this run's base (report/base_reference.py
    stored_for), before the base resolves: the run's steps then know whether its base boots first
    (report/steps.py boots_base_first)."""
    recipe = validated.recipe
    return base_reference.stored_for(
        get_settings().work_dir, None if recipe.model_is_local else recipe.model.id
    )


@task(name="find-base-reference", cache_policy=NO_CACHE)
def find_base_reference(
    validated: ValidatedRecipe,
    base: BaseModelRef,
    base_boot: capacity.BaseBoot,
) -> tuple[str, base_reference.BaseReference | None]:
    """(the key of this run's base figures, the reference a previous run stored under it, if any): whether
    the run reuses it is the run's steps' choice (report/steps.py, QS_REUSE_BASE_REFERENCE)."""
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
    found = base_reference.find_reference(get_settings().work_dir, key)
    if found:
        get_run_logger().info(
            "base %s: a reference stored by run %s under key %s (same base sha, tasks, serve settings, vLLM "
            "version and hardware)",
            base.identity,
            found.run_id,
            key,
        )
        # the row says so wherever it is shown (the capacity table, report.json)
        found = found.model_copy(
            update={"capacity": found.capacity.model_copy(update={"reused_from": found.run_id})}
        )
    else:
        get_run_logger().info("base %s: no reference under key %s", base.identity, key)
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


@task(name="record-16bit-kv-row", cache_policy=NO_CACHE)
def record_sixteen_bit_kv(
    validated: ValidatedRecipe, key: str, capacity_config: capacity.CapacityConfig, run_id: str
) -> None:
    """Keep row (b) for the next release of this base in this format (beside the base's figures)."""
    fmt = base_reference.format_key(validated.recipe)
    if fmt:
        row = base_reference.MeasuredRow(run_id=run_id, capacity=capacity_config)
        base_reference.add_sixteen_bit_kv(get_settings().work_dir, key, fmt, row)
