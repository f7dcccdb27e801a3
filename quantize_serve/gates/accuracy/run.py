"""The accuracy gate: lm-evaluation-harness against a running vLLM server, base vs quantized.

:func:`run_accuracy` runs each task of the recipe's accuracy gate with lm-eval's Python API
(``lm_eval.simple_evaluate``) through the ``local-completions`` model, i.e. over HTTP against the
server's ``/v1/completions``. Loglikelihood tasks need the prompt's token logprobs, which vLLM
returns for ``echo: true, logprobs: 1, max_tokens: 1``; lm-eval tokenizes locally with the
model's own tokenizer and sends token ids (``tokenized_requests=True``), so the context /
continuation split it computes is exactly what the server scores (a string prompt would be
re-tokenized by vLLM with a BOS token, shifting that split by one).

Documents: each task's documents are a seeded random draw of ``limit`` (per member task for a group
such as mmlu, so the draw is stratified by subject), given to lm-eval as ``samples=``, scored with
``log_samples`` so every document's outcome and prompt hash is kept (documents.py). A document's
few-shot examples are seeded by the document, so it gets the same prompt in any look. Metrics are
computed over the scored documents the way lm-eval aggregates them (mean; perplexities from summed
log-likelihoods), so a run stopped at an early look reports the documents it scored.

Looks: the base is scored on all its documents. The candidate, given the base's run
(``paired_with``), is scored look by look (``gates.accuracy.looks``: fractions of each task's limit, going
on past it where ``continue_to`` and the task allow; the draw holds the last look's documents) and stops at
the first look where recovery.task_decided says every metric's decision is clear. Each look is
one lm-eval call for every task still running (their requests of a kind go to the server as one stream).
The rule itself (paired, sequential, with stated error rates) is in recovery.py and paired.py, and
docs/gates.md.

Task files (a YAML path, its data paths relative to its folder): task_files.py.

Task names: a task given by name (``gsm8k``, ``mmlu``...) is lm-eval's built-in YAML, whose data
``datasets.load_dataset`` fetches from the Hub that ``HF_ENDPOINT`` names (huggingface.co, a
mirror, or the project's local hub in tests). When it cannot (offline mode with nothing cached, an
unreachable endpoint, a repo the hub does not have), the GateError says which endpoint and how to
point it elsewhere; no request has reached the server by then.
"""

from __future__ import annotations

import json
import math
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantize_serve.core.errors import GateError
from quantize_serve.gates.accuracy.documents import (
    LOG_AGGREGATIONS,
    MEAN_AGGREGATIONS,
    DocOutcome,
    aggregate,
    document_key,
    draw_documents,
    drawn,
    look_documents,
    outcomes,
    per_document_fewshot,
    take_all,
)
from quantize_serve.gates.accuracy.lanes import LaneModels, lanes, run_lanes
from quantize_serve.gates.accuracy.lm_eval_host import host_work_once
from quantize_serve.gates.accuracy.recovery import task_decided
from quantize_serve.gates.accuracy.results import (  # noqa: F401 (the gate's result types, importable from here)
    AccuracyCheck,
    AccuracyRun,
    MetricResult,
    TaskRun,
    format_recovery,
)
from quantize_serve.gates.accuracy.task_files import TaskSpec, resolve_task
from quantize_serve.recipe.gates import AccuracyGate
from quantize_serve.recipe.model import ServeSection
from quantize_serve.serving.metrics import read_gauges
from quantize_serve.serving.server import SERVED_NAME

# One request of lm-eval (a batch of prompts) may take this long before it is retried.
REQUEST_TIMEOUT_S = 600
# lm-eval retries a failed request itself (tenacity, exponential backoff) this many times.
REQUEST_ATTEMPTS = 3
# lm-eval's concurrent requests when neither the caller nor the gate says (lm_eval_concurrency does).
DEFAULT_CONCURRENT = 4
# vLLM's counters of the prompt tokens it was sent, and of those it read from its prefix cache
PROMPT_TOKENS, PROMPT_TOKENS_CACHED = "vllm:prompt_tokens_total", "vllm:prompt_tokens_cached_total"


