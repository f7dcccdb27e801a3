"""The vLLM boots' lifecycle for the flows: the `gpu` slot that keeps two runs off one GPU, the TP the base
boots at, a boot as a context manager with its log, and a boot's process started ahead (its imports) while the
device works on the step before."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from prefect import task
from prefect.concurrency.sync import concurrency
from prefect.logging import get_run_logger

from quantize_serve.capacity import measure as capacity
from quantize_serve.core.settings import get_settings
from quantize_serve.serving import gpu
from quantize_serve.serving.server import (
    RunningServer,
    ServerSpec,
    discard_prepared_servers,
    prepare_server,
    vllm_server,
)
from quantize_serve.serving.spec import capacity_spec
from quantize_serve.validate.preflight import BaseModelRef, ValidatedRecipe


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
    stop: Callable[[], None] | None = None,
    kv_tier: bool = True,
) -> Iterator[tuple[RunningServer, ServerSpec]]:
    """Boot one capacity configuration for the duration of the block (always stopped after);
    ``tensor_parallel_size``: another TP than the recipe's (the base's, see plan_base_boot);
    ``gpu_memory_utilization``: another than the recipe's (the base beside calibration). The
    production settings name the model as the published profile does (its Hub repo id at the release
    ref): such a boot fills the compile-cache entry production's first boot on this host reads.
    ``stop``: asked while the boot waits for /health (vllm_server). ``kv_tier`` false: the production
    settings without the host-memory tier (serve.kv_offload), the boot the tier is measured against."""
    logger = get_run_logger()
    spec = capacity_spec(
        validated.recipe,
        name,
        Path(model_dir),
        tensor_parallel_size=tensor_parallel_size,
        gpu_memory_utilization=gpu_memory_utilization,
        as_published=name is capacity.Boot.PRODUCTION,
        kv_tier=kv_tier,
    )
    label = capacity.boot_label(validated.recipe, name)
    logger.info("booting vLLM (%s): %s", label, spec.serve_command())
    with vllm_server(spec, log_path=boot_log(validated, run_dir, name), stop=stop) as server:
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


@contextmanager
def prepared_boots() -> Iterator[None]:
    """Whatever happens inside, no prepared boot outlives the block (discard_prepared_servers)."""
    try:
        yield
    finally:
        discard_prepared_servers()
