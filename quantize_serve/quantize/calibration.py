"""Calibration data: load with `datasets`, check it, select the samples, render them to text.

Used twice: by the validation step (columns and row count, before any model is loaded) and by the
quantization child process (the texts it calibrates on). Both select rows the same way, so the
fingerprint computed in the parent is the fingerprint of what was calibrated on.

:func:`peek_calibration` answers the validation step's two questions (columns, rows) for local files
without `datasets` (stdlib readers; pyarrow's metadata for parquet), so the command line's
`quantize-serve validate` stays well under a second; the flow's validate stage still loads the data
with `datasets` and checks the selected samples.
"""

from __future__ import annotations

import csv
import hashlib
import json
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from quantize_serve.core import ahead
from quantize_serve.core.errors import RecipeError
from quantize_serve.recipe.inputs import check_calibration_rows, show_path
from quantize_serve.recipe.model import DATA_FORMATS, Recipe


def load_calibration(recipe: Recipe, *, source: str = "<recipe>") -> Any:
    """Load the calibration split as a `datasets.Dataset` (local files or a Hub dataset)."""
    import datasets

    c = recipe.calibration
    if recipe.calibration_is_local:
        files, builder = local_calibration_files(recipe, source=source)
        try:
            ds = datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train")
        except Exception as exc:  # datasets wraps the parser's error in its own classes
            cause = str(exc.__cause__ or exc).splitlines()[0][:200]
            raise RecipeError(
                source,
                "calibration.dataset",
                c.dataset,
                f"cannot be read as {builder} ({cause})",
                f"fix the file so that every row is valid {builder}",
            ) from None
    else:
        ds = load_hub_calibration(recipe, source=source)
    check_calibration_rows(recipe, list(ds.column_names), len(ds), source=source)
    return ds


def load_hub_calibration(recipe: Recipe, *, source: str = "<recipe>") -> Any:
    """``load_dataset(dataset, subset, split=split)`` from the Hub ``HF_ENDPOINT`` names; a dataset,
    config or split that is not there, or a Hub that cannot be reached, is a RecipeError naming the
    recipe field, its value and what the Hub has instead."""
    import datasets
    from datasets.exceptions import DatasetNotFoundError

    c = recipe.calibration
    endpoint = datasets.config.HF_ENDPOINT
    try:
        return datasets.load_dataset(c.dataset, c.subset, split=c.split, revision=c.revision)
    except DatasetNotFoundError as exc:
        raise RecipeError(
            source,
            "calibration.dataset",
            c.dataset,
            f"the Hub at {endpoint} has no such dataset, or not for this token ({_first_line(exc)})",
            "give the dataset's id as owner/name (set HF_TOKEN if it is private or gated, "
            "HF_ENDPOINT if it lives on another hub or mirror), or a local file",
        ) from None
    except ConnectionError as exc:  # offline mode, or the endpoint does not answer
        raise RecipeError(
            source,
            "calibration.dataset",
            c.dataset,
            f"the Hub at {endpoint} cannot be reached and the dataset is not in the local "
            f"datasets cache ({_first_line(exc)})",
            "unset HF_HUB_OFFLINE / HF_DATASETS_OFFLINE and set HF_ENDPOINT to a hub or mirror "
            "that serves it, or point calibration.dataset at a local file",
        ) from None
    except ValueError as exc:  # datasets says "BuilderConfig ... not found" / "Unknown split ..."
        configs = datasets.get_dataset_config_names(c.dataset)
        if c.subset not in configs and not (c.subset is None and len(configs) == 1):
            raise RecipeError(
                source,
                "calibration.subset",
                c.subset,
                f"the dataset {c.dataset!r} has no config {c.subset!r} (it has: {', '.join(configs)})",
                f"set calibration.subset to one of: {', '.join(configs)}",
            ) from None
        splits = datasets.get_dataset_split_names(c.dataset, c.subset)
        if c.split not in splits:
            where = f"{c.dataset!r}" + (f" (config {c.subset!r})" if c.subset else "")
            raise RecipeError(
                source,
                "calibration.split",
                c.split,
                f"the dataset {where} has no split {c.split!r} (it has: {', '.join(splits)})",
                f"set calibration.split to one of: {', '.join(splits)}",
            ) from None
        raise RecipeError(
            source,
            "calibration.dataset",
            c.dataset,
            f"cannot be loaded from the Hub at {endpoint} ({_first_line(exc)})",
            "check the dataset's files and the README's configs: block",
        ) from None


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__


