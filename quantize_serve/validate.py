"""Validate stage and base-model resolution: everything checked before anything heavy runs.

``validate_recipe`` loads the recipe (pydantic), checks the calibration data (field, row count)
and, for a local base model, its config.json against the recipe. ``resolve_base`` pins the base
model: a local folder is identified by the sha256 of its files, a Hub repo id is resolved to a
commit sha and that exact revision is downloaded.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import BaseModel

from quantize_serve.calibration import calibration_fingerprint
from quantize_serve.model_files import check_model_files
from quantize_serve.recipe import Recipe, check_model, load_recipe, parse_recipe


class ValidatedRecipe(BaseModel):
    recipe: Recipe
    source: str
    recipe_sha256: str
    calibration_fingerprint: str


class BaseModelRef(BaseModel):
    """The exact base model a run used: where it is on disk and what identifies it."""

    local_dir: str
    repo_id: str | None = None
    revision: str | None = None
    sha: str

    @property
    def identity(self) -> str:
        return f"{self.repo_id}@{self.sha}" if self.repo_id else f"local:{self.sha}"


def validate_recipe(recipe: Recipe | str | Path | dict) -> ValidatedRecipe:
    if isinstance(recipe, (str, Path)):
        source = str(recipe)
        recipe = load_recipe(recipe)
    elif isinstance(recipe, dict):
        source = "<parameters>"
        recipe = parse_recipe(recipe, source=source, base_dir=Path.cwd())
    else:
        source = f"<recipe {recipe.name}>"
    if recipe.model_is_local:
        model_dir = recipe.path(recipe.model.id)
        check_model_files(model_dir, source=source, value=recipe.model.id)  # first: config.json parses
        check_model(recipe, model_dir, source=source)
    return ValidatedRecipe(
        recipe=recipe,
        source=source,
        recipe_sha256=recipe.fingerprint(),
        calibration_fingerprint=calibration_fingerprint(recipe, source=source),
    )


def resolve_base(validated: ValidatedRecipe, *, token: str | None = None, cache_dir: Path | None = None) -> BaseModelRef:
    recipe = validated.recipe
    if recipe.model_is_local:
        local = recipe.path(recipe.model.id)
        return BaseModelRef(local_dir=str(local), sha=folder_digest(local))
    from quantize_serve.hub import resolve_base_model

    resolved = resolve_base_model(recipe.model.id, revision=recipe.model.revision, token=token,
                                  cache_dir=cache_dir)
    check_model_files(Path(resolved.local_dir), source=validated.source, value=recipe.model.id)
    check_model(recipe, Path(resolved.local_dir), source=validated.source)
    return BaseModelRef(local_dir=str(resolved.local_dir), repo_id=recipe.model.id,
                        revision=recipe.model.revision, sha=resolved.sha)


def folder_digest(folder: Path) -> str:
    """sha256 over a model folder's weights, config and tokenizer files (names and contents)."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in {".json", ".safetensors", ".model", ".txt", ".jinja"}):
        h.update(f.name.encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()
