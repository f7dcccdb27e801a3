"""Prefect task for the quantization stage (never retried: a failure here is not transient)."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.futures import PrefectFuture
from prefect.logging import get_run_logger

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


def quantize_beside_base(
    validated: ValidatedRecipe, base: BaseModelRef
) -> tuple[PrefectFuture[quantize.QuantizeResult] | None, str]:
    """With the base served: quantization started beside its accuracy run when ``calibration.beside_base``
    and the device memory the boot left allow it (quantize/device.py beside_base), else None; the reason."""
    info = gpu.memory_info()
    now, why = device.beside_base(
        validated.recipe,
        free_bytes=info["free_bytes"] if info else None,
        weights_bytes=quantize.weights_bytes_on_disk(Path(base.local_dir)),
        num_layers=int(base.config.get("num_hidden_layers") or 1),
    )
    get_run_logger().info("quantize beside the base's accuracy run: %s (%s)", "yes" if now else "no", why)
    return (quantize_model.submit(validated, base) if now else None), why