def local_calibration_files(recipe: Recipe, *, source: str = "<recipe>") -> tuple[list[Path], str]:
    """The local calibration files (present, non-empty, one format) and their `datasets` builder."""
    c = recipe.calibration
    files = recipe.calibration_files()
    missing = [show_path(f) for f in files if not f.is_file()]
    if missing:
        raise RecipeError(
            source,
            "calibration.dataset",
            c.dataset,
            f"no such file: {', '.join(missing)}",
            "point calibration.dataset at a json/jsonl/csv/parquet/txt file "
            "(relative to the recipe's folder) or a Hub dataset id",
        )
    kinds = {DATA_FORMATS.get(f.suffix) for f in files}
    if None in kinds or len(kinds) != 1:
        raise RecipeError(
            source,
            "calibration.dataset",
            c.dataset,
            "files must all be one of .json, .jsonl, .csv, .parquet, .txt",
            "convert the data to one of those formats",
        )
    empty = [show_path(f) for f in files if f.stat().st_size == 0]
    if empty:
        raise RecipeError(
            source,
            "calibration.dataset",
            c.dataset,
            f"empty file: {', '.join(empty)}",
            "point calibration.dataset at a file with calibration rows",
        )
    return files, kinds.pop()


def peek_calibration(recipe: Recipe, *, source: str = "<recipe>") -> tuple[list[str], int]:
    """Columns and row count of local calibration files, counted the way `datasets` reads them,
    checked against the recipe (the field exists, enough rows). No `datasets` import."""
    files, builder = local_calibration_files(recipe, source=source)
    columns: dict[str, None] = {}
    rows = 0
    for f in files:
        try:
            names, n = _peek_file(f, builder)
        except (ValueError, csv.Error, OSError) as exc:
            raise RecipeError(
                source,
                "calibration.dataset",
                recipe.calibration.dataset,
                f"cannot be read as {builder} ({str(exc).splitlines()[0][:200]})",
                f"fix the file so that every row is valid {builder}",
            ) from None
        columns.update(dict.fromkeys(names))
        rows += n
    check_calibration_rows(recipe, list(columns), rows, source=source)
    return list(columns), rows


def _peek_file(path: Path, builder: str) -> tuple[list[str], int]:
    if builder == "text":  # one row per line, blank lines included (datasets' "text" builder)
        with path.open(encoding="utf-8") as fh:
            return ["text"], sum(1 for _ in fh)
    if builder == "csv":  # a header, then records (quoted newlines allowed); blank lines skipped
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            header = next(reader, [])
            return header, sum(1 for record in reader if record)
    if builder == "parquet":
        import pyarrow.parquet as pq

        meta = pq.read_metadata(path)
        return list(meta.schema.names), meta.num_rows
    text = path.read_text(encoding="utf-8")  # json: an array of records, one object, or JSON lines
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        records = whole if isinstance(whole, list) else [whole]
    keys = dict.fromkeys(k for r in records if isinstance(r, dict) for k in r)
    return list(keys), len(records)


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


def tokenize_calibration(recipe: Recipe, tokenizer: Any) -> tuple[Any, Any]:
    """(the selected rows, their token ids as calibration sees them): rendered, then tokenized and cut at
    calibration.max_seq_len. The quantization child calibrates on these; the flow counts them to size
    calibration's device memory before the base boots (tasks/quantize.py)."""
    rows = select_samples(recipe, load_calibration(recipe))
    chat = recipe.calibration.messages_field is not None
    encoded = tokenizer(
        render_texts(recipe, rows, tokenizer),
        truncation=True,
        max_length=recipe.calibration.max_seq_len,
        add_special_tokens=not chat,  # a chat template writes its own
    )
    return rows, encoded


