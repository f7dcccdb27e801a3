"""The accuracy gate: lm-evaluation-harness against a running vLLM server, base vs quantized.

:func:`run_accuracy` runs each task of the recipe's accuracy gate with lm-eval's Python API
(``lm_eval.simple_evaluate``) through the ``local-completions`` model, i.e. over HTTP against the
server's ``/v1/completions``. Loglikelihood tasks need the prompt's token logprobs, which vLLM
returns for ``echo: true, logprobs: 1, max_tokens: 1``; lm-eval tokenizes locally with the
model's own tokenizer and sends token ids (``tokenized_requests=True``), so the context /
continuation split it computes is exactly what the server scores (a string prompt would be
re-tokenized by vLLM with a BOS token, shifting that split by one).

:func:`compare_accuracy` is pure: it turns two runs into one check per task and metric, the way
llm-compressor's ``tests/lmeval`` does: recovery = quantized / base (base / quantized for metrics
where lower is better, like perplexity), passed when recovery >= the threshold (the task's
per-metric override, else the gate's ``default_recovery``). Absolute numbers are never gated.

Which metrics are gated: every numeric metric lm-eval reports for the task, except its
``*_stderr`` entries. For the shipped tasks that is ``acc`` and ``acc_norm`` (multiple choice:
they differ when choices differ in length, and a quantized model can lose one and not the
other, so both are kept), and ``word_perplexity``, ``byte_perplexity`` and ``bits_per_byte``
(perplexity: monotone in each other, but each is cheap and each is the number some reader
compares, so none is dropped; a threshold can be relaxed per metric in the recipe). A metric
computed under a filter other than lm-eval's ``none`` keeps lm-eval's own name,
``metric,filter`` (e.g. ``exact_match,strict-match``); that is also the key for a per-metric
``recovery`` override.

Uncertainty: lm-eval reports a standard error next to each metric (``<metric>_stderr,<filter>``;
"N/A" for perplexities, which lm-eval computes from corpus totals). :func:`recovery_interval`
carries the two into a ~95% interval on the recovery by the delta method (first-order error
propagation for a ratio r = x/y of independent estimates): se_r = r * sqrt((se_x/x)^2 +
(se_y/y)^2), interval r +- 1.96 * se_r. The formula is the same for quantized/base and
base/quantized. Base and quantized are scored on the same documents, so their errors are
positively correlated and the true interval is narrower: treating them as independent is
conservative. The gate still passes on the point recovery; when the interval crosses the
threshold the check carries a warning, or fails if the recipe sets
``gates.accuracy.on_uncertain: fail``. ``gates.accuracy.min_samples`` fails a task evaluated on
fewer documents. See docs/gates.md.

Task files: a task given as a path to a YAML (relative to the recipe's folder) may name its data
with paths relative to the YAML's own folder (``dataset_kwargs.data_files``/``data_dir``,
``dataset_path: ./...``). lm-eval would hand them to ``datasets`` as they are, i.e. relative to
the working directory, so the task is loaded here with lm-eval's own YAML loader, those paths
are made absolute, and the resulting config is passed to lm-eval inline. The YAML's folder is
also on lm-eval's ``include_path``, so a group or an ``include:`` next to it resolves by name.
The config that ran (with the absolute paths) is in the raw results JSON under ``configs``.

Task names: a task given by name (``gsm8k``, ``mmlu``...) is lm-eval's built-in YAML, whose data
``datasets.load_dataset`` fetches from the Hub that ``HF_ENDPOINT`` names (huggingface.co, a
mirror, or the project's local hub in tests). When it cannot (offline mode with nothing cached, an
unreachable endpoint, a repo the hub does not have), the GateError says which endpoint and how to
point it elsewhere; no request has reached the server by then.
"""

from __future__ import annotations

import json
import logging
import math
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from quantize_serve.core.errors import GateError
from quantize_serve.recipe.gates import AccuracyGate, AccuracyTask
from quantize_serve.recipe.model import ServeSection
from quantize_serve.serving.server import SERVED_NAME

log = logging.getLogger(__name__)

TASK_FILE_SUFFIXES = (".yaml", ".yml")
# One request of lm-eval (a batch of prompts) may take this long before it is retried.
REQUEST_TIMEOUT_S = 600
# lm-eval retries a failed request itself (tenacity, exponential backoff) this many times.
REQUEST_ATTEMPTS = 3
# lm-eval's concurrent requests when neither the caller nor the gate says (lm_eval_concurrency does).
DEFAULT_CONCURRENT = 4
# Two-sided ~95% normal quantile: the recovery interval is recovery +- Z_95 * se_recovery.
Z_95 = 1.96


