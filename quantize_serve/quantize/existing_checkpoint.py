"""An already-quantized checkpoint as the release (``quantization.checkpoint``, or a candidate's
``checkpoint``): the "-AWQ" model a team downloads today, validated through the same capacity
boots, gates and promotion as one this pipeline quantized, without quantizing again.

vLLM serves three formats of 4- and 8-bit weights that such checkpoints come in: AutoAWQ's
(``quant_method: awq``), AutoGPTQ's (``gptq``) and llm-compressor's compressed-tensors. The scheme
is read from ``config.json``; the checkpoint must be of the recipe's base model (same architecture
and layer shapes), checked before anything boots.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from quantize_serve.core.errors import RecipeError
from quantize_serve.core.model_files import folder_digest
from quantize_serve.quantize.run import NOT_QUANTIZED, QuantizeResult, engine_versions, weights_bytes_on_disk
from quantize_serve.recipe.model import Recipe

FORMATS = ("awq", "gptq", "compressed-tensors")
# config.json fields a checkpoint must share with its base model (the quantized layers' shapes).
SHAPE_FIELDS = (
    "architectures",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)


def checkpoint_scheme(quantization: dict[str, Any]) -> str:
    """The scheme (recipe vocabulary) of a checkpoint's ``quantization_config``; ValueError when
    it is none of W4A16, W4A16_ASYM, W8A8 and FP8_DYNAMIC."""
    method = quantization.get("quant_method")
    if method == "awq":
        bits, asym = (
            quantization.get("bits", quantization.get("w_bit")),
            quantization.get("zero_point", False),
        )
        if bits == 4:
            return "W4A16_ASYM" if asym else "W4A16"
    elif method == "gptq":
        if quantization.get("bits") == 4:
            return "W4A16" if quantization.get("sym", True) else "W4A16_ASYM"
    elif method == "compressed-tensors":
        groups = list((quantization.get("config_groups") or {}).values())
        if groups:
            w, a = groups[0].get("weights") or {}, groups[0].get("input_activations")
            if w.get("num_bits") == 4 and w.get("type") == "int" and not a:
                return "W4A16" if w.get("symmetric", True) else "W4A16_ASYM"
            if w.get("num_bits") == 8 and a and a.get("num_bits") == 8 and a.get("dynamic"):
                scheme = {"int": "W8A8", "float": "FP8_DYNAMIC"}.get(w.get("type"))
                if scheme:
                    return scheme
    return _unknown(quantization)


def checkpoint_group_size(folder: Path) -> int | None:
    """The group size of a checkpoint's 4-bit weights (None: per channel)."""
    q = json.loads((Path(folder) / "config.json").read_text()).get("quantization_config") or {}
    groups = list((q.get("config_groups") or {}).values())
    size = q.get("group_size", q.get("q_group_size"))  # AutoAWQ / AutoGPTQ
    if size is None and groups:  # compressed-tensors
        size = (groups[0].get("weights") or {}).get("group_size")
    return int(size) if size and int(size) > 0 else None


def _unknown(quantization: dict[str, Any]) -> str:
    raise ValueError(
        f"its quantization_config ({json.dumps(quantization, sort_keys=True)[:300]}) is none of "
        "the schemes the pipeline compares (W4A16, W4A16_ASYM, W8A8 with dynamic int8 "
        "activations, FP8_DYNAMIC)"
    )


def check_checkpoint(
    folder: Path, base_config: dict[str, Any], *, source: str, field: str, value: str
) -> str:
    """The checkpoint's scheme, after checking it is a quantized checkpoint vLLM serves, of this base
    model. Reads config.json only."""
    config_path = Path(folder) / "config.json"
    if not config_path.is_file():
        raise RecipeError(
            source,
            field,
            value,
            f"has no config.json (looked in {folder})",
            "point it at a model folder or Hub repo holding config.json and the weights",
        )
    config = json.loads(config_path.read_text())
    quantization = config.get("quantization_config")
    if not quantization:
        raise RecipeError(
            source,
            field,
            value,
            "is not a quantized checkpoint: its config.json has no quantization_config",
            "name a checkpoint quantized with AutoAWQ, AutoGPTQ or "
            "llm-compressor, or quantize the base model (a candidate with method/scheme)",
        )
    if quantization.get("quant_method") not in FORMATS:
        raise RecipeError(
            source,
            field,
            value,
            f"is in format {quantization.get('quant_method')!r}, not one "
            f"the pipeline validates ({', '.join(FORMATS)})",
            "use a checkpoint in one of those formats, or quantize the base model instead",
        )
    try:
        scheme = checkpoint_scheme(quantization)
    except ValueError as exc:
        raise RecipeError(
            source, field, value, str(exc), "use a checkpoint of one of those schemes"
        ) from None
    differ = {
        k: (config.get(k), base_config.get(k))
        for k in SHAPE_FIELDS
        if k in base_config and config.get(k) != base_config.get(k)
    }
    if differ:
        raise RecipeError(
            source,
            field,
            value,
            "is not a checkpoint of the recipe's base model: "
            + ", ".join(f"{k} {mine!r} != base {base!r}" for k, (mine, base) in differ.items()),
            "name a quantized checkpoint of model.id, or set model.id to the checkpoint's base model "
            "(the gates compare it with that base)",
        )
    return scheme


def use_checkpoint(
    recipe: Recipe,
    folder: Path,
    base_dir: Path,
    base_config: dict[str, Any],
    *,
    source: str,
    identity: str | None = None,
) -> QuantizeResult:
    """The quantize stage's result for an existing checkpoint (nothing is quantized)."""
    q = recipe.quantization
    scheme = check_checkpoint(
        folder, base_config, source=source, field="quantization.checkpoint", value=q.checkpoint or str(folder)
    )
    fmt = json.loads((Path(folder) / "config.json").read_text())["quantization_config"]["quant_method"]
    return QuantizeResult(
        checkpoint_dir=str(folder),
        method=f"existing {fmt} checkpoint",
        scheme=scheme,
        seconds=0.0,
        base_bytes=weights_bytes_on_disk(base_dir),
        quantized_bytes=weights_bytes_on_disk(folder),
        calibration_fingerprint="",
        engine_versions=engine_versions(),
        cached=True,
        source_checkpoint=identity or f"local:{folder_digest(folder)}",
        format=fmt,
        device=NOT_QUANTIZED,
    )