# --------------------------------------------------------------------------------------------
# Running lm-eval
# --------------------------------------------------------------------------------------------


def lm_eval_concurrency(gate: AccuracyGate, serve: ServeSection) -> int:
    """lm-eval's concurrent requests: the gate's ``num_concurrent``, else every sequence slot."""
    return serve.concurrency(gate.num_concurrent)


def run_accuracy(
    server_base_url: str,
    gate: AccuracyGate,
    *,
    tokenizer_dir: str,
    max_length: int,
    base_dir: Path,
    output_dir: Path,
    num_concurrent: int | None = None,
    paired_with: AccuracyRun | None = None,
    reuse_rows: bool = False,
    log: Callable[[str], None] = print,
    prepared: Prepared | None = None,
    kv_cache_tokens: int | None = None,
) -> AccuracyRun:
    """Run every task of ``gate`` against the vLLM server at ``server_base_url``.

    ``tokenizer_dir`` is the served model's local tokenizer, ``max_length`` the server's
    ``max_model_len``, ``base_dir`` the recipe's folder (task YAML paths resolve against it).
    lm-eval's raw results go to ``output_dir/lm_eval_<task>.json``, the summary (with every document's
    outcome) to ``output_dir/accuracy_run.json``. ``num_concurrent``: lm-eval's concurrent requests
    (:func:`lm_eval_concurrency`; default the gate's, else 4). ``paired_with``: the base's run; a task
    it holds is scored look by look (``gate.looks``) and stops at the first look where its decision
    is clear (recovery.task_decided). ``reuse_rows``: the server runs vLLM's V2 model runner, so
    ``gate.scoring`` context-once may score multi-token continuations over the cached context
    (scoring.py). ``log``: a line as each look's lm-eval call starts. ``prepared``: this run's
    :func:`prepare_run`, done while the server booted (else done here). ``kv_cache_tokens``: the server's KV
    cache as its boot measured it; the requests in flight keep within it (lanes.py LaneModels). Any
    failure raises :class:`GateError`.
    """
    if not gate.tasks:
        raise GateError(
            "the accuracy gate has no tasks, so it cannot run. Fix: list lm-eval task "
            "names or task YAML paths under gates.accuracy.tasks in the recipe"
        )
    started = time.monotonic()
    output_dir.mkdir(parents=True, exist_ok=True)
    prepared = prepared or prepare_run(gate, base_dir)  # task file problems fail before any request
    check_server(server_base_url)
    before = prompt_token_counters(server_base_url)
    models = LaneModels(
        lambda: completions_model(
            server_base_url,
            gate,
            tokenizer_dir=tokenizer_dir,
            max_length=max_length,
            num_concurrent=num_concurrent,
            reuse_rows=reuse_rows,
            log=log,
        ),
        kv_tokens=kv_cache_tokens,
    )
    runs = run_tasks(models, prepared, gate, server_base_url, output_dir, paired_with, log)
    after = prompt_token_counters(server_base_url)
    sent, cached = (
        (int(after[k] - before[k]) if k in after and k in before else None)
        for k in (PROMPT_TOKENS, PROMPT_TOKENS_CACHED)
    )
    run = AccuracyRun(
        server_base_url=server_base_url,
        prompt_tokens=sent,
        prompt_tokens_computed=None if sent is None or cached is None else sent - cached,
        tasks=runs,
        seconds=round(time.monotonic() - started, 1),
        lm_eval_version=getattr(import_lm_eval(), "__version__", "unknown"),
        scoring=gate.scoring,
        scoring_counts=models.stats(),
        scoring_checks=models.checks(),
    )
    (output_dir / "accuracy_run.json").write_text(run.model_dump_json(indent=2))
    return run


