"""Recipe checks that read files (small reads only, never weights): the model's ``config.json`` against
the recipe, the calibration data's columns and row count."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from quantize_serve.core.errors import RecipeError, RecipeErrors
from quantize_serve.recipe.model import Recipe
from quantize_serve.recipe.quantization import QuantizationSection


# The config.json keys whose value is the in_features of a down projection (0 or absent: no such MLP).
MLP_WIDTHS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size")


def show_path(path: Path) -> str:
    """A path as a person wants it in a message: relative to the working directory when inside it."""
    try:
        return os.path.relpath(path) if Path(path).resolve().is_relative_to(Path.cwd()) else str(path)
    except ValueError:
        return str(path)


def read_model_config(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / "config.json").read_text())


def check_model(recipe: Recipe, model_dir: Path, *, source: str) -> dict[str, Any]:
    """Check the recipe against the base model's config.json; return the config."""
    if not (model_dir / "config.json").is_file():
        raise RecipeError(
            source,
            "model.id",
            recipe.model.id,
            f"no model folder with a config.json at {show_path(model_dir)}",
            "point model.id at a Hugging Face model folder (relative paths resolve "
            "against the recipe's folder) or at a Hub repo id such as org/name",
        )
    config = read_model_config(model_dir)
    check_model_config(recipe, config, source=source)
    return config


def grouped_sizes(q: QuantizationSection) -> list[tuple[str, int]]:
    """(field, group size) of every 4-bit scheme the section quantizes (checkpoints bring their own)."""
    if q.candidates:
        return [
            (
                f"quantization.candidates[{i}].group_size" if c.group_size else "quantization.group_size",
                c.group_size or q.group_size,
            )
            for i, c in enumerate(q.candidates)
            if c.method and (c.scheme or q.scheme).startswith("W4")
        ]
    return [("quantization.group_size", q.group_size)] if q.method and q.scheme.startswith("W4") else []


ROUTER_IGNORE = "re:.*mlp.gate$"  # llm-compressor's MoE examples' pattern for the routers


def router_names(config: dict[str, Any]) -> list[str]:
    """Module names of one sparse layer's router gates, for a mixture of experts (else []): the router
    (``mlp.gate``, hidden -> experts) and Qwen2-MoE's shared-expert gate (a Linear of one output).
    vLLM builds both unquantized, so a quantized gate in the checkpoint would not load."""
    if not int(config.get("num_experts") or config.get("num_local_experts") or 0):
        return []
    shared = (
        ["model.layers.0.mlp.shared_expert_gate"] if config.get("shared_expert_intermediate_size") else []
    )
    return ["model.layers.0.mlp.gate", *shared]


def ignored(name: str, ignore: list[str]) -> bool:
    """Does an ignore entry match the module name, as compressed-tensors matches it (``re:`` a regular
    expression matched from the start, otherwise the exact name)?"""
    return any(re.match(p[3:], name) if p.startswith("re:") else p == name for p in ignore)


def check_model_config(recipe: Recipe, config: dict[str, Any], *, source: str) -> None:
    """Check the recipe against the base model's parsed config.json (a local or a Hub model)."""
    errors: list[RecipeError] = []
    q = recipe.quantization
    hidden = int(config.get("hidden_size") or 0)
    heads = int(config.get("num_attention_heads") or 1)
    head_dim = int(config.get("head_dim") or hidden // max(heads, 1))
    # in_features of the quantized linears: q/k/v/gate/up take hidden, o takes heads*head_dim,
    # down takes intermediate: the dense MLP's, each routed expert's (moe_intermediate_size; Mixtral's
    # experts use intermediate_size) and the shared expert's. Each must split into whole groups.
    dims = {"hidden_size": hidden, "num_attention_heads*head_dim": heads * head_dim}
    dims |= {key: int(config.get(key) or 0) for key in MLP_WIDTHS}
    for field, group_size in grouped_sizes(q):  # 8-bit schemes are per channel: no groups
        bad = {k: v for k, v in dims.items() if v and v % group_size}
        if bad and q.llmcompressor_recipe is None:
            divisors = sorted({g for g in (32, 64, 128) if all(v % g == 0 for v in dims.values() if v)})
            errors.append(
                RecipeError(
                    source,
                    field,
                    group_size,
                    f"does not divide the model's {', '.join(f'{k}={v}' for k, v in bad.items())}",
                    f"use a group size that divides them: {divisors or 'none of 32/64/128 does'}",
                )
            )
    quantizes = q.method is not None or any(c.method for c in q.candidates)
    gates = [n for n in router_names(config) if not ignored(n, q.ignore)]
    if gates and quantizes and q.llmcompressor_recipe is None:
        fix = [ROUTER_IGNORE] + (["re:.*shared_expert_gate$"] if any("shared" in g for g in gates) else [])
        errors.append(
            RecipeError(
                source,
                "quantization.ignore",
                list(q.ignore),
                f"leaves this mixture of experts' router gates ({', '.join(gates)}, and the same in every "
                "sparse layer) to be quantized; vLLM builds them unquantized and could not load them",
                f"add {', '.join(repr(f) for f in fix)} to quantization.ignore",
            )
        )
    max_pos = config.get("max_position_embeddings")
    if max_pos and recipe.serve.max_model_len > int(max_pos):
        errors.append(
            RecipeError(
                source,
                "serve.max_model_len",
                recipe.serve.max_model_len,
                f"exceeds the model's max_position_embeddings ({max_pos})",
                f"set serve.max_model_len to at most {max_pos}",
            )
        )
    tp = recipe.serve.tensor_parallel_size
    if heads % tp:
        errors.append(
            RecipeError(
                source,
                "serve.tensor_parallel_size",
                tp,
                f"does not divide num_attention_heads ({heads})",
                "use a tensor_parallel_size that divides the number of attention heads",
            )
        )
    if errors:
        raise RecipeErrors(errors) if len(errors) > 1 else errors[0]


def check_calibration_rows(recipe: Recipe, columns: list[str], num_rows: int, *, source: str) -> None:
    """The named field exists and there are enough rows (both numbers in the message)."""
    c = recipe.calibration
    field_name, field_key = (
        (c.text_field, "calibration.text_field")
        if c.text_field
        else (c.messages_field, "calibration.messages_field")
    )
    if field_name not in columns:
        raise RecipeError(
            source,
            field_key,
            field_name,
            f"the calibration data {c.dataset!r} has no such field (it has: {', '.join(columns)})",
            f"set {field_key} to one of: {', '.join(columns)}",
        )
    if num_rows < c.num_samples:
        raise RecipeError(
            source,
            "calibration.num_samples",
            c.num_samples,
            f"the calibration data {c.dataset!r} (split {c.split!r}) has only {num_rows} rows",
            f"lower calibration.num_samples to at most {num_rows} or add data",
        )
