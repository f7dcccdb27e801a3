"""The flow end to end through a real Prefect server and process worker, deployed from
prefect.yaml, publishing to the local Hub endpoint: the promotion path and the rejection path."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from scripts.local_stack import local_stack
from tests.conftest import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.flow]
TOKEN = "hf_flowtest_local_token_0123456789"


@pytest.fixture(scope="module")
def stack(tmp_path_factory, awq_checkpoint):  # the checkpoint fixture warms the shared cache
    home = tmp_path_factory.mktemp("stack")
    runs = home / "runs"
    with local_stack(home, hub_token=TOKEN, extra_env={"QS_RUNS_DIR": str(runs)}) as s:
        s.runs = runs
        yield s


def reports(runs: Path, name: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(runs.glob(f"{name}-*/report.json"))]


@contextmanager
def client_for(stack):
    """A Prefect client of the stack's server (not the test session's own API)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        yield client


def release_events(stack, kind: str) -> list:
    from prefect.events.filters import EventFilter, EventNameFilter

    with client_for(stack) as client:
        for _ in range(30):
            page = client.read_events(
                filter=EventFilter(event=EventNameFilter(name=[f"quantize-serve.release.{kind}"])), limit=50)
            if page.events:
                return page.events
            time.sleep(1)
    return []


def hub_tags(stack, repo_id: str) -> dict[str, str]:
    from unittest import mock

    from huggingface_hub import HfApi, constants

    api = HfApi(endpoint=stack.hub_endpoint, token=TOKEN)
    with mock.patch.object(constants, "HF_HUB_OFFLINE", False):  # the session runs offline; this is loopback
        return {t.name: t.target_commit for t in api.list_repo_refs(repo_id).tags}


def test_deployment_run_promotes(stack):
    rc, output, run_id = stack.run_deployment("tiny-awq")
    assert rc == 0, output[-5000:]
    assert TOKEN not in output

    with client_for(stack) as client:
        run = client.read_flow_run(run_id)
        assert run.state.is_completed()
        keys = {a.key for a in client.read_artifacts() if a.flow_run_id == run.id}
    for suffix in ("report", "decision", "capacity", "accuracy", "stress", "hub-revision", "progress"):
        assert f"tiny-llama-awq-{suffix}" in keys, keys

    (report,) = reports(stack.runs, "tiny-llama-awq")
    folder = Path(report["report_dir"])
    assert {"report.json", "report.md", "capacity.png"} <= {p.name for p in folder.iterdir()}
    assert report["decision"]["passed"] and report["release"]["status"] == "promoted"
    assert hub_tags(stack, "quantize-serve/tiny-llama-awq-w4a16")["production"] == report["release"]["commit_sha"]
    for path in folder.rglob("*"):
        if path.is_file() and path.suffix in {".md", ".json", ".log", ".txt"}:
            assert TOKEN not in path.read_text(errors="replace"), path
    assert release_events(stack, "promoted")


def test_rejection_moves_nothing(stack, tmp_path):
    data = yaml.safe_load((ROOT / "recipes/tiny-llama-awq.yaml").read_text())
    data["name"] = "tiny-llama-awq-strict"
    data["model"]["id"] = str(ROOT / "models/tiny-llama")
    data["calibration"]["dataset"] = str(ROOT / "data/calibration/tiny_calibration.jsonl")
    data["gates"]["accuracy"]["tasks"] = [{"task": str(ROOT / "evals/tasks/qs_facts_mc.yaml"),
                                           "recovery": {"acc": 1.2}}]
    data["hub"]["repo_id"] = "quantize-serve/tiny-llama-awq-strict"
    recipe = tmp_path / "strict.yaml"
    recipe.write_text(yaml.safe_dump(data))

    rc, output, run_id = stack.run_deployment("tiny-awq", params={"recipe": str(recipe)})
    assert rc != 0, "a rejected release must fail the run"
    (report,) = reports(stack.runs, "tiny-llama-awq-strict")
    assert not report["decision"]["passed"] and report["release"]["status"] == "rejected"
    failed = {c["check"]: c["reason"] for c in report["decision"]["checks"] if not c["passed"]}
    assert "< 1.20" in failed[f"accuracy {ROOT / 'evals/tasks/qs_facts_mc.yaml'} acc"]
    assert all(c["passed"] for c in report["decision"]["checks"] if c["check"] == "stress")
    tags = hub_tags(stack, "quantize-serve/tiny-llama-awq-strict")
    assert "production" not in tags
    assert tags[report["release"]["rejection_tag"]] == report["release"]["candidate_sha"]
    events = release_events(stack, "rejected")
    assert events and any("1.20" in json.dumps(e.payload) for e in events)
