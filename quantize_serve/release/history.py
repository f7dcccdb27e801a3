"""The release history of a repo, from the Hub alone: every gated commit, what it decided and
measured, who approved it, and when the release ref moved to it or away from it.

What the Hub holds, and how it is read (``hub/releases.py`` reads; this module interprets):
- a promotion is a commit on ``main`` titled ``Gates passed (run ...)`` (the gated commit: the
  candidate plus its final card and ``release-results.json``), then the release ref moved to it;
- a rejection is a tag ``rejected-<sha>`` on the candidate, and, when main was still that candidate,
  a card commit titled ``Model card: candidate <sha> rejected`` with its ``release-results.json``;
- a rollback is a card commit titled ``Rollback of <kind> <ref> to <sha> from <sha>`` (the note on the
  card, quantize_serve/release/rollback.py), with the reason in its description; its author and date
  are the Hub's.
The release ref's target now is read from the repo's refs. When that target is no gated commit (a ref
moved by hand, or onto a rejected candidate), the history warns on top and names the rollback that
puts it back (:meth:`ReleaseHistory.ref_warning`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, Field, computed_field

from quantize_serve.core.errors import HubError
from quantize_serve.hub.releases import RepoState, read_file_at, read_repo_state
from quantize_serve.recipe.model import HubSection
from quantize_serve.recipe.section import REJECTION_TAG_PREFIX
from quantize_serve.report.release_results import RELEASE_RESULTS_FILE, ReleaseRecord, parse_release_record

GATED_TITLE = "Gates passed"  # promote_or_reject's commit: "Gates passed (run <id>)"
REJECTED_CARD_TITLE = re.compile(r"^Model card: candidate (?P<sha>[0-9a-f]{12}) rejected")
ROLLBACK_TITLE = re.compile(
    r"^Rollback of (?P<kind>tag|branch) (?P<ref>\S+) to (?P<to>[0-9a-f]{40}) "
    r"from (?P<from>[0-9a-f]{40}|nothing)"
)
HISTORY_COLUMNS = (
    "commit",
    "decision",
    "run",
    "recipe",
    "min recovery",
    "KV tokens",
    "max concurrency",
    "out tok/s",
    "approved by",
    "promoted",
    "rolled back from here",
    "rolled back to here",
    "now",
)


def rollback_title(kind: str, ref: str, to: str, previous: str | None) -> str:
    """The title of a rollback's card commit: how the history finds it again (ROLLBACK_TITLE)."""
    return f"Rollback of {kind} {ref} to {to} from {previous or 'nothing'}"


class RefEvent(BaseModel):
    """The release ref moved: a promotion (a gated commit) or a rollback (its card note)."""

    kind: Literal["promoted", "rolled back"]
    to: str
    previous: str | None = None
    at: str
    by: str = ""
    reason: str = ""
    note_commit: str | None = None


class ReleaseEntry(BaseModel):
    """One gated commit (promoted) or one rejected candidate."""

    commit: str = Field(description="the gated commit; for a rejection, the candidate it tagged")
    candidate: str | None = None
    status: Literal["promoted", "rejected"]
    at: str = ""
    record: ReleaseRecord | None = None  # release-results.json; None for releases made before it existed
    reasons: list[str] = Field(default_factory=list)
    rejection_tag: str | None = None  # the rejected-<sha> tag that marks a rejection
    rolled_back_from: list[RefEvent] = Field(default_factory=list)
    rolled_back_to: list[RefEvent] = Field(default_factory=list)
    current: bool = False