@dataclass
class Prepared:
    """What a run does first and needs neither a server nor the tasks' data for (:func:`prepare_run`)."""

    specs: list[TaskSpec]
    task_manager: Any  # lm-eval's TaskManager (index_tasks)
    seconds: float


def prepare_run(gate: AccuracyGate, base_dir: Path) -> Prepared:
    """lm-eval's imports (its completions model's too), the task files and the task index, so the flow can do
    them as the server boots (tasks/accuracy.py prepare_accuracy): ~10 of the ~19 s a re-release's candidate
    run on the production task set spent before its first request on a 2-core CPU. Not the tasks' data
    (load_members): ``datasets`` swaps sys.stdout to hash lm-eval's functions, which another thread's prints
    would fall into."""
    started = time.monotonic()
    import_lm_eval()
    from transformers import AutoTokenizer  # noqa: F401 - what the completions model loads its tokenizer with

    from quantize_serve.gates.accuracy import scoring  # noqa: F401 - the completions model's (lm-eval's API models, torch)

    specs = [resolve_task(t, base_dir) for t in gate.tasks]
    return Prepared(specs, index_tasks(specs), round(time.monotonic() - started, 1))


@dataclass
class _TaskLooks:
    """One task across the looks: its members, its draw, the documents scored so far."""

    spec: TaskSpec
    members: dict[str, Any]
    order: dict[str, list[int]]
    task_docs: int  # the documents the task holds (its draw is order)
    take_all: list[str]  # the documents scored with certainty (a perplexity's longest)
    fractions: list[float]
    base: TaskRun | None
    seconds: float = 0.0
    documents: dict[str, DocOutcome] = field(default_factory=dict)
    chunk: dict[str, list[int]] = field(default_factory=dict)  # the documents this look adds
    run: TaskRun | None = None