class MetricResult(BaseModel):
    value: float
    stderr: float | None = None
    higher_is_better: bool | None = None  # None: lm-eval did not say


class TaskRun(BaseModel):
    """One task of the gate as lm-eval ran it."""

    task: str  # as written in the recipe: the key that pairs base and quantized runs
    lm_eval_name: str
    num_fewshot: int
    limit: int | float | None
    num_docs: int | None  # documents evaluated (after limit)
    metrics: dict[str, MetricResult]
    seconds: float
    results_path: str  # lm-eval's raw results JSON


class AccuracyRun(BaseModel):
    """Every task of one accuracy gate against one server."""

    server_base_url: str
    tasks: dict[str, TaskRun]
    seconds: float
    lm_eval_version: str


class AccuracyCheck(BaseModel):
    """One gated metric of one task: quantized vs base."""

    task: str
    metric: str
    base: float | None
    quantized: float | None
    recovery: float | None
    threshold: float
    passed: bool
    higher_is_better: bool | None
    reason: str
    # ~95% interval on the recovery (see recovery_interval); None when lm-eval gave no stderr
    recovery_interval: tuple[float, float] | None = None
    # set when the interval crosses the threshold: the point decision may be luck of the sample
    warning: str = ""

    @property
    def recovery_text(self) -> str:
        """The recovery as the report, card and decision show it: ``0.9973 [0.981, 1.014]``."""
        return format_recovery(self.recovery, self.recovery_interval)


def format_recovery(recovery: float | None, interval: tuple[float, float] | None) -> str:
    """``0.9973 [0.981, 1.014]``; the point alone without an interval, ``n/a`` without a recovery."""
    if recovery is None:
        return "n/a"
    point = f"{recovery:.4f}"
    return point if interval is None else f"{point} [{interval[0]:.3f}, {interval[1]:.3f}]"


# --------------------------------------------------------------------------------------------
# Running lm-eval
# --------------------------------------------------------------------------------------------


def lm_eval_concurrency(gate: AccuracyGate, serve: ServeSection) -> int:
    """lm-eval's concurrent requests: the gate's ``num_concurrent``, else the server's ``max_num_seqs``
    (every sequence slot busy; fewer left the server idle between batches, more only queue)."""
    return gate.num_concurrent or serve.max_num_seqs


def run_accuracy(
    server_base_url: str,
    gate: AccuracyGate,
    *,
    tokenizer_dir: str,
    max_length: int,
    base_dir: Path,
    output_dir: Path,
    num_concurrent: int | None = None,
) -> AccuracyRun:
    """Run every task of ``gate`` against the vLLM server at ``server_base_url``.

    ``tokenizer_dir`` is the served model's local tokenizer, ``max_length`` the server's
    ``max_model_len``, ``base_dir`` the recipe's folder (task YAML paths resolve against it).
    lm-eval's raw results go to ``output_dir/lm_eval_<task>.json``, the summary to
    ``output_dir/accuracy_run.json``. ``num_concurrent``: lm-eval's concurrent requests
    (:func:`lm_eval_concurrency`; default the gate's, else 4). Any failure raises :class:`GateError`.
    """
    if not gate.tasks:
        raise GateError("the accuracy gate has no tasks, so it cannot run. Fix: list lm-eval task "
                        "names or task YAML paths under gates.accuracy.tasks in the recipe")
    started = time.monotonic()
    output_dir.mkdir(parents=True, exist_ok=True)
    lm_eval = import_lm_eval()
    specs = [resolve_task(t, base_dir) for t in gate.tasks]  # file problems fail before any request
    check_server(server_base_url)
    task_manager = index_tasks(specs)
    lm = completions_model(server_base_url, gate, tokenizer_dir=tokenizer_dir, max_length=max_length,
                           num_concurrent=num_concurrent)
    runs: dict[str, TaskRun] = {}
    for spec in specs:
        t0 = time.monotonic()
        results = evaluate_task(lm, spec, task_manager, server_base_url)
        runs[spec.task.task] = record_task_run(spec, results, output_dir, seconds=time.monotonic() - t0)
    run = AccuracyRun(server_base_url=server_base_url, tasks=runs,
                      seconds=round(time.monotonic() - started, 1),
                      lm_eval_version=getattr(lm_eval, "__version__", "unknown"))
    (output_dir / "accuracy_run.json").write_text(run.model_dump_json(indent=2))
    return run


