"""The local production stack the release drivers run on (h200_llama3.py, h200_release_time.py): the 8B
base under Meta's id on a local Hub, and the ``llama3`` deployment of prefect.yaml with this host's serving
Python."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from benchmarks.harness import BUILD_MARKER, ROOT

BASE_ID = "meta-llama/Meta-Llama-3-8B-Instruct"
DEPLOYMENT = "llama3"
STACK_TOKEN = "hf_local_h200_endpoint_token"  # the local endpoint's own token, not a Hub secret


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