def run_tasks(
    models: LaneModels,
    prepared: Prepared,
    gate: AccuracyGate,
    server_base_url: str,
    output_dir: Path,
    paired_with: AccuracyRun | None,
    log: Callable[[str], None],
) -> dict[str, TaskRun]:
    """Every task: its seeded draw of documents, scored look by look when the base's run holds it (all at
    once otherwise), each document's outcome kept. A look runs one lm-eval call per lane (:func:`lanes`)
    for every task still running, the lanes at the same time: lm-eval sends all of a call's requests of a
    kind as one stream, so the server's batches run full until the look's last request, not until each
    task's, and the generation tasks' decode steps carry the scoring tasks' prefills instead of running
    alone before them (lm-eval runs one request kind after the other within a call). A task stops at the
    first look where its decision is clear; its seconds are those of the calls it took part in."""
    tasks, task_manager = [], prepared.task_manager
    for spec in prepared.specs:
        t0 = time.monotonic()
        members = load_members(spec, task_manager)
        check_pairable(spec, members)  # before any request
        use_task_fewshot(spec, members)
        sizes = {name: len(task.eval_docs) for name, task in members.items()}
        limits = {name: drawn(size, spec.task.limit) for name, size in sizes.items()}
        # the looks, past the limit where the task holds more (gates.accuracy.continue_to): the draw holds all
        looks = gate.task_looks(
            min(sizes[m] / limits[m] for m in sizes if limits[m]) if any(limits.values()) else 1.0
        )
        # a perplexity's longest documents, scored at every look (the base's draw and the candidate's alike)
        certain = {
            name: take_all(lengths, max(1, round(gate.looks[0] * limits[name])))
            for name, lengths in rolling_lengths(members).items()
        }
        counts = {name: min(sizes[name], round(looks[-1] * n)) for name, n in limits.items()}
        order = draw_documents(sizes, counts, gate.seed, spec.task.task, certain)
        base = paired_with.tasks.get(spec.task.task) if paired_with else None
        fractions = looks if base is not None and base.documents else (looks[-1],)
        tasks.append(
            _TaskLooks(
                spec,
                members,
                order,
                sum(sizes.values()),
                [document_key(m, d) for m, docs in certain.items() for d in docs],
                list(fractions),
                base,
                time.monotonic() - t0,
            )
        )

    def look_call(call: list[_TaskLooks], lm: Any, look: int) -> None:
        t0 = time.monotonic()
        looks = [f"{t.spec.task.task} look {look + 1} of {len(t.fractions)}" for t in call]
        counts = [f"{sum(map(len, t.chunk.values()))} documents" for t in call]
        log(f"lm-eval: {', '.join(map(': '.join, zip(looks, counts)))} against {server_base_url}")
        samples = {member: docs for t in call for member, docs in t.chunk.items()}
        results = evaluate_tasks(
            lm,
            [t.spec for t in call],
            {n: m for t in call for n, m in t.members.items()},
            server_base_url,
            samples=samples,
            seed=gate.seed,
            task_manager=task_manager,
        )
        logged = results.pop("samples", None) or {}
        for t in call:
            t.documents.update(outcomes({m: rows for m, rows in logged.items() if m in t.members}))
            write_raw_results(t.spec, results_of(results, t.members), output_dir)
            t.seconds += time.monotonic() - t0
        log(f"lm-eval: {', '.join(looks)} done in {time.monotonic() - t0:.1f} s")

    running, look = list(tasks), 0
    # around the lanes' threads: they patch lm-eval's Task class and two of its functions
    with per_document_fewshot(gate.seed), host_work_once():
        while running:
            for t in running:
                end = t.fractions[-1]  # the looks are fractions of the limit; the draw holds the last one's
                t.chunk = look_documents(
                    t.order, t.fractions[look - 1] / end if look else 0.0, t.fractions[look] / end
                )
            run_lanes(
                lanes([t for t in running if t.chunk]), models, lambda call, lm: look_call(call, lm, look)
            )
            for t in [t for t in running if t.documents]:  # a small task's first looks may hold none of them
                t.run = task_run(
                    t.spec,
                    t.members,
                    t.order,
                    t.documents,
                    output_dir,
                    seconds=t.seconds,
                    looks_run=look + 1,
                    looks_planned=len(t.fractions),
                    looks=t.fractions,
                    task_docs=t.task_docs,
                    take_all=t.take_all,
                )
            running = [
                t
                for t in running
                if look < len(t.fractions) - 1
                and not (t.base and t.run and task_decided(t.base, t.run, gate, t.spec.task, look))
            ]
            look += 1
    return {t.spec.task.task: t.run for t in tasks if t.run is not None}


def use_task_fewshot(spec: TaskSpec, members: dict[str, Any]) -> None:
    """The recipe's few-shot count on each member, as simple_evaluate's ``num_fewshot`` would set it (a
    member whose config says 0 keeps 0): one call then scores tasks of different counts."""
    for task in members.values():
        if task.get_config("num_fewshot") != 0:
            task.set_config(key="num_fewshot", value=spec.task.num_fewshot)


# lm-eval's result entries keyed by task (member) name
PER_TASK_RESULTS = "results groups group_subtasks configs versions n-shot n-samples higher_is_better".split()


def results_of(results: dict[str, Any], members: dict[str, Any]) -> dict[str, Any]:
    """One task's part of a call's results (its members' entries), the rest as it is."""
    return {
        key: {n: v for n, v in value.items() if n in members}
        if key in PER_TASK_RESULTS and isinstance(value, dict)
        else value
        for key, value in results.items()
    }


def import_lm_eval() -> Any:
    """lm-eval, imported only when the gate runs (it pulls in torch, transformers, datasets)."""
    try:
        import lm_eval
    except ImportError as exc:
        raise GateError(
            f"lm-eval cannot be imported ({exc}). Fix: install the pipeline environment "
            "(`make setup`; it pins lm-eval[api])"
        ) from exc
    return lm_eval


