"""Prefect tasks for validation and base-model resolution (thin wrappers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task

from quantize_serve.core.errors import HubError
from quantize_serve.core.settings import get_settings
from quantize_serve.hub.client import resolve_token
from quantize_serve.hub.download import base_model_cache
from quantize_serve.recipe.model import Recipe
from quantize_serve.report.steps import baseline_overrides
from quantize_serve.validate import preflight as validate


@task(name="validate-recipe")
def validate_recipe(
    recipe: Recipe | str | Path, overrides: dict[str, Any] | None = None
) -> validate.ValidatedRecipe:
    """The recipe with the run's ``overrides`` (and, with QS_STEPS=baseline, the recipe's speed-ups off:
    report/steps.py), validated, checked against this host."""
    overrides = {**(overrides or {}), **baseline_overrides(get_settings())} or None
    validated = validate.validate_recipe(recipe, overrides)
    validate.check_quantize_host(validated.recipe, source=validated.source)
    validate.check_serving_host(validated.recipe, source=validated.source)
    return validated


# No task-level retries: quantize_serve.hub.client retries transient failures (5xx, 429, dropped
# connections) itself, with backoff, and never a 401/403/404, which no retry can fix.
# No token parameter: Prefect records a task's inputs, so validate.resolve_base reads the token
# itself (the recipe's hub.token_env or hub.token_secret_block, else HF_TOKEN).
@task(name="resolve-base-model")
def resolve_base_model(validated: validate.ValidatedRecipe) -> validate.BaseModelRef:
    return validate.resolve_base(validated)


@task(name="base-architectures")
def base_architectures(validated: validate.ValidatedRecipe) -> list[str]:
    """The base's config.json ``architectures`` before its weights download, for the base's boot to inspect
    ahead (tasks/boot.py prepare_boot): from its folder, or that one file from the Hub (one attempt, into
    the cache the download then finds it in); none when they cannot be had now: resolve-base-model, with
    its retries, then says why."""
    recipe = validated.recipe
    try:
        token = resolve_token(recipe.hub) if recipe.hub else None
        config = validate.base_config(recipe, token=token, cache_dir=base_model_cache()) or {}
    except (HubError, OSError, ValueError):
        return []
    return list(config.get("architectures") or [])
