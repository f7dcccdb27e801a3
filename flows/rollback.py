"""The rollback flow: put an earlier gated release back behind the release ref. Composition only.

read the release history -> plan (refuse a commit never gated or rejected) -> move the ref (only from
where it was read) and note it on the card -> the event `quantize-serve.release.rolled-back` -> the
history again, as a table artifact.

Deployed as `quantize-serve/rollback` (prefect.yaml): the UI shows RollbackRequest as its form. From
the command line: quantize-serve rollback REPO [--to SHA].
"""

from __future__ import annotations

from prefect import flow

from quantize_serve.release.rollback import RollbackRequest, RollbackResult
from tasks.releases import (
    apply_release_rollback,
    plan_release_rollback,
    publish_release_history,
    read_release_history,
)


@flow(name="quantize-serve", flow_run_name="rollback-{request.repo_id}", log_prints=True)
def rollback_release(request: RollbackRequest) -> RollbackResult:
    """Move ``request.release_ref`` of ``request.repo_id`` back to an earlier gated commit (``to``;
    empty: the one before the current). Idempotent; refuses a commit that was never gated or was rejected."""
    hub = request.hub()
    history = read_release_history(hub)
    plan = plan_release_rollback(history, request.to)
    result = apply_release_rollback(hub, plan, request.reason)
    publish_release_history(hub)
    return result
