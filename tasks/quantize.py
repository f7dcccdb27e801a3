"""Prefect task for the quantization stage (never retried: a failure here is not transient)."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.logging import get_run_logger

from quantize_serve import existing_checkpoint, quantize
from quantize_serve.recipe import looks_local
from quantize_serve.validate import BaseModelRef, ValidatedRecipe


@task(name="quantize-model")
def quantize_model(validated: ValidatedRecipe, base: BaseModelRef) -> quantize.QuantizeResult:
    """Quantize the base model, or, with ``quantization.checkpoint``, check and use that checkpoint."""
    logger = get_run_logger()
    r = validated.recipe
    if r.quantization.checkpoint:
        folder, identity = checkpoint_folder(validated)
        result = existing_checkpoint.use_checkpoint(r, folder, Path(base.local_dir), source=validated.source,
                                                    identity=identity)
        logger.info("using the existing %s (%s) at %s: nothing to quantize", result.method, result.scheme,
                    result.source_checkpoint)
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
    (token as for the base model: validate.download_base). Its identity is ``repo@sha`` for the Hub."""
    from quantize_serve.hub import resolve_base_model, resolve_token

    r = validated.recipe
    q = r.quantization
    if looks_local(q.checkpoint) or r.path(q.checkpoint).exists():
        return r.path(q.checkpoint), None
    hub = r.hub
    resolved = resolve_base_model(q.checkpoint, revision=q.checkpoint_revision,
                                  token=resolve_token(hub) if hub else None,
                                  token_env=hub.token_env if hub else "HF_TOKEN",
                                  secret_block=hub.token_secret_block if hub else None)
    return Path(resolved.local_dir), f"{q.checkpoint}@{resolved.sha}"