def import_lm_eval() -> Any:
    """lm-eval, imported only when the gate runs (it pulls in torch, transformers, datasets)."""
    try:
        import lm_eval
    except ImportError as exc:
        raise GateError(f"lm-eval cannot be imported ({exc}). Fix: install the pipeline environment "
                        "(`make setup`; it pins lm-eval[api])") from exc
    return lm_eval


def index_tasks(specs: list[_TaskSpec]) -> Any:
    """lm-eval's TaskManager over the task files' folders (and the built-in tasks if a task is
    named rather than given as a file: indexing lm-eval's ~15,000 built-in task files takes ~10 s)."""
    from lm_eval.tasks import TaskManager

    include_paths = sorted({str(s.include_path) for s in specs if s.include_path})
    needs_builtin = any(s.include_path is None for s in specs)
    try:
        return TaskManager(include_path=include_paths or None, include_defaults=needs_builtin)
    except Exception as exc:
        raise GateError(f"lm-eval could not index the task folders {include_paths}: {exc!r}. Fix: "
                        "check the task YAML files in those folders") from exc


def completions_model(server_base_url: str, gate: AccuracyGate, *, tokenizer_dir: str, max_length: int,
                      num_concurrent: int | None = None) -> Any:
    """lm-eval's ``local-completions`` model, pointed at the served model."""
    from lm_eval.api.registry import get_model

    model_args = {
        "base_url": f"{server_base_url.rstrip('/')}/v1/completions",
        "model": SERVED_NAME,
        "tokenizer": str(tokenizer_dir),
        "tokenizer_backend": "huggingface",
        "tokenized_requests": True,
        "max_length": max_length,
        "num_concurrent": num_concurrent or gate.num_concurrent or DEFAULT_CONCURRENT,
        "max_retries": REQUEST_ATTEMPTS,
        "timeout": REQUEST_TIMEOUT_S,
    }
    try:
        return get_model("local-completions").create_from_arg_obj(model_args, {"batch_size": gate.batch_size})
    except Exception as exc:
        raise GateError(f"lm-eval could not set up local-completions with the tokenizer at {tokenizer_dir}: "
                        f"{exc!r}. Fix: point tokenizer_dir at the served model's folder (it needs "
                        "tokenizer.json / tokenizer_config.json)") from exc


def evaluate_task(lm: Any, spec: _TaskSpec, task_manager: Any, server_base_url: str) -> dict[str, Any]:
    """One lm-eval task against the server; a failure says whether the server stopped answering."""
    import lm_eval

    log.info("lm-eval: %s (num_fewshot=%s, limit=%s) against %s", spec.task.task,
             spec.task.num_fewshot, spec.task.limit, server_base_url)
    try:
        results = lm_eval.simple_evaluate(
            model=lm,
            tasks=[spec.load_spec],
            num_fewshot=spec.task.num_fewshot,
            limit=spec.task.limit,
            task_manager=task_manager,
            log_samples=False,
        )
    except Exception as exc:
        if not _answers(server_base_url):  # the usual cause mid-run: say so, not "maybe"
            raise GateError(
                f"the vLLM server at {server_base_url} stopped answering during lm-eval task "
                f"{spec.task.task!r} ({_short(exc)}), so the accuracy gate failed. Fix: read its log "
                "(it died, was killed or hangs: the end of the log says which), then re-run"
            ) from exc
        data_error = _dataset_error(exc)
        if data_error is not None:  # the task's dataset did not load: no request was sent
            raise GateError(
                f"lm-eval could not load the data of task {spec.task.task!r} from the Hub at "
                f"{_hub_endpoint()}{_offline_note()} ({_short(data_error, 300)}). Fix: set HF_ENDPOINT to a "
                "hub or mirror that serves the task's dataset (lm-eval's task YAML names it: dataset_path, "
                "dataset_name), with HF_HUB_OFFLINE / HF_DATASETS_OFFLINE unset (and HF_TOKEN if it is "
                "gated); or give the task as a YAML file with local data files"
            ) from exc
        raise GateError(
            f"lm-eval failed on task {spec.task.task!r} against {server_base_url}: {exc!r}. "
            "Fix: if the server stopped answering, read its log; if the task did not load, "
            "check the task name (`lm_eval ls tasks`) or its YAML and data files"
        ) from exc
    if not results or not results.get("results"):
        raise GateError(f"lm-eval returned no results for task {spec.task.task!r}. Fix: check "
                        "that the task has documents in its test/validation split")
    return results


