"""The recipe's accuracy tasks as lm-eval loads them: a name stays a name; a task file becomes its config.

Task files: a task given as a path to a YAML (relative to the recipe's folder) may name its data
with paths relative to the YAML's own folder (``dataset_kwargs.data_files``/``data_dir``,
``dataset_path: ./...``). lm-eval would hand them to ``datasets`` as they are, i.e. relative to
the working directory, so the task is loaded here with lm-eval's own YAML loader, those paths
are made absolute, and the resulting config is passed to lm-eval inline. The YAML's folder is
also on lm-eval's ``include_path``, so a group or an ``include:`` next to it resolves by name.
The config that ran (with the absolute paths) is in the raw results JSON under ``configs``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from quantize_serve.core.errors import GateError
from quantize_serve.recipe.gates import AccuracyTask

TASK_FILE_SUFFIXES = (".yaml", ".yml")


class TaskSpec(BaseModel):
    task: AccuracyTask
    name: str  # lm-eval's task (or group) name
    load_spec: str | dict[str, Any]  # what TaskManager.load gets: a name, or a resolved config
    include_path: Path | None = None


def resolve_task(task: AccuracyTask, base_dir: Path) -> TaskSpec:
    """A task name stays a name; a YAML path becomes a config with absolute data paths."""
    if not task.task.endswith(TASK_FILE_SUFFIXES):
        return TaskSpec(task=task, name=task.task, load_spec=task.task)
    path = Path(task.task).expanduser()
    path = path if path.is_absolute() else (base_dir / path).resolve()
    if not path.is_file():
        raise GateError(
            f"accuracy task file {task.task!r} does not exist (looked at {path}). Fix: "
            "give gates.accuracy.tasks[].task as a path relative to the recipe's folder, "
            "or an lm-eval task name"
        )
    from lm_eval.tasks._yaml_loader import load_yaml  # lm-eval's own loader: !function, include:

    try:
        config = load_yaml(path, resolve_func=True, recursive=True)
    except Exception as exc:
        raise GateError(
            f"accuracy task file {path} cannot be loaded: {exc!r}. Fix: correct the YAML "
            "(lm-eval task format)"
        ) from exc
    if "task" not in config:  # a group or tag file: lm-eval loads it by path, siblings by name
        name = config.get("group") or config.get("tag")
        if not isinstance(name, str):
            raise GateError(
                f"accuracy task file {path} names no `task:` or `group:`. Fix: add "
                "`task: <name>` (see lm-eval's task guide)"
            )
        return TaskSpec(task=task, name=name, load_spec=str(path), include_path=path.parent)
    if not isinstance(config["task"], str):
        raise GateError(
            f"accuracy task file {path}: `task:` must be one name, got {config['task']!r}. "
            "Fix: one task per file, or a group file"
        )
    return TaskSpec(
        task=task,
        name=config["task"],
        load_spec=absolute_data_paths(config, path.parent),
        include_path=path.parent,
    )


def absolute_data_paths(config: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Resolve a task config's local data paths against the task file's folder."""
    config = dict(config)
    kwargs = dict(config.get("dataset_kwargs") or {})
    if "data_files" in kwargs:
        kwargs["data_files"] = _absolute(kwargs["data_files"], folder)
    if isinstance(kwargs.get("data_dir"), str):
        kwargs["data_dir"] = _absolute(kwargs["data_dir"], folder)
    if kwargs:
        config["dataset_kwargs"] = kwargs
    dataset_path = config.get("dataset_path")
    if isinstance(dataset_path, str) and dataset_path.startswith(("./", "../")):
        config["dataset_path"] = _absolute(dataset_path, folder)
    return config


def _absolute(value: Any, folder: Path) -> Any:
    if isinstance(value, str):
        if "://" in value or Path(value).expanduser().is_absolute():
            return value
        return str((folder / value).resolve())
    if isinstance(value, list):
        return [_absolute(v, folder) for v in value]
    if isinstance(value, dict):
        return {k: _absolute(v, folder) for k, v in value.items()}
    return value
