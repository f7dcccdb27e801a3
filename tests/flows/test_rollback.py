"""The rollback flow (flows/rollback.py, deployment quantize-serve/rollback) on the tier's Prefect server,
against the local Hub with the real client: the event, the history as a table artifact, the command
line running it, a refusal failing the run. The releases are made by the release step itself
(tests/engines/test_releases.py's helper), no vLLM."""

from __future__ import annotations

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

import tasks.releases as release_tasks
from flows.rollback import rollback_release
from quantize_serve import cli
from quantize_serve.release.rollback import RollbackRequest
from tests.engines.test_releases import WRITE, production, release
from tests.engines.test_releases import _client_env as _client_env  # noqa: F401 - autouse: online, HF_TOKEN
from tests.engines.test_releases import validated as validated  # noqa: F401


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Every event the tasks emit (and still emitted for real)."""
    seen: list[dict] = []
    real = release_tasks.emit_event

    def record(**event):
        seen.append(event)
        return real(**event)

    monkeypatch.setattr(release_tasks, "emit_event", record)
    return seen


def artifact_rows(key: str) -> list:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    return found


def test_the_rollback_flow_moves_the_ref_emits_the_event_and_publishes_the_history(
    validated, tmp_path, events
):
    g1, g2 = release(validated, tmp_path, 1), release(validated, tmp_path, 2)
    repo = validated.recipe.hub.repo_id
    state = rollback_release(RollbackRequest(repo_id=repo, reason="error rate up"), return_state=True)
    assert state.is_completed(), state.message
    assert production(validated) == g1
    event = next(e for e in events if e["event"] == "quantize-serve.release.rolled-back")
    assert (
        event["payload"]["to"] == g1
        and event["payload"]["from"] == g2
        and event["payload"]["reason"] == "error rate up"
    )
    assert event["resource"]["prefect.resource.id"] == f"huggingface.model.{repo}"
    assert WRITE not in str(event)
    artifacts = artifact_rows(release_tasks.history_artifact_key(repo))
    assert artifacts and g1[:12] in str(artifacts[0].data) and WRITE not in str(artifacts[0].data)

    again = rollback_release(RollbackRequest(repo_id=repo, to=g1), return_state=True)  # idempotent: no event
    assert again.is_completed() and len([e for e in events if e["event"].endswith("rolled-back")]) == 1


def test_a_refused_rollback_fails_the_run_and_moves_nothing(validated, tmp_path):
    g1 = release(validated, tmp_path, 1)
    c2 = release(validated, tmp_path, 2, rejected=True)
    state = rollback_release(RollbackRequest(repo_id=validated.recipe.hub.repo_id, to=c2), return_state=True)
    assert state.is_failed() and "was rejected" in str(state.result(raise_on_failure=False))
    assert production(validated) == g1


def test_the_command_line_runs_the_flow_and_prints_the_history(validated, tmp_path, capsys):
    g1, g2 = release(validated, tmp_path, 1), release(validated, tmp_path, 2)
    repo = validated.recipe.hub.repo_id
    assert cli.main(["rollback", repo, "--dry-run"]) == 0
    assert f"{g2[:12]} -> {g1[:12]}" in capsys.readouterr().out and production(validated) == g2
    assert cli.main(["rollback", repo, "--reason", "canary failed"]) == 0
    out = capsys.readouterr().out
    assert f"rolled back: tag 'production' -> {g1}" in out and f"{repo}: tag 'production' -> {g1[:12]}" in out
    assert production(validated) == g1
    assert cli.main(["rollback", repo, "--to", g1]) == 0  # again: nothing to do, no flow run
    assert "nothing to do" in capsys.readouterr().out


def test_the_history_artifact_warns_first_when_the_ref_serves_a_rejected_candidate(validated, tmp_path):
    """Issue 44: the table artifact says what `quantize-serve releases` says, on top of its description."""
    from huggingface_hub import HfApi
    from prefect import flow

    g1 = release(validated, tmp_path, 1)
    c2 = release(validated, tmp_path, 2, rejected=True)
    hub = validated.recipe.hub
    api = HfApi(token=WRITE)  # moved onto the rejected candidate by hand
    api.delete_tag(hub.repo_id, tag="production")
    api.create_tag(hub.repo_id, tag="production", revision=c2)

    @flow(name="publish-history")
    def publish():
        return release_tasks.publish_release_history(hub)

    assert publish().ref_warning
    [artifact] = artifact_rows(release_tasks.history_artifact_key(hub.repo_id))
    assert artifact.description.startswith(
        f"**WARNING:** production serves {c2[:12]}, which the gates rejected (rejected-{c2[:12]} tag"
    ), artifact.description
    assert f"`quantize-serve rollback {hub.repo_id} --to {g1}`" in artifact.description
    assert "<- current (rejected)" in str(artifact.data)