def index_tasks(specs: list[TaskSpec]) -> Any:
    """lm-eval's TaskManager over the task files' folders (and the built-in tasks if a task is
    named rather than given as a file: indexing lm-eval's ~14,000 built-in task files takes ~5-10 s)."""
    from lm_eval.tasks import TaskManager

    include_paths = sorted({str(s.include_path) for s in specs if s.include_path})
    needs_builtin = any(s.include_path is None for s in specs)
    try:
        return TaskManager(include_path=include_paths or None, include_defaults=needs_builtin)
    except Exception as exc:
        raise GateError(
            f"lm-eval could not index the task folders {include_paths}: {exc!r}. Fix: "
            "check the task YAML files in those folders"
        ) from exc


def completions_model(
    server_base_url: str,
    gate: AccuracyGate,
    *,
    tokenizer_dir: str,
    max_length: int,
    num_concurrent: int | None = None,
    reuse_rows: bool = False,
    log: Callable[[str], None] | None = None,
) -> Any:
    """lm-eval's model for the served model: ``local-completions`` (``gate.scoring`` echo), or its
    subclass that computes each distinct context once (scoring.py), which says through ``log`` when
    it turns a path off."""
    from lm_eval.api.registry import get_model

    from quantize_serve.gates.accuracy import scoring  # lm-eval (and torch) load only when a gate runs

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
    name = "local-completions"
    if gate.scoring == "context-once":
        name, model_args = scoring.MODEL_NAME, model_args | {"reuse_rows": reuse_rows, "warn": log}
    try:
        return get_model(name).create_from_arg_obj(model_args, {"batch_size": gate.batch_size})
    except Exception as exc:
        raise GateError(
            f"lm-eval could not set up {name} with the tokenizer at {tokenizer_dir}: "
            f"{exc!r}. Fix: point tokenizer_dir at the served model's folder (it needs "
            "tokenizer.json / tokenizer_config.json)"
        ) from exc


def load_members(spec: TaskSpec, task_manager: Any) -> dict[str, Any]:
    """lm-eval's Task object of each member of the task (the task itself, or a group's tasks)."""
    from lm_eval.api.task import Task
    from lm_eval.tasks import get_task_dict

    try:
        loaded = get_task_dict([spec.load_spec], task_manager)
    except Exception as exc:
        raise data_or_task_error(exc, repr(spec.task.task)) from exc
    members: dict[str, Any] = {}
    todo = list(loaded.values())
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            todo += list(item.values())
        elif isinstance(item, Task):
            members[item.config.task] = item
    if not members:
        raise GateError(
            f"lm-eval loaded no task for {spec.task.task!r}. Fix: check the task name "
            "(`lm_eval ls tasks`) or its YAML"
        )
    return members


def evaluate_tasks(
    lm: Any,
    specs: list[TaskSpec],
    members: dict[str, Any],
    server_base_url: str,
    *,
    samples: dict[str, list[int]],
    seed: int,
    task_manager: Any,
) -> dict[str, Any]:
    """These documents of the tasks' members against the server in one lm-eval call, with per-document
    samples (each member's few-shot count set beforehand: use_task_fewshot); a failure says whether the
    server stopped answering. ``task_manager``: the run's (index_tasks), which simple_evaluate would
    otherwise build anew on every call, indexing every built-in task of lm-eval's (~14,000 YAML files: 4-5 s
    a call on a 2-core CPU)."""
    import lm_eval

    names = ", ".join(repr(spec.task.task) for spec in specs)
    try:
        results = lm_eval.simple_evaluate(
            model=lm,
            tasks=[members[name] for name in samples],
            samples=samples,
            log_samples=True,
            fewshot_random_seed=seed,
            task_manager=task_manager,
        )
    except Exception as exc:
        if not _answers(server_base_url):  # the usual cause mid-run: say so, not "maybe"
            raise GateError(
                f"the vLLM server at {server_base_url} stopped answering during lm-eval task {names} "
                f"({_short(exc)}), so the accuracy gate failed. Fix: read its log (it died, was killed or "
                "hangs: the end of the log says which), then re-run"
            ) from exc
        raise data_or_task_error(exc, names, server_base_url) from exc
    if not results or not results.get("results"):
        raise GateError(
            f"lm-eval returned no results for task {names}. Fix: check "
            "that the task has documents in its test/validation split"
        )
    return results


