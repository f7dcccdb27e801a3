"""Rollback: move the release ref back to an earlier gated commit, and note it on the card.

Two steps, so that what is moved is what was read:

1. :func:`plan_rollback` (pure, on the history the Hub gave): the target (``to``, a full or short
   sha; by default the newest gated commit older than the one the ref points at, or, when that is a
   rejected candidate, the one `quantize-serve releases` proposes: ``ReleaseHistory.repair_target``;
   a ref at a commit never gated, or at nothing, is refused with that proposal) must be a gated
   commit of the repo; a rejected candidate, a candidate never gated or an unknown sha is refused
   (:class:`ReleaseRefusedError`, one screen, exit 2) before anything changes.
2. :func:`apply_rollback`: moves the ref only while it still points where the plan read it
   (``hub.releases.move_release_ref``: a ref moved by someone else in between is refused, nothing
   changed), then notes the rollback on the card on ``main`` (one commit: the note at the top and a
   line under "Rollbacks"; its title is how ``release/history.py`` finds it again).

Idempotent: a ref already at the target whose history records it changes nothing; a ref moved by an
earlier attempt that failed before its note gets the note. The token is resolved by the caller
(``hub.client.resolve_token``) and never printed.
"""

from __future__ import annotations

import re
import time
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from quantize_serve.core.errors import HubError, RecipeError, ReleaseRefusedError
from quantize_serve.hub.client import CARD, DEFAULT_RETRY, RetryPolicy
from quantize_serve.hub.publish import update_model_card
from quantize_serve.hub.releases import move_release_ref, read_file_at, read_repo_state
from quantize_serve.recipe.model import HubSection
from quantize_serve.release.card import scrub_secrets
from quantize_serve.release.history import ReleaseHistory, rollback_title

SHORT_SHA = re.compile(r"^[0-9a-f]{7,40}$")
NOTE_MARK = "<!-- quantize-serve:rollback-note -->"
ROLLBACKS_HEADING = "## Rollbacks"


class RollbackRequest(BaseModel):
    """What to roll back (the rollback flow's parameters: the Prefect UI shows them as its form)."""

    repo_id: str = Field(description="The Hub repo of the releases, e.g. your-org/Llama-3-8B-AWQ.")
    to: str | None = Field(
        default=None,
        description="The gated commit to go back to (full or short sha); "
        "empty: the newest gated commit older than the one the release ref points at.",
    )
    reason: str = Field(default="", description="Why; noted on the card and in the event.")
    release_ref: str = Field(
        default="production", description="The release ref (the recipe's hub.release_ref)."
    )
    release_ref_kind: Literal["tag", "branch"] = "tag"
    token_env: str = Field(
        default="HF_TOKEN",
        description="The environment variable holding the Hub token (never the token itself).",
    )
    token_secret_block: str | None = Field(default=None, description="Or a Prefect Secret block holding it.")

    def hub(self, *, source: str = "rollback") -> HubSection:
        """The Hub section these name; a bad repo id or ref name is a RecipeError naming the field."""
        try:
            return HubSection(
                repo_id=self.repo_id,
                release_ref=self.release_ref,
                release_ref_kind=self.release_ref_kind,
                token_env=self.token_env,
                token_secret_block=self.token_secret_block,
            )
        except ValidationError as exc:
            error = exc.errors()[0]
            field = {"repo_id": "REPO", "release_ref": "--ref"}.get(
                str(error["loc"][0]), str(error["loc"][0])
            )
            value = getattr(self, str(error["loc"][0]), None)
            problem, _, fix = str(error["msg"]).removeprefix("Value error, ").partition(" Fix: ")
            raise RecipeError(
                source, field, value, problem.rstrip("."), fix or "see `quantize-serve releases --help`"
            ) from None


