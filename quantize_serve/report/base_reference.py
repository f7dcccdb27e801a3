"""A known base's reference: capacity row (a) and the base accuracy, measured once, reused by later runs.

A re-release of the same base measures the same base again: the same weights (base sha), booted with
the same serving settings by the same vLLM on the same hardware, scored on the same tasks. Its figures
are then the ones the first run measured; the boot and the lm-eval run only cost device time. So a run
that measured the base records them under a key of everything they depend on, and a later run with the
same key takes them instead of booting the base (the report says so, and from which run).

The key (:func:`reference_factors`): the base's identity (repo id and sha, or the local folder's
content sha); the base boot's vLLM settings as vLLM gets them (ServerSpec.vllm_config without its
folders: KV dtype and bytes, max_model_len, max_num_seqs, TP...); the accuracy tasks as the recipe
gives them (task, num_fewshot, limit, error rates), the gate's seed and scoring, with the bytes of each
task file and of the data files it names; the serving vLLM's version, the hardware (CPU and GPU models),
lm-eval's version.
Anything else changing means a new key, and the base is served again.

Stored as JSON in the work dir (``<work_dir>/base-references/<key>.json``), beside the checkpoint
cache: the same place a platform team keeps between runs.

The quantized checkpoint's 16-bit-KV capacity row (b), when a run booted it (serve.sixteen_bit_kv_row: boot;
a derived row is not kept), is kept there too, per format (:func:`format_key`: the recipe's quantization and
serve sections, less the serve fields that change no measurement). A re-release of the same base in the
same format has the same tensors' shapes and bytes (a new calibration changes their values, not their
sizes), so vLLM sizes the same KV cache; the row is reused and boot (b) skipped, and the report says from
which run. The production boot (c) is always served: the gates run on it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field

from quantize_serve.capacity.measure import CapacityConfig
from quantize_serve.gates.accuracy.run import AccuracyRun
from quantize_serve.recipe.model import SERVE_FIELDS_NOT_MEASURED, Recipe

FOLDER = "base-references"
# The accuracy gate's way of drawing documents and seeding their few-shot examples
# (gates/accuracy/documents.py): a base measured another way has other prompts or documents, and the paired
# gate cannot pair with it. v2: a perplexity task's longest documents come first (documents.take_all).
DOCUMENTS_PROTOCOL = "seeded-draw-per-document-fewshot-v2"
# vLLM settings that name folders of this host, not how the base is served
PATH_KEYS = ("model", "tokenizer")


class MeasuredRow(BaseModel):
    run_id: str  # the run that measured it
    capacity: CapacityConfig


class BaseReference(BaseModel):
    """The base's figures as one run measured them, and what they depend on."""

    key: str
    run_id: str  # the run that measured them
    run_dir: str
    capacity: CapacityConfig
    accuracy: AccuracyRun
    factors: dict[str, Any]
    # capacity row (b) of each format measured on this base under this key (:func:`format_key`)
    sixteen_bit_kv: dict[str, MeasuredRow] = Field(default_factory=dict)


def reference_factors(
    recipe: Recipe,
    base_identity: str,
    vllm_config: dict[str, Any],
    *,
    vllm_version: str | None,
    hardware: str,
    lm_eval_version: str | None,
) -> dict[str, Any]:
    """Everything the base's capacity and accuracy figures depend on (see the module's doc)."""
    base_dir = Path(recipe.base_dir)
    tasks = []
    for t in recipe.gates.accuracy.tasks:
        entry = t.model_dump(mode="json")
        if t.task.endswith((".yaml", ".yml")):
            entry["files_sha256"] = task_files_sha256(base_dir / t.task)
        tasks.append(entry)
    return {
        "base": base_identity,
        "serve": {k: v for k, v in vllm_config.items() if k not in PATH_KEYS},
        "tasks": tasks,
        # which documents and prompts: the seeded draw, and its per-document few-shot seeding
        "documents": {
            "seed": recipe.gates.accuracy.seed,
            "protocol": DOCUMENTS_PROTOCOL,
            "continue_to": recipe.gates.accuracy.continue_to,  # how many past each limit the draw holds
        },
        # how the requests reached vLLM (gates/accuracy/scoring.py): the same logprobs within bf16 noise,
        # but a base scored one way is not paired with a candidate scored the other
        "scoring": recipe.gates.accuracy.scoring,
        "vllm_version": vllm_version,
        "hardware": hardware,
        "lm_eval_version": lm_eval_version,
    }


