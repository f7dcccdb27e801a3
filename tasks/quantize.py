"""Prefect task for the quantization stage (never retried: a failure here is not transient)."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.logging import get_run_logger

from quantize_serve import quantize
from quantize_serve.validate import BaseModelRef, ValidatedRecipe


@task(name="quantize-model")
def quantize_model(validated: ValidatedRecipe, base: BaseModelRef) -> quantize.QuantizeResult:
    logger = get_run_logger()
    return quantize.quantize_model(
        validated.recipe,
        Path(base.local_dir),
        base_identity=base.identity,
        calibration_fingerprint=validated.calibration_fingerprint,
        log=logger.info,
    )