class RollbackPlan(BaseModel):
    repo_id: str
    release_ref: str
    release_ref_kind: str
    current: str | None  # where the ref points now: the move happens only while it still does
    target: str
    previous: str | None  # what the note records as the ref's target before (recorded history first)
    move: bool  # the ref is not at the target yet
    note: bool  # the card on main does not record the ref at the target yet

    @property
    def changes_nothing(self) -> bool:
        return not (self.move or self.note)

    def summary(self) -> str:
        ref = f"{self.release_ref_kind} {self.release_ref!r} of {self.repo_id}"
        if self.changes_nothing:
            return f"{ref} already points at {self.target[:12]} and the card records it: nothing to do"
        if not self.move:
            return f"{ref} already points at {self.target[:12]}; the card's note of it is missing: writing it"
        return f"{ref}: {(self.current or 'nothing')[:12]} -> {self.target[:12]}"


class RollbackResult(BaseModel):
    plan: RollbackPlan
    moved: bool
    note_commit: str | None = None
    at: str
    reason: str = ""  # as noted on the card (anything that looks like a credential masked)


def _refuse(history: ReleaseHistory, to: str, problem: str, fix: str) -> ReleaseRefusedError:
    return ReleaseRefusedError(f"rollback of {history.repo_id} to {to}: {problem}. Fix: {fix}")


def default_target(history: ReleaseHistory) -> str:
    """``rollback`` without ``--to``: the newest gated commit older than the ref's; from a rejected
    candidate, the release ``releases`` proposes (repair_target); from a commit never gated, or from
    nothing, a refusal that proposes it."""
    gated = history.gated()
    listing = ", ".join(e.commit[:12] for e in reversed(gated)) or "none"
    current = history.entry(history.current) if history.current else None
    proposal = history.repair_target()
    propose = (
        f"`{history.repair_command(proposal)}`, the release `quantize-serve releases` proposes (gated "
        f"commits, newest first: {listing})"
        if proposal
        else "none passed the gates yet; release one through them first (`quantize-serve run RECIPE`)"
    )
    if history.current is None:
        raise ReleaseRefusedError(
            f"rollback of {history.repo_id}: the {history.release_ref_kind} {history.release_ref!r} points "
            "at nothing, so there is no previous release to go back to. Fix: name one with --to SHA: "
            f"{propose}"
        )
    if current is None:
        raise ReleaseRefusedError(
            f"rollback of {history.repo_id}: {history.release_ref!r} points at {history.current[:12]}, which "
            "no gate passed, so no release is before it to go back to. Fix: name the target with --to SHA: "
            f"{propose}"
        )
    if current.status == "rejected" and proposal is not None:
        return proposal.commit
    order = [e.commit for e in history.entries]
    older = [e for e in gated if order.index(e.commit) < order.index(current.commit)]
    if not older:
        raise ReleaseRefusedError(
            f"rollback of {history.repo_id}: {history.release_ref!r} points at {history.current[:12]}, and "
            "no gated commit is older than it. Fix: name the target with --to SHA (gated commits, newest "
            f"first: {listing})"
        )
    return older[-1].commit


def resolve_target(history: ReleaseHistory, to: str | None) -> str:
    """The gated commit to roll back to; refuses anything else, saying why and what would do."""
    if to is None:
        return default_target(history)
    gated = history.gated()
    listing = ", ".join(e.commit[:12] for e in reversed(gated)) or "none"
    wanted = to.strip().lower()
    if not SHORT_SHA.match(wanted):
        raise _refuse(
            history,
            to,
            "not a commit sha (7 to 40 hex digits)",
            f"give a gated commit's sha (newest first: {listing}); `quantize-serve releases "
            f"{history.repo_id}` lists them",
        )
    matches = {e.commit for e in history.entries if e.commit.startswith(wanted)}
    matches |= {e.candidate for e in history.entries if e.candidate and e.candidate.startswith(wanted)}
    if len(matches) > 1:
        raise _refuse(history, to, f"the prefix matches {len(matches)} commits", "give more digits")
    entry = next((e for e in history.entries if e.commit.startswith(wanted)), None)
    if entry is not None and entry.status == "promoted":
        return entry.commit
    if entry is not None:  # rejected
        why = "; ".join(entry.reasons) or "its gates failed"
        raise _refuse(
            history,
            to,
            f"that candidate was rejected ({why}), so it never passed the gates",
            f"roll back to a gated commit (newest first: {listing})",
        )
    gated_child = next((e for e in gated if e.candidate and e.candidate.startswith(wanted)), None)
    if gated_child is not None:
        raise _refuse(
            history,
            to,
            f"that is the candidate of the gated commit {gated_child.commit[:12]}, not the "
            "gated commit itself (the release ref only points at gated commits, which carry the final "
            "card and the recorded results)",
            f"use --to {gated_child.commit}",
        )
    raise _refuse(
        history,
        to,
        "no gated commit of the repo has that sha (never gated: a candidate still "
        "pending, a card commit, or not a commit of main)",
        f"roll back to a gated commit (newest first: {listing})",
    )


