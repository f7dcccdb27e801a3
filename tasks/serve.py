"""Serving and capacity: the vLLM boot as a context manager for the flow, and the capacity tasks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.concurrency.sync import concurrency
from prefect.futures import PrefectFuture
from prefect.logging import get_run_logger

from quantize_serve.capacity import measure as capacity
from quantize_serve.capacity import shape as shape_capacity
from quantize_serve.core.errors import GateError
from quantize_serve.core.portable import portable_path
from quantize_serve.core.settings import get_settings
from quantize_serve.gates.accuracy import AccuracyRun
from quantize_serve.report import base_reference
from quantize_serve.report.provenance import describe_hardware, serving_vllm_version
from quantize_serve.serve_profile import output as profile_output
from quantize_serve.serve_profile import pinned as serving_profile
from quantize_serve.quantize.run import QuantizeResult
from quantize_serve.serving import compile_ahead, gpu, host
from quantize_serve.serving.server import (
    RunningServer,
    ServerSpec,
    discard_prepared_servers,
    prepare_server,
    vllm_server,
)
from quantize_serve.validate.preflight import BaseModelRef, ValidatedRecipe, model_shape_dir


@contextmanager
def gpu_slot() -> Iterator[None]:
    """Hold the global concurrency limit `gpu` (limit 1) so two runs never share one GPU.

    The limit is created by set-up; a run on a fresh API (a local run) creates it here, so the
    strict acquire below never fails for want of it.
    """
    name = get_settings().gpu_concurrency_limit
    ensure_concurrency_limit(name)
    with concurrency(name, occupy=1, strict=True):
        yield


def ensure_concurrency_limit(name: str, limit: int = 1) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=limit))
            except ObjectAlreadyExists:  # another run, starting at the same moment, created it first
                pass


def published_model(validated: ValidatedRecipe, checkpoint_dir: str) -> str:
    """The model's name in what is published: the Hub repo id (see capacity.published_model)."""
    return capacity.published_model(validated.recipe, checkpoint_dir)


def published_serve_command(validated: ValidatedRecipe, checkpoint_dir: str) -> str:
    """The published `vllm serve <repo id> ...` of the production boot."""
    return capacity.published_serve_command(validated.recipe, checkpoint_dir)


@task(name="plan-base-boot")
def plan_base_boot(validated: ValidatedRecipe, base: BaseModelRef) -> capacity.BaseBoot:
    """The TP the base boots at: the recipe's, or the smallest that fits this host when the bf16 base
    does not fit the recipe's GPUs; fails, before quantizing, when this host has too few
    (capacity.base_boot)."""
    config = base.config
    boot = capacity.base_boot(
        validated.recipe,
        config,
        device_memory_bytes=gpu.usable_memory_bytes(),
        gpu_count=len(gpu.device_handles()),
    )
    if boot.reason:
        get_run_logger().warning("base boot: %s", boot.reason)
    return boot


@contextmanager
def served(
    validated: ValidatedRecipe,
    name: capacity.Boot,
    model_dir: str,
    run_dir: Path,
    *,
    tensor_parallel_size: int | None = None,
    gpu_memory_utilization: float | None = None,
) -> Iterator[tuple[RunningServer, ServerSpec]]:
    """Boot one capacity configuration for the duration of the block (always stopped after);
    ``tensor_parallel_size``: another TP than the recipe's (the base's, see plan_base_boot);
    ``gpu_memory_utilization``: another than the recipe's (the base beside calibration). The
    production settings name the model as the published profile does (its Hub repo id at the release
    ref): such a boot fills the compile-cache entry production's first boot on this host reads."""
    logger = get_run_logger()
    spec = capacity.capacity_spec(
        validated.recipe,
        name,
        Path(model_dir),
        tensor_parallel_size=tensor_parallel_size,
        gpu_memory_utilization=gpu_memory_utilization,
        as_published=name is capacity.Boot.PRODUCTION,
    )
    label = capacity.boot_label(validated.recipe, name)
    logger.info("booting vLLM (%s): %s", label, spec.serve_command())
    with vllm_server(spec, log_path=boot_log(validated, run_dir, name)) as server:
        logger.info("vLLM (%s) healthy at %s after %.0f s", label, server.base_url, server.boot_seconds)
        yield server, spec
    logger.info("vLLM (%s) stopped", label)


def boot_log(validated: ValidatedRecipe, run_dir: Path, name: capacity.Boot) -> Path:
    """Where a boot's vLLM log goes (and what a prepared boot is known by), named by what it runs: the
    recipe's scheme and KV dtype (capacity.boot_log_name: ``vllm-w8a8-16bitkv.log``)."""
    return run_dir / capacity.boot_log_name(validated.recipe, name)


def prepare_boot(
    validated: ValidatedRecipe, run_dir: Path, name: capacity.Boot, architectures: list[str] | None = None
) -> None:
    """Start that boot's vLLM process (imports only, no device) while the device works on something
    else; ``served`` for the same boot then takes it (server.prepare_server). With ``architectures`` (the
    base's config.json's: a quantized checkpoint keeps them), the process also fills vLLM's model-info
    cache for them."""
    prepare_server(boot_log(validated, run_dir, name), architectures)


