"""The release: stage the exact files of the candidate and push them, then, once the gates have
judged it, promote the candidate or record its rejection on the Hub.

Plain functions: the Prefect tasks in ``tasks/hub.py`` wrap them and add what only Prefect does
(the event an automation can trigger on, the link artifact). The Hub token is resolved here, at
the point of use, and is never a parameter that Prefect would record.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from quantize_serve.capacity.chart import CHART
from quantize_serve.hub import publish as hub
from quantize_serve.hub.client import resolve_token
from quantize_serve.quantize.run import QuantizeResult
from quantize_serve.recipe.model import Recipe
from quantize_serve.release.alerts import OPERATOR_FILE, RULES_FILE, derive_alerts
from quantize_serve.release.card import card_inputs, render_model_card, report_card_inputs
from quantize_serve.release.history import GATED_TITLE
from quantize_serve.report.provenance import serving_vllm_version
from quantize_serve.report.release_results import RELEASE_RESULTS_FILE, release_record, release_record_bytes
from quantize_serve.report.run_report import Release, RunReport
from quantize_serve.serve_profile.output import PROFILE_FILE
from quantize_serve.serve_profile.search import ProfileSearchResult
from quantize_serve.validate.preflight import BaseModelRef, ValidatedRecipe


def stage_release_folder(
    checkpoint: QuantizeResult, card_text: str, folder: Path, extra: list[Path] = ()
) -> Path:
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


def candidate_commit_message(recipe: Recipe, base: BaseModelRef) -> str:
    """The recipe's commit message template, filled in."""
    q = recipe.quantization
    return recipe.hub.commit_message.format(
        method=q.method or "existing checkpoint",
        scheme=q.scheme,
        base_model=base.repo_id or recipe.model.id,
        base_revision=base.sha[:12],
    )


def push_release_candidate(
    validated: ValidatedRecipe,
    base: BaseModelRef,
    checkpoint: QuantizeResult,
    serving_command: str,
    run_dir: Path,
    profile: ProfileSearchResult | None = None,
) -> hub.PushResult:
    """Stage the checkpoint with its candidate card (and the serving profile) under
    ``run_dir/release`` and push it to the recipe's Hub repo (content-addressed: an unchanged
    folder makes no new commit)."""
    recipe = validated.recipe
    if recipe.hub is None:
        raise ValueError(f"recipe {recipe.name!r} has no hub section: there is nowhere to push")
    card = render_model_card(
        card_inputs(validated, base, checkpoint, serving_command, vllm_version=serving_vllm_version())
    )
    extra = [Path(profile.profile_path)] if profile and profile.profile_path else []
    folder = stage_release_folder(checkpoint, str(card), run_dir / "release", extra)
    return hub.push_candidate(
        recipe.hub,
        folder,
        token=resolve_token(recipe.hub),
        commit_message=candidate_commit_message(recipe, base),
    )


def release_reasons(report: RunReport, approved: bool, approved_by: str | None) -> list[str]:
    """Why the candidate is not promoted (empty when it is); a reviewer's rejection carries their note."""
    if report.decision.reasons or approved:
        return report.decision.reasons
    note = f": {report.approval_note}" if report.approval_note else ""
    return [f"not approved by {approved_by or 'the reviewer'}{note}"]


def promote_or_reject(
    validated: ValidatedRecipe, report: RunReport, approved: bool, approved_by: str | None
) -> Release:
    """Promote the candidate when the gates passed and (if the recipe asks) a person approved:
    a new card with the gates' figures on top of the candidate commit, then the release ref.
    Otherwise tag the candidate as rejected, with the reasons in the tag and its card.
    Sets ``report.release`` and returns it."""
    recipe, candidate = validated.recipe, report.candidate
    if recipe.hub is None or candidate is None:
        return Release(status="not-published")
    token = resolve_token(recipe.hub)
    promote = report.decision.passed and approved
    status = "promoted" if promote else "rejected"
    release = Release(
        status=status,
        repo_id=candidate.repo_id,
        candidate_sha=candidate.commit_sha,
        url=candidate.url,
        approved_by=approved_by,
    )
    report.release = release
    reasons = release_reasons(report, approved, approved_by)
    # the rules that watch it in production, from its gates' figures: a promoted release's commit and card
    # hold them, beside the report; a rejected candidate carries none
    rules = derive_alerts(report, recipe) if promote else None
    report.alerts = rules.markdown(heading="##") if rules else None
    if rules:
        rules.write(Path(report.report_dir))
    card_text = str(
        render_model_card(report_card_inputs(validated, report, status=status, rejection_reasons=reasons))
    )
    # the machine-readable record (decision, recoveries, figures, conditions): the release history and
    # the next candidate's regression gate read it from the Hub
    record = release_record(
        report, status=status, reasons=reasons, approval=recipe.approval, approved_by=approved_by
    )
    results = {RELEASE_RESULTS_FILE: release_record_bytes(record)}
    if promote:
        folder = Path(report.report_dir)
        files = {
            name: (folder / name).read_bytes()
            for name in (CHART, PROFILE_FILE, *((RULES_FILE, OPERATOR_FILE) if rules else ()))
            if (folder / name).is_file()
        }
        gated = hub.update_model_card(
            recipe.hub,
            card_text,
            parent_commit=candidate.commit_sha,
            token=token,
            files={**files, **results},
            commit_message=f"{GATED_TITLE} (run {report.run_id})",
        )
        release.commit_sha = hub.promote_revision(recipe.hub, gated, token=token, run_id=report.run_id)
        release.ref = recipe.hub.release_ref
    else:
        release.rejection_tag = hub.record_rejection(
            recipe.hub,
            candidate.commit_sha,
            reasons,
            files=results,
            token=token,
            run_id=report.run_id,
            card_text=card_text,
        )
    return release


def release_event(recipe: Recipe, report: RunReport, release: Release, reasons: list[str]) -> dict[str, Any]:
    """The release event as data (``event``, ``resource``, ``payload``), for an automation."""
    candidate = report.candidate
    return {
        "event": f"quantize-serve.release.{release.status}",
        "resource": {
            "prefect.resource.id": f"huggingface.model.{candidate.repo_id}",
            "prefect.resource.name": candidate.repo_id,
            "huggingface.revision": release.commit_sha or candidate.commit_sha,
        },
        "payload": {
            "recipe": recipe.name,
            "run_id": report.run_id,
            "reasons": reasons,
            "ref": release.ref,
            "candidate": candidate.commit_sha,
        },
    }


def revision_url(report: RunReport, release: Release) -> str:
    """The Hub page of the revision this run left: the promoted commit, else the candidate."""
    candidate = report.candidate
    return f"{candidate.url.split('/commit/')[0]}/tree/{release.commit_sha or candidate.commit_sha}"