def count_ahead(recipe: Recipe) -> Future[None]:
    """What :func:`calibration_tokens` needs before the base's tokenizer, started now as work ahead
    (core/ahead.py): the transformers and datasets imports and the dataset in its cache (4.7 s of the llama3
    recipe's 5.2 s count in a cold process on a 2-core CPU; the count took 14.0 s on one H100's host). Its
    errors stay in the future: the count raises its own."""

    def prepare() -> None:
        from transformers import AutoTokenizer  # noqa: F401 (the import is the work)

        load_calibration(recipe)

    return ahead.start(prepare)


def calibration_tokens(recipe: Recipe, model_dir: Path) -> int:
    """How many tokens calibration runs on, with the tokenizer of the model in ``model_dir``; after the work
    started ahead (:func:`count_ahead`), whose imports it shares."""
    ahead.settle()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=recipe.model.trust_remote_code)
    return sum(len(ids) for ids in tokenize_calibration(recipe, tokenizer)[1]["input_ids"])


def fingerprint(texts: list[str]) -> str:
    """sha256 over the selected samples, in order: the identity of the data calibrated on."""
    h = hashlib.sha256()
    for t in texts:
        h.update(hashlib.sha256(t.encode()).digest())
    return h.hexdigest()


def check_samples(recipe: Recipe, rows: Any, *, source: str = "<recipe>") -> None:
    """The selected rows hold what the recipe says: non-empty text, or well-formed chat messages
    (a list of {"role": str, "content": str}), before llm-compressor sees them."""
    c = recipe.calibration
    field = c.text_field or c.messages_field
    key = "calibration.text_field" if c.text_field else "calibration.messages_field"
    for i, value in enumerate(rows[field]):
        if c.text_field:
            ok = isinstance(value, str) and value.strip()
            shape = "a non-empty string"
        else:
            ok = (
                isinstance(value, list)
                and value
                and all(
                    isinstance(m, dict)
                    and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str)
                    for m in value
                )
            )
            shape = 'a non-empty list of {"role": ..., "content": ...} messages'
        if not ok:
            raise RecipeError(
                source,
                key,
                field,
                f"selected sample {i} of {c.dataset!r} is not {shape} (it is {_preview(value)})",
                f"fix or drop such rows, or set {key} to the column that holds "
                + ("plain text" if c.text_field else "chat messages"),
            )


def _preview(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def calibration_fingerprint(recipe: Recipe, *, source: str = "<recipe>") -> str:
    rows = select_samples(recipe, load_calibration(recipe, source=source))
    check_samples(recipe, rows, source=source)
    return fingerprint(render_texts(recipe, rows))


def pin_calibration(recipe: Recipe, commit_sha: str) -> Recipe:
    """The recipe with ``calibration.revision`` set to the Hub dataset's commit sha the run resolved,
    so every load (the validate stage's, the quantization worker's) reads that one commit."""
    return recipe.model_copy(
        update={"calibration": recipe.calibration.model_copy(update={"revision": commit_sha})}
    )


def describe(recipe: Recipe) -> dict[str, Any]:
    """The calibration data as the card names it; a Hub dataset with the revision the run loaded
    (the commit sha once validate_recipe pinned it)."""
    c = recipe.calibration
    hub = {} if recipe.calibration_is_local else {"revision": c.revision or "main (not pinned)"}
    return {
        **hub,
        "dataset": c.dataset if not recipe.calibration_is_local else Path(c.dataset).name,
        "split": c.split,
        "field": c.text_field or c.messages_field,
        "num_samples": c.num_samples,
        "max_seq_len": c.max_seq_len,
        "shuffle_seed": c.shuffle_seed,
    }
