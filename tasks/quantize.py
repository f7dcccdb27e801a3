"""Prefect task for the quantization stage (never retried: a failure here is not transient)."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.logging import get_run_logger

from quantize_serve.hub.download import download_model
from quantize_serve.quantize import existing_checkpoint
from quantize_serve.quantize import run as quantize
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
