"""Prefect tasks for validation and base-model resolution (thin wrappers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task

from quantize_serve.recipe.model import Recipe
from quantize_serve.validate import preflight as validate


@task(name="validate-recipe")
def validate_recipe(
    recipe: Recipe | str | Path, overrides: dict[str, Any] | None = None
) -> validate.ValidatedRecipe:
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
