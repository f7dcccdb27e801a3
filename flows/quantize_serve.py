"""The quantize-serve flow: the pipeline's table of contents. Composition only."""

from __future__ import annotations

import sys
from pathlib import Path

from prefect import flow

from quantize_serve.recipe import Recipe
from tasks.quantize import quantize_model
from tasks.validate import resolve_base_model, validate_recipe


@flow(name="quantize-serve", log_prints=True)
def quantize_serve(recipe: Recipe | str) -> dict:
    validated = validate_recipe(recipe)
    base = resolve_base_model(validated)
    checkpoint = quantize_model(validated, base)
    return {"base": base.model_dump(), "checkpoint": checkpoint.model_dump()}


if __name__ == "__main__":
    print(quantize_serve(Path(sys.argv[1]).as_posix()))
