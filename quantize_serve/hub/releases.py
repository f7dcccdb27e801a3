"""The release ref over time, on the Hub: what a repo's refs and ``main`` say, one file at a gated
commit, and moving the release ref back only if it still points where it was read.

Plain reads and one guarded write, through ``huggingface_hub``'s own API and the client's one
translator (``hub.client._run``: retries for transient failures, the token never in a message). What
the commits mean (gated, rejected, rolled back) is the release layer's (``release/history.py``).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from pydantic import BaseModel, Field

from quantize_serve.core.errors import HubError, RefMovedError
from quantize_serve.hub.client import DEFAULT_RETRY, RetryPolicy, _api, _Call, _hub_call, _run
from quantize_serve.hub.publish import _check_sha, _create_ref, _delete_ref, _ref_target
from quantize_serve.recipe.model import HubSection

logger = logging.getLogger(__name__)


class HubCommit(BaseModel):
    """One commit of ``main``, as ``list_repo_commits`` gives it."""

    sha: str
    title: str
    message: str = ""
    date: str = Field(description="UTC, ISO 8601")
    authors: list[str] = Field(default_factory=list)
    parent: str | None = None  # main is linear: the next older commit


class RepoState(BaseModel):
    """A repo's refs and main's history (newest first), read in one go."""

    repo_id: str
    tags: dict[str, str] = Field(default_factory=dict)  # name -> commit sha
    branches: dict[str, str] = Field(default_factory=dict)
    commits: list[HubCommit] = Field(default_factory=list)

    def ref_target(self, name: str, kind: str) -> str | None:
        return (self.tags if kind == "tag" else self.branches).get(name)

    def commit(self, sha: str) -> HubCommit | None:
        return next((c for c in self.commits if c.sha == sha), None)

    def children(self, sha: str) -> list[HubCommit]:
        return [c for c in self.commits if c.parent == sha]


def read_repo_state(
    hub: HubSection, *, token: str | None, endpoint: str | None = None, retry: RetryPolicy = DEFAULT_RETRY
) -> RepoState:
    """Tags, branches and ``main``'s commits of ``hub.repo_id`` (a read: a read-only token is enough)."""
    api = _api(endpoint, token)
    call = _hub_call(hub, "read the release history", "main", token, retry)

    def attempt(_: int) -> RepoState:
        refs = api.list_repo_refs(hub.repo_id)
        listed = api.list_repo_commits(hub.repo_id, revision="main")
        commits = [
            HubCommit(
                sha=c.commit_id,
                title=c.title or "",
                message=c.message or "",
                date=c.created_at.strftime("%Y-%m-%dT%H:%M:%SZ") if c.created_at else "",
                authors=list(c.authors or []),
                parent=listed[i + 1].commit_id if i + 1 < len(listed) else None,
            )
            for i, c in enumerate(listed)
        ]
        return RepoState(
            repo_id=hub.repo_id,
            tags={t.name: t.target_commit for t in refs.tags},
            branches={b.name: b.target_commit for b in refs.branches},
            commits=commits,
        )

    return _run(replace_writes(call), attempt)


def read_file_at(
    hub: HubSection,
    revision: str,
    filename: str,
    *,
    token: str | None,
    endpoint: str | None = None,
    retry: RetryPolicy = DEFAULT_RETRY,
) -> bytes | None:
    """One file of the repo at ``revision``; None when that revision has no such file."""
    from huggingface_hub.errors import EntryNotFoundError

    api = _api(endpoint, token)
    call = _hub_call(hub, f"read {filename}", revision, token, retry)

    def attempt(_: int) -> bytes | None:
        try:
            path = api.hf_hub_download(hub.repo_id, filename, revision=revision)
        except EntryNotFoundError:
            return None
        return Path(path).read_bytes()

    return _run(replace_writes(call), attempt)


def replace_writes(call: _Call) -> _Call:
    """The call as a read: a 403 then means "may not read", not "may not write"."""
    return replace(call, writes=False)


def move_release_ref(
    hub: HubSection,
    commit_sha: str,
    *,
    expected: str | None,
    token: str | None,
    message: str,
    endpoint: str | None = None,
    retry: RetryPolicy = DEFAULT_RETRY,
) -> str:
    """Point the release ref at ``commit_sha`` only while it still points at ``expected`` (what the
    caller read; None: it did not exist), so a ref someone else moved in between is never overwritten:
    that is a :class:`RefMovedError` and nothing changes. The Hub has no compare-and-swap for refs, so
    the check is made right before the move (delete + create), and the result is read back.

    Idempotent: a ref already at ``commit_sha`` is left alone. A retry after a failure between the
    delete and the create (the ref missing for that moment) creates it."""
    _check_sha(commit_sha)
    ref, kind = hub.release_ref, hub.release_ref_kind
    api = _api(endpoint, token)
    call = _hub_call(hub, f"move {kind} {ref!r}", commit_sha, token, retry)
    deleted: list[bool] = []

    def attempt(_: int) -> str:
        api.model_info(hub.repo_id, revision=commit_sha)  # 404 here leaves the ref where it is
        current = _ref_target(api, hub.repo_id, ref, kind)
        if current != commit_sha:
            if current != expected and not (current is None and deleted):
                raise RefMovedError(
                    f"{kind} {ref!r} of {hub.repo_id} points at {current or 'nothing'}, not at "
                    f"{expected or 'nothing'} as when this rollback read it: someone else moved it in "
                    f"between. Nothing was changed. Fix: look at `quantize-serve releases {hub.repo_id}` "
                    "and run the rollback again against the new state."
                )
            if current is not None:
                _delete_ref(api, hub.repo_id, ref, kind)
                deleted.append(True)
            _create_ref(api, hub.repo_id, ref, kind, commit_sha, message)
            logger.info(
                "%s: %s %r moved %s -> %s",
                hub.repo_id,
                kind,
                ref,
                (current or "(none)")[:12],
                commit_sha[:12],
            )
        after = _ref_target(api, hub.repo_id, ref, kind)
        if after != commit_sha:
            raise RefMovedError(
                f"{kind} {ref!r} of {hub.repo_id} points at {after or 'nothing'} right after it "
                f"was moved to {commit_sha}: someone else moved it at the same time. Look at "
                f"`quantize-serve releases {hub.repo_id}` and run the rollback again."
            )
        return commit_sha

    try:
        return _run(call, attempt)
    except RefMovedError:
        raise
    except HubError as exc:
        if deleted:  # the ref is gone: say so, and how to put it back
            raise type(exc)(
                f"{exc} The {kind} {ref!r} was deleted before the failure and not created "
                f"again: it points at nothing now. Re-run the rollback with --to {commit_sha} "
                "(it is idempotent) to create it."
            ) from None
        raise