def data_or_task_error(exc: BaseException, names: str, server_base_url: str | None = None) -> GateError:
    """The GateError of task(s) ``names`` (each quoted) that did not load their data, or failed otherwise."""
    data_error = _dataset_error(exc)
    if data_error is not None:  # the task's dataset did not load: no request was sent
        return GateError(
            f"lm-eval could not load the data of task {names} from the Hub at "
            f"{_hub_endpoint()}{_offline_note()} ({_short(data_error, 300)}). Fix: set HF_ENDPOINT to a "
            "hub or mirror that serves the task's dataset (lm-eval's task YAML names it: dataset_path, "
            "dataset_name), with HF_HUB_OFFLINE / HF_DATASETS_OFFLINE unset (and HF_TOKEN if it is "
            "gated); or give the task as a YAML file with local data files"
        )
    where = f" against {server_base_url}" if server_base_url else ""
    return GateError(
        f"lm-eval failed on task {names}{where}: {exc!r}. "
        "Fix: if the server stopped answering, read its log; if the task did not load, "
        "check the task name (`lm_eval ls tasks`) or its YAML and data files"
    )


def write_raw_results(spec: TaskSpec, results: dict[str, Any], output_dir: Path) -> Path:
    """lm-eval's raw results of the task's latest look, beside the run (the per-document samples are
    kept, compactly, in the TaskRun)."""
    from lm_eval.utils import handle_non_serializable

    raw_path = output_dir / f"lm_eval_{_file_stem(spec.name)}.json"
    raw_path.write_text(json.dumps(results, indent=2, default=handle_non_serializable, ensure_ascii=False))
    return raw_path


def task_run(
    spec: TaskSpec,
    members: dict[str, Any],
    order: dict[str, list[int]],
    documents: dict[str, DocOutcome],
    output_dir: Path,
    *,
    seconds: float,
    looks_run: int,
    looks_planned: int,
    looks: list[float] | None = None,
    task_docs: int | None = None,
    take_all: list[str] | None = None,
) -> TaskRun:
    """The task as scored so far: its documents in the draw's order and its metrics over them."""
    ordered = {
        key: documents[key]
        for key in (document_key(m, d) for m, docs in order.items() for d in docs)
        if key in documents
    }
    run = TaskRun(
        task=spec.task.task,
        lm_eval_name=spec.name,
        num_fewshot=spec.task.num_fewshot,
        limit=spec.task.limit,
        num_docs=len(ordered),
        metrics=document_metrics(members, ordered),
        seconds=round(seconds, 1),
        results_path=str(output_dir / f"lm_eval_{_file_stem(spec.name)}.json"),
        documents=ordered,
        planned_docs=sum(map(len, order.values())),
        task_docs=task_docs,
        take_all=take_all or [],
        looks_run=looks_run,
        looks_planned=looks_planned,
        looks=looks or [1.0],
    )
    if not run.metrics:
        raise GateError(
            f"lm-eval reported no numeric metric for task {spec.task.task!r} "
            f"(see {run.results_path}). Fix: give the task a metric_list"
        )
    return run


def member_metrics(members: dict[str, Any]) -> tuple[dict[str, str], dict[str, bool]]:
    """lm-eval's aggregation (by name) and direction of each metric the task's members report."""
    aggregations: dict[str, str] = {}
    directions: dict[str, bool] = {}
    for task in members.values():
        for metric, fn in task.aggregation().items():
            aggregations.setdefault(metric, getattr(fn, "__name__", str(fn)))
        for metric, higher in task.higher_is_better().items():
            if higher is not None:
                directions.setdefault(metric, bool(higher))
    return aggregations, directions


