"""The release on the Hub, through ``huggingface_hub``'s own API: push, promote, reject.

The release model, and why consumers never see a half-uploaded revision:

1. ``push_candidate`` makes ONE commit on ``main`` holding the whole folder (checkpoint + card).
   Large files are uploaded to LFS storage first, where no ref can reach them; the commit endpoint
   then creates the commit with its complete tree in one step. A commit either exists whole or
   not at all, so a dropped connection leaves ``main`` where it was (or, if only the answer was
   lost, at the finished commit). Content addressing makes the push idempotent: a re-run with the
   same bytes finds them already at the head and makes no commit; a re-run after a failure uploads
   what is missing and ends in one complete revision.
2. The gates run against that exact commit sha.
3. ``promote_revision`` moves the release ref (tag or branch) to that sha only after the commit
   exists and the gates passed, and checks afterwards that the ref points there. Consumers who pin
   the release ref therefore only ever resolve complete, gated commits. (Moving a ref is delete +
   create on the Hub: for a moment the ref is missing, never pointing at something partial.)
4. ``record_rejection`` never touches the release ref.

"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quantize_serve.core.digest import update_from_file
from quantize_serve.core.errors import HubError
from quantize_serve.hub.client import (
    CARD,
    DEFAULT_RETRY,
    HUB_OWNED,
    SHA40,
    PushResult,
    RetryPolicy,
    _api,
    _hub_call,
    _run,
)
from quantize_serve.recipe.model import HubSection
from quantize_serve.recipe.section import REJECTION_TAG_PREFIX

if TYPE_CHECKING:
    from huggingface_hub import HfApi

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _LocalFile:
    path: Path
    size: int
    sha256: str
    git_sha1: str  # git blob id: what the Hub reports for a regular (non-LFS) file


def _scan_folder(folder: Path) -> dict[str, _LocalFile]:
    """Every file to upload, with the two hashes the Hub may report for it (one read per file)."""
    out: dict[str, _LocalFile] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if not path.is_file() or ".git" in rel.split("/") or rel.startswith(".cache/huggingface"):
            continue
        size = path.stat().st_size
        sha256, sha1 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)
        update_from_file(path, sha256, sha1)
        out[rel] = _LocalFile(path, size, sha256.hexdigest(), sha1.hexdigest())
    return out


def _same(local: _LocalFile, remote: object) -> bool:
    """Does a remote sibling (``RepoSibling`` with files_metadata) hold exactly these bytes?"""
    if getattr(remote, "size", None) != local.size:
        return False
    lfs = getattr(remote, "lfs", None)
    return lfs.sha256 == local.sha256 if lfs else getattr(remote, "blob_id", None) == local.git_sha1


def push_candidate(
    hub: HubSection,
    folder: str | Path,
    *,
    token: str | None,
    commit_message: str,
    commit_description: str = "",
    endpoint: str | None = None,
    retry: RetryPolicy = DEFAULT_RETRY,
) -> PushResult:
    """Make ``main`` hold exactly ``folder`` (checkpoint + README.md) in ONE commit.

    Creates the repo (private per ``hub.private``) if missing. Compares local sizes and hashes
    with the head's tree first: identical bytes -> no commit, the head sha is returned with
    ``created_commit=False``. Otherwise one commit adds what changed and deletes files the folder
    no longer has (a stale shard from an older candidate would break the checkpoint). The commit
    carries ``parentCommit`` = the head we compared against, so a concurrent push fails loudly.
    """
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    folder = Path(folder)
    if not folder.is_dir():
        raise HubError(f"cannot push {folder}: not a folder")
    local = _scan_folder(folder)
    if CARD not in local:
        raise HubError(
            f"cannot push {folder}: it has no {CARD} model card (render one with "
            "quantize_serve.release.card.render_model_card and save it there)"
        )
    api = _api(endpoint, token)
    call = _hub_call(hub, "push the candidate", "main", token, retry)
    first_head: list[str] = []

    def attempt(_: int) -> PushResult:
        api.create_repo(hub.repo_id, private=hub.private, exist_ok=True)
        info = api.model_info(hub.repo_id, revision="main", files_metadata=True)
        head = str(info.sha)
        first_head.append(head)
        remote = {s.rfilename: s for s in info.siblings or []}
        changed = [p for p, f in local.items() if p not in remote or not _same(f, remote[p])]
        removed = [p for p in remote if p not in local and p not in HUB_OWNED]
        if changed or removed:
            ops: list[CommitOperationAdd | CommitOperationDelete] = [
                CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(local[p].path)) for p in changed
            ]
            ops += [CommitOperationDelete(path_in_repo=p) for p in removed]
            logger.info(
                "pushing %d changed and %d removed file(s) to %s on top of %s",
                len(changed),
                len(removed),
                hub.repo_id,
                head[:12],
            )
            head = api.create_commit(
                hub.repo_id,
                ops,
                commit_message=commit_message,
                commit_description=commit_description,
                revision="main",
                parent_commit=head,
            ).oid
        if info.private is not None and info.private != hub.private:
            logger.warning(
                "%s exists with private=%s; hub.private=%s is applied on creation only",
                hub.repo_id,
                info.private,
                hub.private,
            )
        return PushResult(
            repo_id=hub.repo_id,
            commit_sha=head,
            created_commit=head != first_head[0],
            url=f"{api.endpoint}/{hub.repo_id}/commit/{head}",
        )

    result = _run(call, attempt)
    logger.info(
        "%s: main is at %s (%s)",
        hub.repo_id,
        result.commit_sha,
        "new commit" if result.created_commit else "unchanged, no commit",
    )
    return result


def update_model_card(
    hub: HubSection,
    card_text: str,
    *,
    parent_commit: str,
    token: str | None,
    files: dict[str, bytes] | None = None,
    commit_message: str = "Update model card",
    commit_description: str = "",
    endpoint: str | None = None,
    retry: RetryPolicy = DEFAULT_RETRY,
) -> str:
    """One commit on ``main`` that changes README.md (and the card's own ``files``, such as its
    chart) only; returns the new sha, or the parent when nothing changed.

    ``parentCommit`` makes the Hub refuse (412 -> HubError) if ``main`` moved since the caller
    looked, so a card never lands on top of someone else's push.
    """
    from huggingface_hub import CommitOperationAdd

    contents = {CARD: card_text.encode(), **(files or {})}
    blob_ids = {
        name: hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() for name, data in contents.items()
    }
    api = _api(endpoint, token)
    call = _hub_call(hub, "update the model card", parent_commit, token, retry)

    def holds_card(revision: str) -> bool:
        info = api.model_info(hub.repo_id, revision=revision, files_metadata=True)
        remote = {s.rfilename: s.blob_id for s in info.siblings or []}
        return all(remote.get(name) == blob for name, blob in blob_ids.items())

    def attempt(n: int) -> str:
        if holds_card(parent_commit):
            return parent_commit
        if n > 1:  # a lost answer may hide a commit that landed: is main our card on our parent?
            commits = api.list_repo_commits(hub.repo_id, revision="main")
            if (
                len(commits) > 1
                and commits[1].commit_id == parent_commit
                and holds_card(commits[0].commit_id)
            ):
                return commits[0].commit_id
        ops = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=data) for name, data in contents.items()]
        return api.create_commit(
            hub.repo_id,
            ops,
            commit_message=commit_message,
            revision="main",
            commit_description=commit_description,
            parent_commit=parent_commit,
        ).oid

    return _run(call, attempt)


# --------------------------------------------------------------------------------------------
# Promote / reject
# --------------------------------------------------------------------------------------------


def _check_sha(commit_sha: str) -> None:
    if not SHA40.match(commit_sha):
        raise ValueError(f"expected a full 40-character commit sha, got {commit_sha!r}")


def _ref_target(api: HfApi, repo_id: str, name: str, kind: str) -> str | None:
    refs = api.list_repo_refs(repo_id)
    return next(
        (r.target_commit for r in (refs.tags if kind == "tag" else refs.branches) if r.name == name), None
    )


def _delete_ref(api: HfApi, repo_id: str, name: str, kind: str) -> None:
    if kind == "tag":
        api.delete_tag(repo_id, tag=name)
    else:
        api.delete_branch(repo_id, branch=name)


def _create_ref(api: HfApi, repo_id: str, name: str, kind: str, commit_sha: str, message: str) -> None:
    """The Hub has no "move" for a ref: a move is :func:`_delete_ref` then this."""
    if kind == "tag":
        api.create_tag(repo_id, tag=name, revision=commit_sha, tag_message=message)
    else:
        api.create_branch(repo_id, branch=name, revision=commit_sha)


def promote_revision(
    hub: HubSection,
    commit_sha: str,
    *,
    token: str | None,
    run_id: str | None = None,
    endpoint: str | None = None,
    retry: RetryPolicy = DEFAULT_RETRY,
) -> str:
    """Point the release ref (``hub.release_ref``, a tag or branch) at exactly ``commit_sha``.

    Checks the commit exists before touching the ref, moves the ref if it points elsewhere
    (delete + create: the Hub has no "move"), then verifies with ``list_repo_refs``. Returns the
    sha the ref points at. See the module docstring for why consumers never see a partial revision.
    """
    _check_sha(commit_sha)
    ref, kind = hub.release_ref, hub.release_ref_kind
    if kind == "branch" and ref == "main":
        raise HubError(
            "hub.release_ref must not be 'main' when it is a branch: candidates are pushed "
            "to main; name the release branch e.g. 'production'"
        )
    api = _api(endpoint, token)
    call = _hub_call(hub, f"promote to {kind} {ref!r}", commit_sha, token, retry)
    message = f"quantize-serve: promoted {commit_sha}" + (f" (run {run_id})" if run_id else "")

    def attempt(_: int) -> str:
        api.model_info(hub.repo_id, revision=commit_sha)  # 404 here leaves the old ref in place
        current = _ref_target(api, hub.repo_id, ref, kind)
        if current != commit_sha:
            if current is not None:
                _delete_ref(api, hub.repo_id, ref, kind)
            _create_ref(api, hub.repo_id, ref, kind, commit_sha, message)
            logger.info(
                "%s: %s %r moved %s -> %s",
                hub.repo_id,
                kind,
                ref,
                current[:12] if current else "(none)",
                commit_sha[:12],
            )
        after = _ref_target(api, hub.repo_id, ref, kind)
        if after != commit_sha:
            raise HubError(
                f"promote on {hub.repo_id}: {kind} {ref!r} points at {after} after the move, "
                f"not {commit_sha}; another promotion ran at the same time. Re-run."
            )
        return commit_sha

    return _run(call, attempt)


def rejection_tag(commit_sha: str) -> str:

    return f"{REJECTION_TAG_PREFIX}{commit_sha[:12]}"


def record_rejection(
    hub: HubSection,
    commit_sha: str,
    reasons: list[str],
    *,
    token: str | None,
    run_id: str,
    card_text: str | None = None,
    files: dict[str, bytes] | None = None,
    endpoint: str | None = None,
    retry: RetryPolicy = DEFAULT_RETRY,
) -> str:
    """Record that ``commit_sha`` failed its gates, without touching the release ref.

    Where a release engineer sees it: a tag ``rejected-<12-char sha>`` on that exact commit (listed
    in the repo's branch/tag menu and by ``list_repo_refs``) whose message lists the reasons and
    the run id, and, when ``card_text`` is given (a card rendered with status "rejected"), the
    model card on ``main`` (with ``files``, such as the run's release-results.json) - but only if
    ``main`` is still that commit, so a newer candidate's card is never overwritten. Idempotent: an
    existing tag is kept. Returns the tag name.
    """
    _check_sha(commit_sha)
    if not reasons:
        raise ValueError("record_rejection needs at least one reason")
    tag = rejection_tag(commit_sha)
    if tag == hub.release_ref:
        raise HubError(f"hub.release_ref {tag!r} collides with the rejection tag; rename the release ref")
    message = f"Rejected by quantize-serve run {run_id}:\n" + "\n".join(f"- {r}" for r in reasons)
    api = _api(endpoint, token)
    call = _hub_call(hub, "record the rejection", commit_sha, token, retry)

    def attempt(_: int) -> str:
        api.model_info(hub.repo_id, revision=commit_sha)
        api.create_tag(hub.repo_id, tag=tag, revision=commit_sha, tag_message=message, exist_ok=True)
        return str(api.model_info(hub.repo_id, revision="main").sha)

    head = _run(call, attempt)
    if card_text is not None:
        if head == commit_sha:
            update_model_card(
                hub,
                card_text,
                parent_commit=commit_sha,
                token=token,
                endpoint=endpoint,
                files=files,
                commit_message=f"Model card: candidate {commit_sha[:12]} rejected",
                retry=retry,
            )
        else:
            logger.warning(
                "%s: main moved on to %s; the rejection of %s is recorded in tag %s only",
                hub.repo_id,
                head[:12],
                commit_sha[:12],
                tag,
            )
    logger.info(
        "%s: candidate %s rejected (%s); release ref %r untouched",
        hub.repo_id,
        commit_sha[:12],
        "; ".join(reasons),
        hub.release_ref,
    )
    return tag