def record_task_run(spec: _TaskSpec, results: dict[str, Any], output_dir: Path, *, seconds: float) -> TaskRun:
    """Keep lm-eval's raw results beside the run and read the task's metrics out of them."""
    from lm_eval.utils import handle_non_serializable

    raw_path = output_dir / f"lm_eval_{_file_stem(spec.name)}.json"
    raw_path.write_text(json.dumps(results, indent=2, default=handle_non_serializable, ensure_ascii=False))
    run = TaskRun(
        task=spec.task.task,
        lm_eval_name=spec.name,
        num_fewshot=spec.task.num_fewshot,
        limit=spec.task.limit,
        num_docs=_num_docs(results, spec.name),
        metrics=extract_metrics(results, spec.name),
        seconds=round(seconds, 1),
        results_path=str(raw_path),
    )
    if not run.metrics:
        raise GateError(f"lm-eval reported no numeric metric for task {spec.task.task!r} "
                        f"(see {raw_path}). Fix: give the task a metric_list")
    return run


class _TaskSpec(BaseModel):
    task: AccuracyTask
    name: str  # lm-eval's task (or group) name
    load_spec: str | dict[str, Any]  # what TaskManager.load gets: a name, or a resolved config
    include_path: Path | None = None


def resolve_task(task: AccuracyTask, base_dir: Path) -> _TaskSpec:
    """A task name stays a name; a YAML path becomes a config with absolute data paths."""
    if not task.task.endswith(TASK_FILE_SUFFIXES):
        return _TaskSpec(task=task, name=task.task, load_spec=task.task)
    path = Path(task.task).expanduser()
    path = path if path.is_absolute() else (base_dir / path).resolve()
    if not path.is_file():
        raise GateError(f"accuracy task file {task.task!r} does not exist (looked at {path}). Fix: "
                        "give gates.accuracy.tasks[].task as a path relative to the recipe's folder, "
                        "or an lm-eval task name")
    from lm_eval.tasks._yaml_loader import load_yaml  # lm-eval's own loader: !function, include:

    try:
        config = load_yaml(path, resolve_func=True, recursive=True)
    except Exception as exc:
        raise GateError(f"accuracy task file {path} cannot be loaded: {exc!r}. Fix: correct the YAML "
                        "(lm-eval task format)") from exc
    if "task" not in config:  # a group or tag file: lm-eval loads it by path, siblings by name
        name = config.get("group") or config.get("tag")
        if not isinstance(name, str):
            raise GateError(f"accuracy task file {path} names no `task:` or `group:`. Fix: add "
                            "`task: <name>` (see lm-eval's task guide)")
        return _TaskSpec(task=task, name=name, load_spec=str(path), include_path=path.parent)
    if not isinstance(config["task"], str):
        raise GateError(f"accuracy task file {path}: `task:` must be one name, got {config['task']!r}. "
                        "Fix: one task per file, or a group file")
    return _TaskSpec(task=task, name=config["task"], load_spec=absolute_data_paths(config, path.parent),
                     include_path=path.parent)


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


def _dataset_error(exc: BaseException) -> BaseException | None:
    """The error in ``exc``'s chain that says a dataset could not be fetched or found, if any:
    offline mode or an unreachable hub (ConnectionError), a dataset, config or file the Hub does not
    have (datasets' DatasetsError, huggingface_hub's HfHubHTTPError)."""
    from datasets.exceptions import DatasetsError
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (ConnectionError, OfflineModeIsEnabled, DatasetsError, HfHubHTTPError)):
            return current
        current = current.__cause__ or current.__context__
    return None


def _hub_endpoint() -> str:
    import datasets.config

    return datasets.config.HF_ENDPOINT


def _offline_note() -> str:
    import datasets.config

    if not datasets.config.HF_HUB_OFFLINE:
        return ""
    return " (offline: HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set, so only the local datasets cache is read)"