def format_key(recipe: Recipe) -> str | None:
    """What decides row (b) beyond the base's key: the quantization (scheme, group size, ignored layers...,
    so the checkpoint's tensor bytes) and the serve settings (max_model_len, max_num_seqs, the memory
    budget...; not how they were found, nor whether (b) is booted: SERVE_FIELDS_NOT_MEASURED). Calibration is
    left out: it changes the weights' values, not their sizes. None when the run
    searches its serve settings (serve.search): the boot's settings are the search's, not the recipe's."""
    if recipe.serve.search and recipe.serve.search.enabled:
        return None
    return reference_key(
        {
            "quantization": recipe.quantization.model_dump(mode="json"),
            "serve": recipe.serve.model_dump(mode="json", exclude=set(SERVE_FIELDS_NOT_MEASURED)),
        }
    )


def reference_key(factors: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(factors, sort_keys=True, default=str).encode()).hexdigest()[:32]


def task_files_sha256(path: Path) -> str:
    """sha256 over a task YAML, the files it includes and the data files it names (relative to it)."""
    digest = hashlib.sha256()
    for file in sorted(set(_task_files(path.resolve(), depth=0))):
        digest.update(str(file.name).encode())
        digest.update(file.read_bytes() if file.is_file() else b"<missing>")
    return digest.hexdigest()


class _AnyTagLoader(yaml.SafeLoader):
    """lm-eval's task YAML, read for file names only (``!function`` and other tags become None)."""


_AnyTagLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def _task_files(path: Path, *, depth: int) -> list[Path]:
    files = [path]
    if depth > 3 or not path.is_file():
        return files
    config = yaml.load(path.read_text(), Loader=_AnyTagLoader) or {}  # noqa: S506 - a SafeLoader subclass
    if not isinstance(config, dict):
        return files
    include = config.get("include")
    if isinstance(include, str):
        files += _task_files(path.parent / include, depth=depth + 1)
    data_files = (config.get("dataset_kwargs") or {}).get("data_files")
    for name in _strings(data_files):
        files.append((path.parent / name).resolve())
    return files


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    return []


def reference_path(work_dir: Path, key: str) -> Path:
    return Path(work_dir) / FOLDER / f"{key}.json"


def find_reference(work_dir: Path, key: str) -> BaseReference | None:
    """The stored reference under ``key``, or None (none stored, or unreadable: measured again)."""
    path = reference_path(work_dir, key)
    try:
        reference = BaseReference.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None
    return reference if reference.key == key else None


def save_reference(work_dir: Path, reference: BaseReference) -> Path:
    path = reference_path(work_dir, reference.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(reference.model_dump_json(indent=2))
    partial.replace(path)  # atomic: a reader never sees half a file
    return path


def stored_for(work_dir: Path, repo_id: str | None) -> bool:
    """Whether a stored reference could be this base's: one of the Hub repo ``repo_id`` at any commit, or,
    for a local base (``repo_id`` None, known by its content's sha once hashed), one of any local base. A
    run that finds none boots its base whatever it resolves to."""
    prefix = f"{repo_id}@" if repo_id else "local:"
    for path in (Path(work_dir) / FOLDER).glob("*.json"):
        try:
            base = json.loads(path.read_text()).get("factors", {}).get("base")
        except (OSError, ValueError, AttributeError):
            continue
        if str(base).startswith(prefix):
            return True
    return False


def add_sixteen_bit_kv(work_dir: Path, key: str, fmt: str, row: MeasuredRow) -> None:
    """Keep row (b) of format ``fmt`` in the base reference under ``key`` (none stored: nothing to add to,
    since a run that did not complete the base's accuracy keeps nothing)."""
    reference = find_reference(work_dir, key)
    if reference is not None:
        reference.sixteen_bit_kv[fmt] = row
        save_reference(work_dir, reference)