class ReleaseHistory(BaseModel):
    repo_id: str
    release_ref: str
    release_ref_kind: str
    current: str | None = Field(description="the commit the release ref points at now")
    main_head: str | None = None
    entries: list[ReleaseEntry] = Field(default_factory=list)  # oldest first
    events: list[RefEvent] = Field(default_factory=list)  # oldest first

    def gated(self) -> list[ReleaseEntry]:
        return [e for e in self.entries if e.status == "promoted"]

    def entry(self, sha: str) -> ReleaseEntry | None:
        return next((e for e in self.entries if e.commit == sha), None)

    def recorded_target(self) -> str | None:
        """Where the history says the ref should point (the last promotion or rollback)."""
        return self.events[-1].to if self.events else None

    def repair_target(self) -> ReleaseEntry | None:
        """The gated commit that puts the ref right when it points at no release: where the last promotion
        or rollback put it (a rollback away from a newer release stands), else the newest gated commit."""
        recorded = self.entry(self.recorded_target() or "")
        if recorded is not None and recorded.status == "promoted":
            return recorded
        gated = self.gated()
        return gated[-1] if gated else None

    def repair_command(self, target: ReleaseEntry) -> str:
        ref = "" if self.release_ref == "production" else f" --ref {self.release_ref}"
        kind = "" if self.release_ref_kind == "tag" else f" --ref-kind {self.release_ref_kind}"
        return f"quantize-serve rollback {self.repo_id}{ref}{kind} --to {target.commit}"

    @computed_field  # in `releases --json` too
    @property
    def ref_warning(self) -> str | None:
        """Why the release ref serves no release, and the command that repairs it; None while it points at
        a gated commit, or at nothing before any commit passed the gates."""
        target = self.repair_target()
        if self.current is None:
            if target is None:
                return None
            problem = (
                f"{self.release_ref} points at nothing, though {len(self.gated())} commit(s) of "
                f"{self.repo_id} passed the gates"
            )
        else:
            entry, sha = self.entry(self.current), self.current[:12]
            if entry is not None and entry.status == "promoted":
                return None
            if entry is not None:
                why = f": {'; '.join(entry.reasons)}" if entry.reasons else ""
                problem = (
                    f"{self.release_ref} serves {sha}, which the gates rejected "
                    f"({entry.rejection_tag or REJECTION_TAG_PREFIX + sha} tag{why})"
                )
            else:
                child = next((e for e in self.gated() if e.candidate == self.current), None)
                how = (
                    f"it is the candidate of the gated commit {child.commit[:12]}, without its final card "
                    "and recorded results"
                    if child
                    else f"the {self.release_ref_kind} was moved there by hand"
                )
                problem = f"{self.release_ref} serves {sha}, which no gate passed ({how})"
        if target is None:
            return (
                f"{problem}. No commit of {self.repo_id} passed the gates yet, so there is none to roll back "
                "to. Fix: release one through the gates (`quantize-serve run RECIPE`)"
            )
        newest = self.gated()[-1]
        which = (
            "the newest gated commit"
            if target.commit == newest.commit
            else f"where the last rollback put it; the newest gated commit, {newest.commit[:12]}, was rolled "
            "back from"
        )
        return f"{problem}. Fix: `{self.repair_command(target)}` ({which})"

    def rows(self) -> list[dict[str, str]]:
        """The table: one row per entry, newest first (the CLI, the Prefect table artifact, the benchmark);
        first, a row for the ref's target when that is no commit the gates saw."""
        rows = [history_row(e) for e in reversed(self.entries)]
        if self.current is not None and self.entry(self.current) is None:
            rows.insert(
                0,
                {
                    **dict.fromkeys(HISTORY_COLUMNS, "-"),
                    "commit": self.current[:12],
                    "decision": "never gated",
                    "now": "<- current",
                },
            )
        return rows

    def table(self) -> str:
        """The CLI's view: the warning on top (ref_warning), the ref's target, the rows."""
        title = (
            f"{self.repo_id}: {self.release_ref_kind} {self.release_ref!r} -> "
            f"{self.current[:12] if self.current else 'nothing'}"
        )
        warning = f"WARNING: {self.ref_warning}\n" if self.ref_warning else ""
        if not self.entries:
            return f"{warning}{title}\nno gated release yet"
        return f"{warning}{title}\n{format_table(self.rows())}"


def _day(at: str) -> str:
    return at.replace("T", " ")[:16] if at else "-"


def _by(event: RefEvent) -> str:
    return f" by {event.by}" if event.by else ""


def history_row(e: ReleaseEntry) -> dict[str, str]:
    r = e.record
    res = r.results if r else None
    approved = "-" if r is None else (r.approved_by or "-") if r.approval == "manual" else "auto (gates)"
    if e.status == "rejected":
        approved = "-"
    return {
        "commit": e.commit[:12],
        "decision": e.status
        + (f": {'; '.join(e.reasons)[:80]}" if e.status == "rejected" and e.reasons else ""),
        "run": r.run_id if r else "-",
        "recipe": r.recipe if r else "-",
        "min recovery": f"{r.min_recovery:.4f}" if r and r.min_recovery is not None else "-",
        "KV tokens": f"{res.kv_cache_tokens:,}" if res and res.kv_cache_tokens is not None else "-",
        "max concurrency": f"{res.max_concurrency:.2f}" if res and res.max_concurrency is not None else "-",
        "out tok/s": f"{res.output_throughput:,.0f}" if res and res.output_throughput is not None else "-",
        "approved by": approved,
        "promoted": _day(e.at) if e.status == "promoted" else "-",
        "rolled back from here": "; ".join(
            f"{_day(v.at)} (to {v.to[:12]}{_by(v)})" for v in e.rolled_back_from
        )
        or "-",
        "rolled back to here": "; ".join(
            f"{_day(v.at)} (from {(v.previous or 'nothing')[:12]}{_by(v)})" for v in e.rolled_back_to
        )
        or "-",
        "now": ("<- current" if e.status == "promoted" else "<- current (rejected)") if e.current else "",
    }