def check_pairable(spec: TaskSpec, members: dict[str, Any]) -> None:
    """A metric lm-eval aggregates over the whole corpus (f1, bleu, mcc...) cannot be split per
    document, so the paired gate cannot decide on it: refused before any document is scored, never
    left out of the decision."""
    aggregations, _ = member_metrics(members)
    corpus = {m: a for m, a in aggregations.items() if a not in (*MEAN_AGGREGATIONS, *LOG_AGGREGATIONS)}
    if corpus:
        raise GateError(
            f"task {spec.task.task!r}: lm-eval aggregates {corpus} over the whole corpus, which the paired "
            "gate cannot split per document. Fix: gate a task whose metrics are means (accuracy, exact "
            "match) or perplexities, or give the task a metric_list of such metrics"
        )


def rolling_lengths(members: dict[str, Any]) -> dict[str, list[int]]:
    """Each perplexity member's documents' lengths in UTF-8 bytes (the text lm-eval scores whole:
    ``loglikelihood_rolling``), known before any request."""
    return {
        name: [len(str(task.doc_to_target(doc)).encode()) for doc in task.eval_docs]
        for name, task in members.items()
        if getattr(task, "OUTPUT_TYPE", None) == "loglikelihood_rolling"
    }


def document_metrics(members: dict[str, Any], documents: dict[str, DocOutcome]) -> dict[str, MetricResult]:
    """Each metric over these documents, pooled over a group's members (lm-eval's size-weighted mean),
    with lm-eval's aggregation and direction; the standard error of a mean."""
    aggregations, directions = member_metrics(members)
    names = list(dict.fromkeys(name for doc in documents.values() for name in doc.values))
    metrics: dict[str, MetricResult] = {}
    for name in names:
        base_name = name.split(",", 1)[0]
        aggregation = aggregations.get(base_name)
        if aggregation is None:  # a per-document value lm-eval aggregates into no metric
            continue
        values = [doc.values[name] for doc in documents.values() if name in doc.values]
        value = aggregate(values, aggregation)
        stderr = None
        if aggregation in MEAN_AGGREGATIONS and len(values) > 1:
            stderr = statistics.stdev(map(float, values)) / math.sqrt(len(values))  # type: ignore[arg-type]
        metrics[name] = MetricResult(
            value=value, stderr=stderr, higher_is_better=directions.get(base_name), aggregation=aggregation
        )
    return metrics


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
    return (
        " (offline: HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set, so only the local datasets cache is read)"
    )


def _answers(server_base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{server_base_url.rstrip('/')}/v1/models", timeout=5):
            return True
    except (urllib.error.URLError, OSError):
        return False


def _short(exc: BaseException, limit: int = 200) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def prompt_token_counters(server_base_url: str) -> dict[str, float]:
    """vLLM's prompt-token counters now (``/metrics``); {} when it does not answer or expose them."""
    try:
        with urllib.request.urlopen(f"{server_base_url.rstrip('/')}/metrics", timeout=30) as resp:
            return read_gauges(resp.read().decode(), (PROMPT_TOKENS, PROMPT_TOKENS_CACHED))
    except (urllib.error.URLError, OSError, ValueError):
        return {}


def check_server(server_base_url: str) -> None:
    """Fail fast, with a clear message, when the server is not there or serves another name."""
    url = f"{server_base_url.rstrip('/')}/v1/models"
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            served = [m.get("id") for m in json.loads(resp.read()).get("data", [])]
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise GateError(
            f"the vLLM server at {server_base_url} did not answer {url}: {exc!r}. Fix: start "
            "the server (quantize_serve.serving.server.vllm_server) and pass its base_url"
        ) from exc
    if SERVED_NAME not in served:
        raise GateError(
            f"the server at {server_base_url} serves {served}, not {SERVED_NAME!r}. Fix: "
            f"start it with --served-model-name {SERVED_NAME} (vllm_server does)"
        )


def _file_stem(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
