"""The local production stack the release drivers run on (h200_llama3.py, h200_release_time.py): the 8B
base under Meta's id on a local Hub, and the ``llama3`` deployment of prefect.yaml with this host's serving
Python; and the production task set those runs score, built by lm-eval on CPU (request_building.py,
context_order.py)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from benchmarks.harness import BUILD_MARKER, ROOT, TOKENIZER, load_scenario
from quantize_serve.gates.accuracy import load_members, prepare_run, use_task_fewshot
from quantize_serve.gates.documents import draw_documents
from quantize_serve.recipe.gates import AccuracyGate, AccuracyTask
from quantize_serve.recipe.load import load_recipe

BASE_ID = "meta-llama/Meta-Llama-3-8B-Instruct"
DEPLOYMENT = "llama3"
STACK_TOKEN = "hf_local_h200_endpoint_token"  # the local endpoint's own token, not a Hub secret
PRODUCTION_RECIPE = ROOT / "recipes" / "llama3-8b-instruct-awq.yaml"


def publish_base(api: Any, model_dir: Path, scratch: Path, *, keep: bool) -> str:
    """The base model under Meta's id, with an ``original/`` folder as Meta's repos have (a placeholder the
    download must skip). The commit it is at. Unless ``keep``, the built weights go once the Hub holds them
    (disk: 64 GiB hosts; each run downloads its own copy), and the build's marker with them: the Hub is the
    stack's, gone with it, so the next driver on this host builds again rather than publish a model with no
    weights."""
    api.create_repo(BASE_ID, private=True, exist_ok=True)
    original = scratch / "original"
    original.mkdir(parents=True, exist_ok=True)
    (original / "params.json").write_text(json.dumps({"note": "placeholder for Meta's original/ weights"}))
    (original / "consolidated.00.pth").write_bytes(b"\0" * (8 << 20))  # 8 MiB placeholder, never needed
    api.upload_folder(
        repo_id=BASE_ID,
        folder_path=str(model_dir),
        commit_message="base model",
        ignore_patterns=[BUILD_MARKER],
    )
    sha = api.upload_folder(
        repo_id=BASE_ID,
        folder_path=str(original),
        path_in_repo="original",
        commit_message="original/ (Meta ships consolidated .pth weights here)",
    ).oid
    if not keep:
        (model_dir / BUILD_MARKER).unlink()
        for shard in model_dir.glob("*.safetensors"):
            shard.unlink()
    return sha


def deployment_env(serving_python: str) -> dict[str, str]:
    """The ``llama3`` deployment's env (prefect.yaml) with this host's serving Python."""
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    (dep,) = [d for d in spec["deployments"] if d["name"] == DEPLOYMENT]
    return {**dep["work_pool"]["job_variables"]["env"], "QS_SERVING_PYTHON": serving_python}


def stage_seconds(api_url: str, run_id: str) -> tuple[dict[str, Any], dict[str, float]]:
    """The flow run (state, wall) and each stage's seconds: the time between the run's "stage done" log lines
    (tasks.report.Progress), the first counted from the run's start."""
    from prefect.client.orchestration import get_client  # Prefect (~2 s): only once a run has finished
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
        logs, page = [], None
        while page is None or len(page) == 200:  # the API's page size
            page = client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])),
                limit=200,
                offset=len(logs),
            )
            logs += page
    marks = sorted(
        (line.timestamp, line.message.removeprefix("stage done: "))
        for line in logs
        if line.message.startswith("stage done: ")
    )
    stages, last = {}, run.start_time
    for when, stage in marks:
        stages[stage] = round((when - last).total_seconds(), 1) if last else None
        last = when
    flow = {
        "state": run.state.type.value if run.state else None,
        "state_message": run.state.message if run.state else None,
        "seconds": round(run.total_run_time.total_seconds(), 1),
        "run_id": str(run.id),
    }
    return flow, stages


@contextlib.contextmanager
def production_task_set() -> Iterator[tuple[AccuracyGate, list[SimpleNamespace], Any]]:
    """The llama3 recipe's gate with the ``release-time`` scenario's tasks, their production-shaped rows
    published to a local Hub (token-true with the reference tokenizer): the gate, each task's spec, members
    and seeded document order, and lm-eval's task manager."""
    from huggingface_hub import HfApi
    from transformers import AutoTokenizer

    from localhub.client import hub_client_env
    from localhub.datasets import publish_production_tasks
    from localhub.server import start_local_hub

    gate = load_recipe(PRODUCTION_RECIPE).gates.accuracy
    scenario_tasks = load_scenario("release-time")["tasks"]
    gate = gate.model_copy(update={"tasks": [AccuracyTask(**t) for t in scenario_tasks]})
    with (
        tempfile.TemporaryDirectory(prefix="qs-production-tasks-") as tmp,
        start_local_hub(Path(tmp) / "hub", tokens=(STACK_TOKEN,)) as hub,
        hub_client_env(hub.endpoint, cache_dir=Path(tmp) / "cache"),
    ):
        os.environ["HF_TOKEN"] = STACK_TOKEN
        publish_production_tasks(
            HfApi(endpoint=hub.endpoint, token=STACK_TOKEN),
            tokenizer=AutoTokenizer.from_pretrained(TOKENIZER),
        )
        prepared = prepare_run(gate, ROOT)
        tasks = []
        for spec in prepared.specs:
            members = load_members(spec, prepared.task_manager)
            use_task_fewshot(spec, members)
            sizes = {name: len(task.eval_docs) for name, task in members.items()}
            order = draw_documents(sizes, spec.task.limit, gate.seed, spec.task.task)
            tasks.append(SimpleNamespace(spec=spec, members=members, order=order))
        yield gate, tasks, prepared.task_manager
