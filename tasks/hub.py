"""Hub tasks: push the candidate, then promote or reject it.

The token is resolved inside each task (environment or Prefect Secret block) and never passed as
a task parameter: Prefect records task inputs, and a token must not be among them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from prefect import task
from prefect.artifacts import create_link_artifact
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event
from prefect.logging import get_run_logger

from quantize_serve import hub
from quantize_serve.model_card import render_model_card
from quantize_serve.profile_search import ProfileSearchResult
from quantize_serve.quantize import QuantizeResult
from quantize_serve.report import CHART, Release, RunReport, candidate_card_inputs
from quantize_serve.validate import BaseModelRef, ValidatedRecipe


def stage_release_folder(checkpoint: QuantizeResult, card_text: str, folder: Path,
                         extra: list[Path] = ()) -> Path:
    """The exact files that go to the Hub: the checkpoint (hard links, no copy), its card, and
    the validated serving profile when a search found one."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for f in [*Path(checkpoint.checkpoint_dir).iterdir(), *extra]:
        if f.is_file():
            try:
                os.link(f, folder / f.name)
            except OSError:
                shutil.copy2(f, folder / f.name)
    (folder / "README.md").write_text(card_text)
    return folder


@task(name="push-candidate", cache_policy=NO_CACHE)
def push_candidate(validated: ValidatedRecipe, base: BaseModelRef, checkpoint: QuantizeResult,
                   serving_command: str, run_dir: Path,
                   profile: ProfileSearchResult | None = None) -> hub.PushResult | None:
    recipe = validated.recipe
    if recipe.hub is None:
        get_run_logger().info("no hub section in the recipe: nothing is pushed or promoted")
        return None
    card = render_model_card(candidate_card_inputs(validated, base, checkpoint, serving_command))
    extra = [Path(profile.profile_path)] if profile and profile.profile_path else []
    folder = stage_release_folder(checkpoint, str(card), run_dir / "release", extra)
    q = recipe.quantization
    message = recipe.hub.commit_message.format(method=q.method, scheme=q.scheme,
                                               base_model=base.repo_id or recipe.model.id,
                                               base_revision=base.sha[:12])
    result = hub.push_candidate(recipe.hub, folder, token=hub.resolve_token(recipe.hub), commit_message=message)
    get_run_logger().info("candidate %s@%s (%s)", result.repo_id, result.commit_sha,
                          "new commit" if result.created_commit else "unchanged, no new commit")
    return result


@task(name="promote-or-reject", cache_policy=NO_CACHE)
def promote_or_reject(validated: ValidatedRecipe, report: RunReport, approved: bool, approved_by: str | None) -> Release:
    """Promotion only when the gates passed (and a person approved, if the recipe asks)."""
    recipe = validated.recipe
    candidate = report.candidate
    if recipe.hub is None or candidate is None:
        return Release(status="not-published")
    token = hub.resolve_token(recipe.hub)
    promote = report.decision.passed and approved
    status = "promoted" if promote else "rejected"
    release = Release(status=status, repo_id=candidate.repo_id, candidate_sha=candidate.commit_sha,
                      url=candidate.url, approved_by=approved_by)
    report.release = release
    card_text = str(render_model_card(report.card_inputs(validated, status=status)))
    chart = Path(report.report_dir) / CHART
    files = {CHART: chart.read_bytes()} if chart.is_file() else {}
    reasons = report.decision.reasons or ([] if approved else [f"not approved by {approved_by or 'the reviewer'}"])
    if promote:
        gated = hub.update_model_card(recipe.hub, card_text, parent_commit=candidate.commit_sha, token=token,
                                      files=files, commit_message=f"Gates passed (run {report.run_id})")
        release.commit_sha = hub.promote_revision(recipe.hub, gated, token=token, run_id=report.run_id)
        release.ref = recipe.hub.release_ref
    else:
        release.rejection_tag = hub.record_rejection(recipe.hub, candidate.commit_sha, reasons, token=token,
                                                     run_id=report.run_id, card_text=card_text)
    emit_event(
        event=f"quantize-serve.release.{status}",
        resource={"prefect.resource.id": f"huggingface.model.{candidate.repo_id}",
                  "prefect.resource.name": candidate.repo_id,
                  "huggingface.revision": release.commit_sha or candidate.commit_sha},
        payload={"recipe": recipe.name, "run_id": report.run_id, "reasons": reasons,
                 "ref": release.ref, "candidate": candidate.commit_sha},
    )
    create_link_artifact(key=f"{recipe.name}-hub-revision",
                         link=f"{candidate.url.split('/commit/')[0]}/tree/{release.commit_sha or candidate.commit_sha}",
                         link_text=f"{candidate.repo_id} ({status})",
                         description=f"Hub revision of this run: {status}")
    get_run_logger().info("release %s: %s", status, "; ".join(reasons) or f"{release.ref} -> {release.commit_sha}")
    return release
