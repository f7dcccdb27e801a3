"""Calibration data: load with `datasets`, check it, select the samples, render them to text.

Used twice: by the validation step (columns and row count, before any model is loaded) and by the
quantization child process (the texts it calibrates on). Both select rows the same way, so the
fingerprint computed in the parent is the fingerprint of what was calibrated on.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from quantize_serve.errors import RecipeError
from quantize_serve.recipe import DATA_FORMATS, Recipe, check_calibration_rows


def load_calibration(recipe: Recipe, *, source: str = "<recipe>") -> Any:
    """Load the calibration split as a `datasets.Dataset` (local files or a Hub dataset)."""
    import datasets

    c = recipe.calibration
    if recipe.calibration_is_local:
        files = recipe.calibration_files()
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise RecipeError(source, "calibration.dataset", c.dataset,
                              f"no such file: {', '.join(missing)}",
                              "point calibration.dataset at a json/jsonl/csv/parquet/txt file "
                              "(relative to the recipe's folder) or a Hub dataset id")
        kinds = {DATA_FORMATS.get(f.suffix) for f in files}
        if None in kinds or len(kinds) != 1:
            raise RecipeError(source, "calibration.dataset", c.dataset,
                              "files must all be one of .json, .jsonl, .csv, .parquet, .txt",
                              "convert the data to one of those formats")
        builder = kinds.pop()
        ds = datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train")
    else:
        ds = datasets.load_dataset(c.dataset, c.subset, split=c.split)
    check_calibration_rows(recipe, list(ds.column_names), len(ds), source=source)
    return ds


def select_samples(recipe: Recipe, ds: Any) -> Any:
    """The rows calibrated on: a seeded shuffle, then the first num_samples."""
    c = recipe.calibration
    return ds.shuffle(seed=c.shuffle_seed).select(range(c.num_samples))


def render_texts(recipe: Recipe, rows: Any, tokenizer: Any | None = None) -> list[str]:
    """Plain text from text_field, or chat messages rendered with the tokenizer's template."""
    c = recipe.calibration
    if c.text_field:
        return [str(t) for t in rows[c.text_field]]
    if tokenizer is None:  # fingerprinting only: the raw messages identify the data exactly
        return [json.dumps(m, sort_keys=True) for m in rows[c.messages_field]]
    return [tokenizer.apply_chat_template(m, tokenize=False) for m in rows[c.messages_field]]


def fingerprint(texts: list[str]) -> str:
    """sha256 over the selected samples, in order: the identity of the data calibrated on."""
    h = hashlib.sha256()
    for t in texts:
        h.update(hashlib.sha256(t.encode()).digest())
    return h.hexdigest()


def calibration_fingerprint(recipe: Recipe, *, source: str = "<recipe>") -> str:
    return fingerprint(render_texts(recipe, select_samples(recipe, load_calibration(recipe, source=source))))


def describe(recipe: Recipe) -> dict[str, Any]:
    c = recipe.calibration
    return {
        "dataset": c.dataset if not recipe.calibration_is_local else Path(c.dataset).name,
        "split": c.split,
        "field": c.text_field or c.messages_field,
        "num_samples": c.num_samples,
        "max_seq_len": c.max_seq_len,
        "shuffle_seed": c.shuffle_seed,
    }
