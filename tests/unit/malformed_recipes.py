"""Malformed recipes, each with the field its error must name and a word its fix must hold.

Shared by tests/unit/test_cli.py and benchmarks/validate_cli.py. Each case is the shipped offline recipe
(recipes/tiny-llama-awq.yaml) with one thing changed, or a raw text. :func:`write_case` writes it
into any folder, with the recipe's relative paths re-pointed from there, so the model, the
calibration data and the task files still resolve and only the one mistake remains.

``ISSUE_CASES`` are the fourteen mistakes of issue 11; ``CROSS_SECTION_CASES`` are the rules that
need only the recipe and used to fail after quantizing and booting (stress profile vs
max_model_len, stress concurrency vs max_num_seqs, release ref names, the profile search, bounds).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
BASE_RECIPE = ROOT / "recipes" / "tiny-llama-awq.yaml"
PATH_FIELDS = (("model", "id"), ("calibration", "dataset"))

Change = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Case:
    name: str
    field: str  # the field the error names
    fix: str  # a word the fix (or the problem) holds
    change: Change | None = None  # applied to the shipped recipe's mapping
    text: str | None = None  # or the whole file


def put(dotted: str, value: Any) -> Change:
    """Set a dotted key (``serve.search.max_boots``; list items by index: ``gates.accuracy.tasks.0``)."""

    def change(data: dict[str, Any]) -> None:
        *parents, leaf = dotted.split(".")
        node: Any = data
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        node[leaf] = value

    return change


def rename(dotted: str, new: str) -> Change:
    """Rename the last key of a dotted path (``quantization`` or ``quantization.group_size``)."""

    def change(data: dict[str, Any]) -> None:
        *parents, leaf = dotted.split(".")
        node = data
        for part in parents:
            node = node[part]
        node[new] = node.pop(leaf)

    return change


def both(*changes: Change) -> Change:
    def change(data: dict[str, Any]) -> None:
        for c in changes:
            c(data)

    return change


BAD_YAML_LINE = "    bits: 4"  # a key indented under a value: "mapping values are not allowed here"


def _yaml_syntax_error() -> str:
    text = BASE_RECIPE.read_text()
    broken = text.replace("  method: awq\n", f"  method: awq\n{BAD_YAML_LINE}\n", 1)
    assert broken != text
    return broken


def _yaml_error_place() -> str:
    """Where PyYAML stops: the line added, at its ':'."""
    line = _yaml_syntax_error().splitlines().index(BAD_YAML_LINE) + 1
    return f"line {line}, column {BAD_YAML_LINE.index(':') + 1}"


ISSUE_CASES: list[Case] = [
    Case("misspelled-section", "quantisation", "quantization", change=rename("quantization", "quantisation")),
    Case("method-awq2", "quantization.method", "gptq", change=put("quantization.method", "awq2")),
    Case("scheme-w3a16", "quantization.scheme", "W4A16", change=put("quantization.scheme", "W3A16")),
    Case("num-samples-0", "calibration.num_samples", "above 0", change=put("calibration.num_samples", 0)),
    Case(
        "max-model-len-beyond-model",
        "serve.max_model_len",
        "at most 1024",
        change=put("serve.max_model_len", 4096),
    ),
    Case("kv-cache-dtype-fp9", "serve.kv_cache_dtype", "fp8", change=put("serve.kv_cache_dtype", "fp9")),
    Case("missing-model-folder", "model.id", "model folder", change=put("model.id", "no-such-model")),
    Case("yaml-syntax-error", _yaml_error_place(), "indent", text=_yaml_syntax_error()),
    Case("empty-file", "<file>", "recipes/tiny-llama-awq.yaml", text=""),
    Case(
        "token-in-recipe", "hub.token", "token_env", change=put("hub.token", "hf_abcdefghijklmnopqrstuvwxyz")
    ),
    Case(
        "wrong-text-field", "calibration.text_field", "text", change=put("calibration.text_field", "content")
    ),
    Case("odd-group-size", "quantization.group_size", "even", change=put("quantization.group_size", 127)),
    Case(
        "negative-concurrency",
        "gates.stress.concurrency",
        "above 0",
        change=put("gates.stress.concurrency", -4),
    ),
    Case(
        "retired-default-recovery",
        "gates.accuracy",
        "error_rates",
        change=put("gates.accuracy.default_recovery", 0.95),
    ),
    Case(
        "bad-recovery-1.5",
        "gates.accuracy.error_rates.bad_recovery",
        "0.93",
        change=put("gates.accuracy.error_rates.bad_recovery", 1.5),
    ),
]

CROSS_SECTION_CASES: list[Case] = [
    Case(
        "stress-prompt-beyond-max-model-len",
        "gates.stress.prompt_tokens",
        "max_model_len",
        change=put("gates.stress.prompt_tokens", [16, 64, 500]),
    ),
    Case(
        "stress-output-fills-max-model-len",
        "gates.stress.output_tokens",
        "max_model_len",
        change=both(put("gates.stress.prompt_tokens", [1]), put("gates.stress.output_tokens", [510])),
    ),
    Case(
        "stress-concurrency-above-max-num-seqs",
        "gates.stress.concurrency",
        "max_num_seqs",
        change=put("gates.stress.concurrency", 32),
    ),
    Case(
        "stress-concurrency-above-search-range",
        "gates.stress.concurrency",
        "unset",
        change=put("serve.search", {"min_num_seqs": 4, "max_num_seqs": 8}),
    ),
    Case(
        "search-range-inverted",
        "serve.search",
        "min_num_seqs",
        change=put("serve.search", {"min_num_seqs": 8, "max_num_seqs": 4}),
    ),
    Case(
        "search-too-many-boots",
        "serve.search.max_boots",
        "at most 20",
        change=put("serve.search", {"max_boots": 100}),
    ),
    Case("release-ref-main", "hub.release_ref", "production", change=put("hub.release_ref", "main")),
    Case(
        "release-ref-rejection-tag",
        "hub.release_ref",
        "production",
        change=put("hub.release_ref", "rejected-v1"),
    ),
    Case(
        "release-ref-not-a-ref", "hub.release_ref", "letters", change=put("hub.release_ref", "prod release")
    ),
    Case(
        "commit-message-placeholder",
        "hub.commit_message",
        "{base_model}",
        change=put("hub.commit_message", "{method} of {model}"),
    ),
    Case(
        "task-bad-recovery-2",
        "gates.accuracy.tasks.0.error_rates.bad_recovery",
        "0.93",
        change=put("gates.accuracy.tasks.0.error_rates", {"bad_recovery": 2.0}),
    ),
    Case(
        "limit-fraction-1.5",
        "gates.accuracy.tasks.0.limit",
        "fraction",
        change=put("gates.accuracy.tasks.0.limit", 1.5),
    ),
    Case(
        "misspelled-key",
        "quantization.gruop_size",
        "group_size",
        change=rename("quantization.group_size", "gruop_size"),
    ),
    Case(
        "missing-task-file",
        "gates.accuracy.tasks.1.task",
        "task",
        change=put("gates.accuracy.tasks.1.task", "../evals/tasks/no_such_task.yaml"),
    ),
]


def recipe_data(folder: Path) -> dict[str, Any]:
    """The shipped recipe as a mapping, its relative paths re-pointed from ``folder``."""
    data = yaml.safe_load(BASE_RECIPE.read_text())

    def moved(value: str) -> str:
        return os.path.relpath((BASE_RECIPE.parent / value).resolve(), folder.resolve())

    for section, key in PATH_FIELDS:
        data[section][key] = moved(data[section][key])
    for task in data["gates"]["accuracy"]["tasks"]:
        if task["task"].endswith((".yaml", ".yml")):
            task["task"] = moved(task["task"])
    return data


def write_case(case: Case, folder: Path) -> Path:
    """``folder/<name>.yaml`` holding the case."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{case.name}.yaml"
    if case.text is not None:
        path.write_text(case.text)
        return path
    data = recipe_data(folder)
    assert case.change is not None
    case.change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