def compiles_ahead(validated: ValidatedRecipe) -> bool:
    """Whether a run that quantizes beside its base compiles the production boot's graphs ahead, beside the
    base's accuracy run: the production boot compiles (serve.enforce_eager false), on a GPU host (on a CPU
    the compile would take the cores the base is scored on), with the boots prepared ahead
    (QS_PREPARE_BOOTS)."""
    return (
        not validated.recipe.serve.enforce_eager and get_settings().prepare_boots and bool(gpu.memory_info())
    )


@task(name="compile-production-ahead", cache_policy=NO_CACHE)
def compile_production_ahead(
    validated: ValidatedRecipe,
    base: BaseModelRef,
    quantized: PrefectFuture[QuantizeResult],
    run_dir: Path,
    until: compile_ahead.Until,
) -> compile_ahead.CompiledAhead:
    """Once ``quantized`` (the quantization beside the base's accuracy run) has saved the checkpoint: the
    production settings booted beside the base in the least memory they fit in, until ``until`` says enough
    (serving/compile_ahead.py), so the production boot finds its graphs compiled."""
    logger, r = get_run_logger(), validated.recipe
    checkpoint = quantized.result(raise_on_failure=False)
    utilization = None
    why = "the quantization failed" if not isinstance(checkpoint, QuantizeResult) else until.ended
    if not why:
        usable = gpu.usable_memory_bytes()
        utilization, why = compile_ahead.utilization_ahead(
            gpu.free_bytes(r.serve.tensor_parallel_size),
            usable,
            recipe_utilization=r.serve.gpu_memory_utilization,
            fits=partial(
                capacity.fits_at, r, base.config, capacity.Boot.PRODUCTION, device_memory_bytes=usable
            ),
            keep_free_bytes=compile_ahead.kept_for_base_bytes(base.config, r.serve.batched_tokens),
        )
    if utilization is None:
        done = compile_ahead.CompiledAhead(outcome="skipped", detail=why)
        logger.info("the production boot: %s", done.line())
        return done
    logger.info("compile ahead: %s", why)
    spec = capacity.capacity_spec(
        r,
        capacity.Boot.PRODUCTION,
        Path(checkpoint.checkpoint_dir),
        gpu_memory_utilization=utilization,
        as_published=True,
    )
    log_path = compile_ahead.compile_log(run_dir, capacity.boot_label(r, capacity.Boot.PRODUCTION))
    return compile_ahead.compile_ahead(spec, log_path, until, log=logger.info)


def compiled_production_ahead(
    future: PrefectFuture[compile_ahead.CompiledAhead] | None,
) -> compile_ahead.CompiledAhead | None:
    """What :func:`compile_production_ahead` did, once done (None: it was not started). It never fails the
    release: an error of its own is said as a failed compile."""
    if future is None:
        return None
    done = future.result(raise_on_failure=False)
    if isinstance(done, compile_ahead.CompiledAhead):
        return done
    get_run_logger().warning("compiling the production boot's graphs ahead failed: %r", done)
    return compile_ahead.CompiledAhead(outcome="failed", detail=repr(done))


def prepare_compile_ahead(validated: ValidatedRecipe, run_dir: Path, architectures: list[str] | None) -> None:
    """The process of the boot that compiles ahead, started with its imports while calibration runs."""
    label = capacity.boot_label(validated.recipe, capacity.Boot.PRODUCTION)
    prepare_server(compile_ahead.compile_log(run_dir, label), architectures)


def boots_base_first(validated: ValidatedRecipe) -> bool:
    """Whether the run boots its base first whatever the base resolves to: no stored reference could be
    this base's (report/base_reference.py stored_for), or reuse is off. Known before the base resolves,
    so the base's boot can import while it downloads (flows/pipeline.py)."""
    settings, recipe = get_settings(), validated.recipe
    repo_id = None if recipe.model_is_local else recipe.model.id
    return not settings.reuse_base_reference or not base_reference.stored_for(settings.work_dir, repo_id)


@contextmanager
def prepared_boots() -> Iterator[None]:
    """Whatever happens inside, no prepared boot outlives the block (discard_prepared_servers)."""
    try:
        yield
    finally:
        discard_prepared_servers()


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
        kv_cache_dtype=capacity.sixteen_bit_kv_dtype(Path(checkpoint_dir)),
        usable_bytes=gpu.usable_memory_bytes(),
    )


@task(name="write-serving-profile")
def write_serving_profile(
    validated: ValidatedRecipe,
    base: BaseModelRef,
    spec: ServerSpec,
    config: capacity.CapacityConfig,
    checkpoint_dir: str,
    run_dir: Path,
) -> serving_profile.ServingProfile:
    """serve-profile.yaml for the boot the gates validated, its KV cache pinned (serving_profile.py)."""
    base_config = base.config
    profile = serving_profile.write_serving_profile(
        spec,
        config,
        base_config,
        run_dir / profile_output.PROFILE_FILE,
        model=published_model(validated, checkpoint_dir),
        device_memory_bytes=gpu.usable_memory_bytes(),
    )
    get_run_logger().info("serving profile (KV cache pinned):\n%s", profile.markdown())
    return profile


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


@task(name="find-base-reference", cache_policy=NO_CACHE)
def find_base_reference(
    validated: ValidatedRecipe,
    base: BaseModelRef,
    base_boot: capacity.BaseBoot,
) -> tuple[str, base_reference.BaseReference | None]:
    """(the key of this run's base figures, the reference a previous run stored under it, if any)."""
    import importlib.metadata

    spec = capacity.capacity_spec(
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
