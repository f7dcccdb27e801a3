"""Prefect task for the quantization stage (never retried: a failure here is not transient)."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.logging import get_run_logger

from quantize_serve.capacity.model_shape import language_model
from quantize_serve.hub.download import download_model
from quantize_serve.quantize import device, existing_checkpoint
from quantize_serve.quantize import run as quantize
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


def checkpoint_folder(validated: ValidatedRecipe) -> tuple[Path, str | None]:
    """The checkpoint's folder: the recipe's path, or the Hub repo pinned to a commit and downloaded
    (token as for the base model). Its identity is ``repo@sha`` for the Hub."""
    r = validated.recipe
    q = r.quantization
    if r.is_local(q.checkpoint):
        return r.path(q.checkpoint), None
    resolved = download_model(r, q.checkpoint, q.checkpoint_revision)
    return Path(resolved.local_dir), f"{q.checkpoint}@{resolved.sha}"


def beside_base(validated: ValidatedRecipe, base: BaseModelRef) -> tuple[bool, str]:
    """Whether this run quantizes beside its base's accuracy run (calibration.beside_base), decided before
    the base boots: the device memory its boot will leave (vLLM takes serve.gpu_memory_utilization of
    the usable memory) against calibration's need at the recipe's largest (samples x max_seq_len)."""
    r, c = validated.recipe, validated.recipe.calibration
    info, usable = gpu.memory_info(), gpu.usable_memory_bytes()
    left = (
        None
        if info is None or usable is None
        else info["free_bytes"] - int(r.serve.gpu_memory_utilization * usable)
    )
    hidden = int(language_model(base.config).get("hidden_size") or 0)  # a multimodal model's decoder's
    activations = c.num_samples * c.max_seq_len * hidden * 2  # 16-bit
    need = device.calibration_need_bytes(quantize.weights_bytes_on_disk(Path(base.local_dir)), activations)
    now, why = device.beside_base(r, free_bytes=left, need_bytes=need)
    get_run_logger().info("quantize beside the base's accuracy run: %s (%s)", "yes" if now else "no", why)
    return now, why
