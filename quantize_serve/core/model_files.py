"""A model folder's files, checked before anything loads them: header reads only, never weights.

A folder with a missing shard, a truncated or corrupt ``.safetensors`` file or no tokenizer would
otherwise fail minutes later, deep inside llm-compressor or a vLLM boot, with a traceback that
names neither the file nor the fix. The safetensors format makes the check cheap: an 8-byte
little-endian header length, a JSON header whose ``data_offsets`` say where every tensor ends, then
the data; a complete file is exactly ``8 + header length + the largest end offset`` bytes long.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quantize_serve.core.digest import folder_sha256
from quantize_serve.core.errors import RecipeError

INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit on the header
GIB = 1024**3  # bytes in a GiB: how sizes of weights and memory are shown


def check_model_files(model_dir: Path, *, source: str, field: str = "model.id", value: str = "") -> None:
    """Raise RecipeError naming the file and the fix if the folder cannot be a loadable model."""
    value = value or str(model_dir)

    def error(problem: str, fix: str) -> RecipeError:
        return RecipeError(source, field, value, problem, fix)

    refetch = (
        "download the model again (a Hub id re-downloads what is missing), or point "
        f"{field} at a complete Hugging Face model folder"
    )
    if not (model_dir / "config.json").is_file():
        raise error(
            f"no model folder with a config.json at {model_dir}",
            f"point {field} at a Hugging Face model folder (relative paths resolve against the "
            "recipe's folder) or at a Hub repo id such as org/name",
        )
    try:
        json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise error(
            f"config.json in {model_dir} cannot be read as JSON ({exc.__class__.__name__})", refetch
        ) from None
    index = model_dir / INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError):
            raise error(f"{INDEX} in {model_dir} is not a valid safetensors index", refetch) from None
        missing = [s for s in shards if not (model_dir / s).is_file()]
        if missing:
            raise error(
                f"{len(missing)} of {len(shards)} weight shards named by {INDEX} are missing "
                f"(first: {missing[0]})",
                refetch,
            )
        weights = [model_dir / s for s in shards]
    else:
        weights = sorted(model_dir.glob("*.safetensors"))
    if not weights and not any(model_dir.glob("*.bin")):
        raise error(f"no weights in {model_dir} (no *.safetensors, no {INDEX}, no *.bin)", refetch)
    for path in weights:
        problem = safetensors_problem(path)
        if problem:
            raise error(f"{path.name} is corrupt: {problem}", refetch)
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        raise error(
            f"no tokenizer in {model_dir} (none of {', '.join(TOKENIZER_FILES)})",
            "add the tokenizer files of the base model to the folder (quantizing and serving both need them)",
        )


def safetensors_problem(path: Path) -> str:
    """What is wrong with a safetensors file's framing, or "" when it is complete."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return f"{size} bytes, shorter than the 8-byte header length"
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(MAX_HEADER_BYTES, size - 8):
            return f"header length {header_len} does not fit a file of {size} bytes"
        try:
            header = json.loads(fh.read(header_len))
        except ValueError:
            return "the JSON header does not parse"
    if not isinstance(header, dict):
        return "the JSON header is not a mapping"
    try:
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (KeyError, TypeError, ValueError, IndexError):
        return "a tensor entry in the header has no valid data_offsets"
    expected = 8 + header_len + end
    if size != expected:
        return f"{size} bytes on disk, {expected} expected from its header (truncated or padded)"
    return ""


MODEL_FILE_SUFFIXES = {".json", ".safetensors", ".model", ".txt", ".jinja"}


def folder_digest(folder: Path) -> str:
    """sha256 over a model folder's weights, config and tokenizer files (names and contents)."""
    return folder_sha256(folder, include=lambda p: p.suffix in MODEL_FILE_SUFFIXES)


def language_model(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """The decoder's config: ``text_config`` of a multimodal config, with the outer dtype and tying."""
    if "num_hidden_layers" not in data and isinstance(data.get("text_config"), Mapping):
        inner = {**data["text_config"]}
        for key in ("tie_word_embeddings", "torch_dtype", "dtype", "architectures"):
            if key not in inner and key in data:
                inner[key] = data[key]
        return inner
    return data
