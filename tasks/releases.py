"""Release history and rollback as tasks: the history as a table artifact in the Prefect UI, the
rollback's two steps and its event (the work: quantize_serve/release/history.py and rollback.py).

The token is resolved inside each task from the Hub section (environment or Prefect Secret block) and
never passed as a task parameter: Prefect records task inputs."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event
from prefect.logging import get_run_logger

from quantize_serve.hub.client import resolve_token
from quantize_serve.recipe.model import HubSection
from quantize_serve.release.history import ReleaseHistory, release_history
from quantize_serve.release.rollback import RollbackPlan, RollbackResult, apply_rollback, plan_rollback

ROLLED_BACK_EVENT = "quantize-serve.release.rolled-back"


def history_artifact_key(repo_id: str) -> str:
    """One key per repo (artifact keys: lowercase letters, digits, dashes), so runs line up in the UI."""
    return "releases-" + "".join(ch if ch.isalnum() else "-" for ch in repo_id.lower())


@task(name="read-release-history", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=5)
def read_release_history(hub: HubSection) -> ReleaseHistory:
    return release_history(hub, token=resolve_token(hub))


@task(name="publish-release-history", cache_policy=NO_CACHE)
def publish_release_history(
    hub: HubSection | None, history: ReleaseHistory | None = None
) -> ReleaseHistory | None:
    """The history as a table artifact (the same rows `quantize-serve releases` prints). A Hub that
    cannot be read here fails nothing: the release already happened; the log says why."""
    if hub is None:
        return None
    logger = get_run_logger()
    if history is None:
        try:
            history = release_history(hub, token=resolve_token(hub))
        except Exception as exc:  # noqa: BLE001 - the history is a view; the release is done either way
            logger.warning("release history not published: %s", exc)
            return None
    create_table_artifact(
        key=history_artifact_key(hub.repo_id),
        table=history.rows() or [{"commit": "-"}],
        description=history_description(history),
    )
    logger.info("release history:\n%s", history.table())
    if history.ref_warning:
        logger.warning("%s", history.ref_warning)
    return history


def history_description(history: ReleaseHistory) -> str:
    """The artifact's description: the warning on top when the ref serves no release, as the CLI prints it."""
    title = (
        f"Release history of {history.repo_id}: {history.release_ref_kind} {history.release_ref!r} -> "
        f"{(history.current or 'nothing')[:12]}"
    )
    return f"**WARNING:** {history.ref_warning}\n\n{title}" if history.ref_warning else title


@task(name="plan-rollback", cache_policy=NO_CACHE)
def plan_release_rollback(history: ReleaseHistory, to: str | None) -> RollbackPlan:
    plan = plan_rollback(history, to)  # a refusal (never gated, rejected) raises here: nothing changed
    get_run_logger().info("rollback: %s", plan.summary())
    return plan


@task(name="apply-rollback", cache_policy=NO_CACHE)
def apply_release_rollback(hub: HubSection, plan: RollbackPlan, reason: str) -> RollbackResult:
    """Move the ref (only from where the plan read it) and note it on the card; the event when this
    call completed a rollback (moved the ref, or wrote the note an earlier attempt could not)."""
    result = apply_rollback(hub, plan, token=resolve_token(hub), reason=reason)
    if not plan.changes_nothing:
        emit_event(**rollback_event(hub, result))
    get_run_logger().info("rollback done: %s", plan.summary())
    return result


def rollback_event(hub: HubSection, result: RollbackResult) -> dict[str, Any]:
    plan = result.plan
    return {
        "event": ROLLED_BACK_EVENT,
        "resource": {
            "prefect.resource.id": f"huggingface.model.{hub.repo_id}",
            "prefect.resource.name": hub.repo_id,
            "huggingface.revision": plan.target,
        },
        "payload": {
            "ref": plan.release_ref,
            "ref_kind": plan.release_ref_kind,
            "to": plan.target,
            "from": plan.previous,
            "moved": result.moved,
            "note_commit": result.note_commit,
            "reason": result.reason,
            "at": result.at,
        },
    }