def format_table(rows: list[dict[str, str]]) -> str:
    """Columns padded to their widest cell, as a terminal shows them."""
    columns = list(rows[0]) if rows else list(HISTORY_COLUMNS)
    widths = {c: max([len(c), *(len(r[c]) for r in rows)]) for c in columns}
    lines = [
        "  ".join(c.ljust(widths[c]) for c in columns).rstrip(),
        "  ".join("-" * widths[c] for c in columns),
    ]
    lines += ["  ".join(r[c].ljust(widths[c]) for c in columns).rstrip() for r in rows]
    return "\n".join(lines)


def release_history(
    hub: HubSection, *, token: str | None, endpoint: str | None = None, state: RepoState | None = None
) -> ReleaseHistory:
    """The history of ``hub.repo_id`` for its release ref, read from the Hub (refs, main's commits
    and the release-results.json of each gated or rejected commit)."""
    state = state or read_repo_state(hub, token=token, endpoint=endpoint)
    if not state.commits:
        raise HubError(f"{hub.repo_id} has no commits on main: nothing was ever released there")

    def record(sha: str) -> ReleaseRecord | None:
        data = read_file_at(hub, sha, RELEASE_RESULTS_FILE, token=token, endpoint=endpoint)
        return parse_release_record(data) if data else None

    return interpret(hub, state, record)


def interpret(
    hub: HubSection, state: RepoState, record: Callable[[str], ReleaseRecord | None]
) -> ReleaseHistory:
    """The history from a repo's state (pure but for ``record(sha)``, which reads a commit's record)."""
    ref, kind = hub.release_ref, hub.release_ref_kind
    current = state.ref_target(ref, kind)
    oldest_first = list(reversed(state.commits))
    rejected = {sha: name for name, sha in state.tags.items() if name.startswith(REJECTION_TAG_PREFIX)}
    entries: list[ReleaseEntry] = []
    events: list[RefEvent] = []
    for c in oldest_first:
        by = ", ".join(c.authors)
        if c.title.startswith(GATED_TITLE):
            rec = record(c.sha)
            entries.append(
                ReleaseEntry(commit=c.sha, candidate=c.parent, status="promoted", at=c.date, record=rec)
            )
            events.append(
                RefEvent(
                    kind="promoted", to=c.sha, at=c.date, by=by, previous=events[-1].to if events else None
                )
            )
        elif c.sha in rejected:
            card = next((k for k in state.children(c.sha) if REJECTED_CARD_TITLE.match(k.title)), None)
            rec = record(card.sha) if card else None
            entries.append(
                ReleaseEntry(
                    commit=c.sha,
                    candidate=c.sha,
                    status="rejected",
                    at=card.date if card else c.date,
                    record=rec,
                    reasons=rec.reasons if rec else [],
                    rejection_tag=rejected[c.sha],
                )
            )
        match = ROLLBACK_TITLE.match(c.title)
        if match and match["ref"] == ref and match["kind"] == kind:
            previous = None if match["from"] == "nothing" else match["from"]
            events.append(
                RefEvent(
                    kind="rolled back",
                    to=match["to"],
                    previous=previous,
                    at=c.date,
                    by=by,
                    reason=c.message.strip(),
                    note_commit=c.sha,
                )
            )
    by_sha = {e.commit: e for e in entries}
    for event in events:
        if event.kind != "rolled back":
            continue
        if event.previous in by_sha:
            by_sha[event.previous].rolled_back_from.append(event)
        if event.to in by_sha:
            by_sha[event.to].rolled_back_to.append(event)
    if current in by_sha:
        by_sha[current].current = True
    return ReleaseHistory(
        repo_id=hub.repo_id,
        release_ref=ref,
        release_ref_kind=kind,
        current=current,
        main_head=state.commits[0].sha,
        entries=entries,
        events=events,
    )


def current_release(history: ReleaseHistory) -> ReleaseEntry | None:
    """The gated release the ref points at now; None when it points at nothing or at a commit that
    was never gated (a first release, or a ref moved by hand)."""
    entry = history.entry(history.current) if history.current else None
    return entry if entry and entry.status == "promoted" else None
