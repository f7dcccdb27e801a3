"""Prefect task for the quantization stage (never retried: a failure here is not transient)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prefect import task
from prefect.logging import get_run_logger

from quantize_serve.capacity import measure as capacity
from quantize_serve.core import ahead
from quantize_serve.core.settings import get_settings
from quantize_serve.hub.download import download_model
from quantize_serve.quantize import device, existing_checkpoint
from quantize_serve.quantize.calibration import calibration_tokens, count_ahead
from quantize_serve.quantize import run as quantize
from quantize_serve.report.steps import BesideBase
from quantize_serve.serving import gpu
from quantize_serve.validate.preflight import BaseModelRef, ValidatedRecipe


@task(name="quantize-model")
def quantize_model(validated: ValidatedRecipe, base: BaseModelRef) -> quantize.QuantizeResult:
    """Quantize the base model, or, with ``quantization.checkpoint``, check and use that checkpoint."""
    logger = get_run_logger()
    r = validated.recipe
    if r.quantization.checkpoint:
        folder, identity = checkpoint_folder(validated)
        result = existing_checkpoint.use_checkpoint(
            r, folder, Path(base.local_dir), base.config, source=validated.source, identity=identity
        )
        logger.info(
            "using the existing %s (%s) at %s: nothing to quantize",
            result.method,
            result.scheme,
            result.source_checkpoint,
        )
        return result
    return quantize.quantize_model(
        r,
        Path(base.local_dir),
        base_identity=base.identity,
        calibration_fingerprint=validated.calibration_fingerprint,
        log=logger.info,
    )


@contextmanager
def worker_ahead(validated: ValidatedRecipe) -> Iterator[None]:
    """The quantization worker started now, when the recipe quantizes (no quantization.checkpoint): its
    imports happen while the flow resolves (or downloads) the base. Whatever happens inside, it does not
    outlive the block (quantize/run.py prepare_worker). On a GPU host the calibration-token count of
    :func:`beside_base` is prepared too (calibration.count_ahead, work ahead in this process: the count
    waits for it): on the first release of a base it stands between the download and the base's boot (14.0 s
    on one H100, 2026-12-05)."""
    r = validated.recipe
    if not r.quantization.checkpoint:
        quantize.prepare_worker()
        if get_settings().prepare_boots and r.calibration.beside_base != "never" and counts_calibration():
            count_ahead(r)
    try:
        yield
    finally:
        quantize.discard_prepared_worker()
        ahead.settle(cancel=True)  # nothing started ahead outlives the run


def counts_calibration() -> bool:
    """Whether :func:`beside_base` counts calibration's tokens: on a GPU host, where the count sizes the
    base's memory beside calibration; on any host with QS_AHEAD_AS_ON_GPU (the count then changes nothing)."""
    return get_settings().ahead_as_on_gpu or gpu.memory_info() is not None


def checkpoint_folder(validated: ValidatedRecipe) -> tuple[Path, str | None]:
    """The checkpoint's folder: the recipe's path, or the Hub repo pinned to a commit and downloaded
    (token as for the base model). Its identity is ``repo@sha`` for the Hub."""
    r = validated.recipe
    q = r.quantization
    if r.is_local(q.checkpoint):
        return r.path(q.checkpoint), None
    resolved = download_model(r, q.checkpoint, q.checkpoint_revision)
    return Path(resolved.local_dir), f"{q.checkpoint}@{resolved.sha}"


def beside_base(
    validated: ValidatedRecipe, base: BaseModelRef, tensor_parallel_size: int | None = None
) -> BesideBase:
    """Whether calibration fits beside the base's accuracy run (calibration.beside_base), measured before
    the base boots, and the gpu_memory_utilization the base is then served at when not the recipe's: the
    device's free memory against vLLM's share (utilization x usable memory) and calibration's need, first
    at the recipe's largest (samples x max_seq_len), then, where that does not fit beside the base at the
    recipe's utilization and fewer tokens could, at the tokens it will run on (counted with the base's
    tokenizer, a few seconds).
    ``tensor_parallel_size``: the base's (plan_base_boot). The run's steps decide on it (report/steps.py)."""
    r, c = validated.recipe, validated.recipe.calibration
    info = gpu.memory_info()
    weights = quantize.weights_bytes_on_disk(Path(base.local_dir))
    usable = gpu.usable_memory_bytes()

    def base_fits(utilization: float) -> bool:
        return capacity.fits_at(
            r,
            base.config,
            capacity.Boot.BASE,
            utilization,
            device_memory_bytes=usable,
            tensor_parallel_size=tensor_parallel_size,
        )

    def decide(tokens: int) -> tuple[bool, str, float | None]:
        activations = device.calibration_activation_bytes(base.config, r.quantization.method, tokens)
        return device.beside_base(
            r,
            free_bytes=info["free_bytes"] if info else None,
            usable_bytes=usable,
            need_bytes=device.calibration_need_bytes(weights, activations),
            base_fits=base_fits,
        )

    tokens, bound = c.num_samples * c.max_seq_len, "at most "
    now, why, utilization = decide(tokens)
    # the bound does not fit beside the base at the recipe's utilization: count, where a count can change it
    # (without a GPU, only with QS_AHEAD_AS_ON_GPU: a CPU host's answer does not depend on it)
    counted = (not now or utilization is not None) and decide(0)[0] if info else counts_calibration()
    if counted and c.beside_base != "never":
        tokens, bound = calibration_tokens(r, Path(base.local_dir)), ""
        now, why, utilization = decide(tokens)
    if (info or counted) and c.beside_base != "never":
        why = f"{why} ({bound}{tokens:,} calibration tokens)"
    get_run_logger().info("quantize beside the base's accuracy run: %s (%s)", "yes" if now else "no", why)
    return BesideBase(fits=now, why=why, served_at=utilization)