def plan_rollback(history: ReleaseHistory, to: str | None = None) -> RollbackPlan:
    target = resolve_target(history, to)
    recorded = history.recorded_target()
    return RollbackPlan(
        repo_id=history.repo_id,
        release_ref=history.release_ref,
        release_ref_kind=history.release_ref_kind,
        current=history.current,
        target=target,
        previous=history.current if history.current != target else recorded,
        move=history.current != target,
        note=history.current != target or recorded != target,
    )


def note_rollback(card: str, plan: RollbackPlan, *, at: str, reason: str) -> str:
    """The card with the rollback noted: one line at the top (replacing an older note) and one line
    under ``## Rollbacks`` at the end (kept, one per rollback)."""
    ref = f"{plan.release_ref_kind} `{plan.release_ref}`"
    why = f" Reason: {reason}." if reason else ""
    top = (
        f"{NOTE_MARK}\n> **Rolled back.** The {ref} points at `{plan.target}` since {at} (it pointed at "
        f"`{plan.previous or 'nothing'}`). This card describes the revision it sits in; the card at "
        f"`{plan.target[:12]}` describes the release now served.{why}"
    )
    line = f"- {at}: {ref} -> `{plan.target}` (was `{plan.previous or 'nothing'}`).{why}"
    lines = card.rstrip("\n").split("\n")
    if NOTE_MARK in lines:  # an older note: replace it (its two lines)
        i = lines.index(NOTE_MARK)
        del lines[i : i + 2]
    head = next((i for i, text in enumerate(lines) if text.startswith("# ")), None)
    insert_at = head + 1 if head is not None else 0
    lines[insert_at:insert_at] = ["", *top.split("\n")]
    if ROLLBACKS_HEADING not in lines:
        lines += ["", ROLLBACKS_HEADING, ""]
    lines.append(line)
    return "\n".join(lines) + "\n"


def apply_rollback(
    hub: HubSection,
    plan: RollbackPlan,
    *,
    token: str | None,
    reason: str = "",
    endpoint: str | None = None,
    retry: RetryPolicy = DEFAULT_RETRY,
) -> RollbackResult:
    """Move the ref (only from ``plan.current``), then note the rollback on main's card."""
    at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    reason = scrub_secrets(reason.strip())  # a pasted command line must not publish a token
    if plan.move:
        move_release_ref(
            hub,
            plan.target,
            expected=plan.current,
            token=token,
            endpoint=endpoint,
            retry=retry,
            message=f"quantize-serve: rolled back to {plan.target} (was {plan.current or 'nothing'})",
        )
    note_commit = None
    if plan.note:
        try:
            head = read_repo_state(hub, token=token, endpoint=endpoint, retry=retry).commits[0].sha
            card = (
                read_file_at(hub, head, CARD, token=token, endpoint=endpoint, retry=retry) or b""
            ).decode()
            note_commit = update_model_card(
                hub,
                note_rollback(card, plan, at=at, reason=reason),
                parent_commit=head,
                token=token,
                endpoint=endpoint,
                retry=retry,
                commit_message=rollback_title(
                    plan.release_ref_kind, plan.release_ref, plan.target, plan.previous
                ),
                commit_description=reason,
            )
        except HubError as exc:
            moved = "was moved" if plan.move else "already pointed there"
            raise type(exc)(
                f"{exc} The {plan.release_ref_kind} {plan.release_ref!r} {moved} "
                f"({plan.target[:12]}), but the rollback is not noted on the card yet. Re-run "
                f"`quantize-serve rollback {plan.repo_id} --to {plan.target}` (idempotent) to "
                "write the note."
            ) from None
    return RollbackResult(plan=plan, moved=plan.move, note_commit=note_commit, at=at, reason=reason)