def _answers(server_base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{server_base_url.rstrip('/')}/v1/models", timeout=5):
            return True
    except (urllib.error.URLError, OSError):
        return False


def _short(exc: BaseException, limit: int = 200) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_server(server_base_url: str) -> None:
    """Fail fast, with a clear message, when the server is not there or serves another name."""
    url = f"{server_base_url.rstrip('/')}/v1/models"
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            served = [m.get("id") for m in json.loads(resp.read()).get("data", [])]
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise GateError(f"the vLLM server at {server_base_url} did not answer {url}: {exc!r}. Fix: start "
                        "the server (quantize_serve.serving.server.vllm_server) and pass its base_url") from exc
    if SERVED_NAME not in served:
        raise GateError(f"the server at {server_base_url} serves {served}, not {SERVED_NAME!r}. Fix: "
                        f"start it with --served-model-name {SERVED_NAME} (vllm_server does)")


def extract_metrics(results: dict[str, Any], name: str) -> dict[str, MetricResult]:
    """Numeric metrics (with stderr and direction) of one lm-eval task or group from its results.

    A name with its own row (a task, or a group with aggregates) gives that row's metrics; a tag
    or a group without aggregates gives every member's, as ``member/metric``. A group's aggregate
    that lm-eval gives no direction (0.4.13: ``mmlu``'s ``acc``) takes the one all its members give.
    """
    rows: dict[str, dict[str, Any]] = results.get("results", {})
    directions: dict[str, dict[str, bool]] = results.get("higher_is_better", {})
    own = _row_metrics(rows.get(name, {}), {**_member_directions(results, name), **directions.get(name, {})})
    if own:
        return own
    merged: dict[str, MetricResult] = {}
    for row_name, row in rows.items():
        for metric, value in _row_metrics(row, directions.get(row_name, {})).items():
            merged[f"{row_name}/{metric}"] = value
    return merged


def _member_directions(results: dict[str, Any], name: str) -> dict[str, bool]:
    """The direction of each metric that every member of group ``name`` agrees on (none for a task)."""
    directions: dict[str, dict[str, bool]] = results.get("higher_is_better", {})
    seen: dict[str, set[bool]] = {}
    for member in _members(results, name):
        for metric, higher in directions.get(member, {}).items():
            if higher is not None:
                seen.setdefault(metric, set()).add(bool(higher))
    return {metric: values.pop() for metric, values in seen.items() if len(values) == 1}


def _row_metrics(row: dict[str, Any], directions: dict[str, bool]) -> dict[str, MetricResult]:
    metrics: dict[str, MetricResult] = {}
    for key, value in row.items():
        if "," not in key or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue  # "alias", "name", "sample_len"...: not metrics
        metric, filter_name = key.split(",", 1)
        if metric.endswith("_stderr"):
            continue
        stderr = row.get(f"{metric}_stderr,{filter_name}")
        name = metric if filter_name == "none" else key
        metrics[name] = MetricResult(
            value=float(value),
            stderr=_stderr(stderr),
            higher_is_better=directions.get(metric),
        )
    return metrics


def _stderr(value: Any) -> float | None:
    """lm-eval's stderr, or None where it has none: "N/A" (perplexities), NaN, a missing entry."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _members(results: dict[str, Any], name: str) -> list[str]:
    """Every member of group ``name``, its sub-groups' members included (none for a task)."""
    subtasks: dict[str, list[str]] = results.get("group_subtasks", {})
    members, todo = [], list(subtasks.get(name, []))
    while todo:  # groups of groups: their tasks
        member = todo.pop()
        members.append(member)
        todo += subtasks.get(member, [])
    return members


def _num_docs(results: dict[str, Any], name: str) -> int | None:
    """Documents evaluated: a task's own count, a group's the sum of its tasks' (lm-eval counts only
    tasks: ``mmlu`` at limit 20 is 57 tasks of 20); None when lm-eval did not count one of them."""
    counts: dict[str, Any] = results.get("n-samples", {})
    subtasks: dict[str, list[str]] = results.get("group_subtasks", {})
    tasks = [m for m in _members(results, name) if not subtasks.get(m)] or [name]
    docs = [counts.get(t, {}).get("effective") if isinstance(counts.get(t), dict) else None for t in tasks]
    return None if any(d is None for d in docs) else sum(docs)


def _file_stem(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


# --------------------------------------------------------------------------------------------
# Comparing two runs (pure)
# --------------------------------------------------------------------------------------------


