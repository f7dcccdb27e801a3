"""Hub tasks: push the candidate, then promote or reject it (the work is in
``quantize_serve.release.publish``; these add the logs, the event and the link artifact).

The token is resolved inside the release functions (environment or Prefect Secret block) and never
passed as a task parameter: Prefect records task inputs, and a token must not be among them.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_link_artifact
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event
from prefect.logging import get_run_logger

from quantize_serve.hub.client import PushResult
from quantize_serve.quantize.run import QuantizeResult
from quantize_serve.release import publish as rel
from quantize_serve.report.run_report import Release, RunReport
from quantize_serve.serve_profile.search import ProfileSearchResult
from quantize_serve.validate.preflight import BaseModelRef, ValidatedRecipe


@task(name="push-candidate", cache_policy=NO_CACHE)
def push_candidate(
    validated: ValidatedRecipe,
    base: BaseModelRef,
    checkpoint: QuantizeResult,
    serving_command: str,
    run_dir: Path,
    profile: ProfileSearchResult | None = None,
) -> PushResult | None:
    if validated.recipe.hub is None:
        get_run_logger().info("no hub section in the recipe: nothing is pushed or promoted")
        return None
    result = rel.push_release_candidate(validated, base, checkpoint, serving_command, run_dir, profile)
    get_run_logger().info(
        "candidate %s@%s (%s)",
        result.repo_id,
        result.commit_sha,
        "new commit" if result.created_commit else "unchanged, no new commit",
    )
    return result


@task(name="promote-or-reject", cache_policy=NO_CACHE)
def promote_or_reject(
    validated: ValidatedRecipe, report: RunReport, approved: bool, approved_by: str | None
) -> Release:
    """Promotion only when the gates passed (and a person approved, if the recipe asks)."""
    release = rel.promote_or_reject(validated, report, approved, approved_by)
    if release.status == "not-published":
        return release
    recipe, reasons = validated.recipe, rel.release_reasons(report, approved, approved_by)
    emit_event(**rel.release_event(recipe, report, release, reasons))
    create_link_artifact(
        key=f"{recipe.name}-hub-revision",
        link=rel.revision_url(report, release),
        link_text=f"{release.repo_id} ({release.status})",
        description=f"Hub revision of this run: {release.status}",
    )
    get_run_logger().info(
        "release %s: %s", release.status, "; ".join(reasons) or f"{release.ref} -> {release.commit_sha}"
    )
    return release
