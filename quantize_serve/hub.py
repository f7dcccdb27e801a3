"""Everything the pipeline does on the Hugging Face Hub, through ``huggingface_hub``'s own API.

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

Failures from the client are translated in one place (``_run``): 401/403/404 become
``HubAuthError``/``HubNotFoundError`` with the fix, everything else ``HubError``. 5xx and 429 answers
and dropped connections are retried with bounded exponential backoff (a 429's Retry-After honoured);
other 4xx never are. The token is
scrubbed from every message and our errors are raised outside the ``except`` block, so no chained
exception (whose request carries the ``Authorization`` header) travels with them.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from quantize_serve.digest import update_from_file
from quantize_serve.errors import HubAuthError, HubError, HubNotFoundError

if TYPE_CHECKING:
    from huggingface_hub import HfApi

    from quantize_serve.recipe import HubSection

logger = logging.getLogger(__name__)
T = TypeVar("T")
SHA40 = re.compile(r"^[0-9a-f]{40}$")
CARD = "README.md"
# Never compared or deleted: the Hub writes it into every new repo and owns its LFS rules.
HUB_OWNED = frozenset({".gitattributes"})


class RetryPolicy(BaseModel):
    """Bounded exponential backoff for transient Hub failures (5xx, 429, dropped connections).

    A 429 waits at least what its ``Retry-After`` header asks, capped at ``max_s``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    attempts: int = Field(default=4, ge=1, le=10)
    base_s: float = Field(default=1.0, ge=0)
    max_s: float = Field(default=30.0, ge=0)

    def delay(self, failed_attempt: int, retry_after_s: float = 0.0) -> float:
        return min(max(self.base_s * 2 ** (failed_attempt - 1), retry_after_s), self.max_s)


DEFAULT_RETRY = RetryPolicy()


class ResolvedModel(BaseModel):
    """A base model pinned to one commit: what was asked, what it resolved to, where it lies."""

    model_config = ConfigDict(frozen=True)

    repo_id: str
    revision: str | None = Field(description="Branch, tag or sha as asked (None = main).")
    sha: str = Field(pattern=r"^[0-9a-f]{40}$")
    local_dir: Path


class PushResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    repo_id: str
    commit_sha: str = Field(pattern=r"^[0-9a-f]{40}$")
    created_commit: bool = Field(description="False when the head already held these exact bytes.")
    url: str


# --------------------------------------------------------------------------------------------
# Token
# --------------------------------------------------------------------------------------------


def resolve_token(hub: HubSection) -> str | None:
    """The Hub token from the env var ``hub.token_env``, else the Prefect Secret block, else None.

    None lets ``huggingface_hub`` fall back to a login on this machine; writes without any token
    fail with a HubAuthError that names the variable to set. Prefect is imported only when a
    block is configured, so this stays cheap in tests and the CLI.
    """
    value = os.environ.get(hub.token_env, "").strip()
    if value:
        logger.debug("Hub token from the environment variable %s", hub.token_env)
        return value
    if hub.token_secret_block:
        try:
            from prefect.blocks.system import Secret

            secret = Secret.load(hub.token_secret_block)
            value = str(secret.get()).strip()  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - translated, with the block's name and the fix
            reason = type(exc).__name__
        else:
            if value:
                logger.debug("Hub token from the Prefect Secret block %r", hub.token_secret_block)
                return value
            reason = "it is empty"
        raise HubAuthError(
            f"could not read the Hub token from the Prefect Secret block {hub.token_secret_block!r} "
            f"({reason}). Create it (prefect block create secret, or Secret(value=...).save("
            f"{hub.token_secret_block!r})) or set the environment variable {hub.token_env}."
        )
    return None


# --------------------------------------------------------------------------------------------
# Error translation and retries: the one place
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    """What a Hub operation is about, for its error messages and its retries."""

    action: str
    repo_id: str
    revision: str | None
    token: str | None = field(repr=False)  # never in a repr, a log line or a traceback's locals dump
    token_env: str = "HF_TOKEN"
    secret_block: str | None = None
    retry: RetryPolicy = DEFAULT_RETRY
    writes: bool = True

    def scrub(self, text: str) -> str:
        if self.token:
            text = text.replace(self.token, "<token>")
        text = re.sub(r"(?i)(bearer\s+)[^\s'\"]+", r"\1<token>", text)
        return re.sub(r"\bhf_[A-Za-z0-9]{16,}", "hf_<token>", text)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is not None and all(e is not s for s in seen):
            seen.append(e)
            todo += [e.__cause__, e.__context__]
    return seen


def _classify(exc: BaseException) -> tuple[int | None, str | None, str, bool]:
    """(HTTP status, X-Error-Code, server message, transient?) found anywhere in the chain."""
    import httpx
    from huggingface_hub.errors import HfHubHTTPError

    for e in _chain(exc):
        if isinstance(e, HfHubHTTPError) and e.response is not None:
            status = e.response.status_code
            code = e.response.headers.get("X-Error-Code")
            message = e.server_message or e.response.reason_phrase or ""
            return status, code, message, status >= 500 or status == 429
    for e in _chain(exc):
        if isinstance(e, (httpx.TransportError, ConnectionError)):
            return None, None, f"{type(e).__name__}: {e}", True
    return None, None, f"{type(exc).__name__}: {exc}", False


def _retry_after_s(exc: BaseException) -> float:
    """Seconds a 429 (or 503) answer's Retry-After header asks for; 0 when it names none."""
    from huggingface_hub.errors import HfHubHTTPError

    for e in _chain(exc):
        if isinstance(e, HfHubHTTPError) and e.response is not None:
            try:
                return float(e.response.headers.get("Retry-After", 0))
            except ValueError:  # an HTTP date: wait the policy's own delay
                return 0.0
    return 0.0


def _translate(call: _Call, exc: BaseException, attempts: int) -> HubError:
    status, code, message, transient = _classify(exc)
    where = f"{call.action} on {call.repo_id}" + (f"@{call.revision}" if call.revision else "")
    token_source = f"the environment variable {call.token_env}" + (
        f" or the Prefect Secret block {call.secret_block!r}" if call.secret_block else "")
    namespace = call.repo_id.split("/")[0]
    if status == 401:
        err: HubError = HubAuthError(
            f"{where} failed: the Hub rejected the token (missing or wrong): set {token_source} "
            "to a valid token (https://huggingface.co/settings/tokens) and re-run.")
    elif status == 403 and not call.writes:
        err = HubAuthError(
            f"{where} failed: the token may not read {call.repo_id!r} (HTTP 403: {message}). If it "
            "is a gated or restricted repo, request access on its page, then use a token of that "
            f"account in {token_source}.")
    elif status == 403:
        err = HubAuthError(
            f"{where} failed: the token has no write access to {namespace!r} (HTTP 403: "
            f"{message}). Put a token with the 'write' role, or a fine-grained token with write "
            f"access to {namespace!r}, in {token_source}.")
    elif status == 404 and code == "RevisionNotFound":
        err = HubNotFoundError(
            f"{where} failed: revision {call.revision!r} does not exist in {call.repo_id}. "
            "Use an existing branch, tag or full 40-character commit sha.")
    elif status == 404 and code == "EntryNotFound":
        err = HubNotFoundError(f"{where} failed: a file is missing at that revision ({message}).")
    elif status == 404:
        err = HubNotFoundError(
            f"{where} failed: the repo {call.repo_id!r} (revision {call.revision or 'main'!r}) was "
            "not found, or it is private and the token cannot see it. Check the repo id and "
            f"that {token_source} holds a token with access.")
    elif status in (409, 412):
        err = HubError(
            f"{where} failed: the repo changed while this run worked (HTTP {status}: {message}); "
            "another run pushed or moved a ref at the same time. Nothing was overwritten; re-run "
            "to work on top of the new state.")
    elif status == 429:
        err = HubError(
            f"{where} failed after {attempts} attempt(s): the Hub rate-limited these requests (HTTP 429: "
            f"{message}). Wait a few minutes and re-run; pushes are content-addressed, so a re-run "
            "ends in one complete revision and the release ref is untouched until promotion.")
    elif transient and "xet" in message.lower():
        err = HubError(
            f"{where} failed: {message}. The endpoint does not speak the Xet upload protocol (the "
            "local test hub speaks plain LFS only): set HF_HUB_DISABLE_XET=1 before starting.")
    elif transient and not call.writes:
        err = HubError(
            f"{where} failed after {attempts} attempt(s): {message or 'HTTP ' + str(status)}. "
            "The Hub or the network failed; check that the Hub (or HF_ENDPOINT) is reachable and re-run.")
    elif transient:
        err = HubError(
            f"{where} failed after {attempts} attempt(s): {message or 'HTTP ' + str(status)}. "
            "The Hub or the network failed; re-run: pushes are content-addressed, so a re-run "
            "ends in one complete revision and the release ref is untouched until promotion.")
    elif status is not None:
        err = HubError(f"{where} failed: HTTP {status}: {message}")
    else:
        err = HubError(f"{where} failed: {message}")
    return type(err)(call.scrub(str(err)))


def _run(call: _Call, attempt_fn: Callable[[int], T]) -> T:
    """Run ``attempt_fn(attempt)`` with retries on transient failures; translate the rest.

    Each attempt must be idempotent (they all re-read the Hub's state first). The translated
    error is raised outside the ``except`` block on purpose: ``raise ... from None`` would still
    keep the client's exception (and its request with the Authorization header) as
    ``__context__``.
    """
    attempt = 0
    while True:
        attempt += 1
        failure: HubError | None = None
        try:
            return attempt_fn(attempt)
        except HubError:
            raise
        except Exception as exc:  # noqa: BLE001 - every client failure goes through _translate
            _, _, message, transient = _classify(exc)
            if transient and attempt < call.retry.attempts:
                delay = call.retry.delay(attempt, _retry_after_s(exc))
                logger.warning("%s on %s: %s; retrying in %.2fs (attempt %d of %d)", call.action,
                               call.repo_id, call.scrub(message), delay, attempt + 1, call.retry.attempts)
            else:
                failure = _translate(call, exc, attempt)
        if failure is not None:
            raise failure
        time.sleep(delay)


def _api(endpoint: str | None, token: str | None) -> HfApi:
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint, token=token)


def _hub_call(hub: HubSection, action: str, revision: str | None, token: str | None,
              retry: RetryPolicy) -> _Call:
    return _Call(action, hub.repo_id, revision, token, hub.token_env, hub.token_secret_block, retry)


# --------------------------------------------------------------------------------------------
# Base model
# --------------------------------------------------------------------------------------------


# What quantizing (llm-compressor) and serving (vLLM) read from a base model repo: the config, the
# weights as safetensors (shards and their index), the tokenizer and the chat template. Nothing else
# is fetched:
# - no file in a subfolder ("*/*"): Meta's repos ship original/ with the consolidated .pth weights,
#   as large as the model itself, which would double the download;
# - no other weight format (*.bin, *.pth, *.pt, *.h5, *.msgpack, *.gguf, Mistral's
#   consolidated*.safetensors) when the repo has safetensors; a repo without any gets its
#   pytorch_model*.bin instead (BASE_MODEL_LEGACY_WEIGHTS), which llm-compressor can still load.
BASE_MODEL_FILES = (
    "config.json", "generation_config.json",
    "*.safetensors", "*.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "tokenizer.model", "*.tiktoken", "vocab.json", "merges.txt", "vocab.txt",
    "chat_template.json", "*.jinja",
)
BASE_MODEL_IGNORED = ("*/*", "consolidated*")
BASE_MODEL_LEGACY_WEIGHTS = ("pytorch_model*.bin", "pytorch_model*.bin.index.json")
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def base_model_cache() -> Path:
    """Where base models are downloaded: the ``hub`` folder of the work cache (``QS_WORK_DIR``)."""
    from quantize_serve.settings import get_settings

    return get_settings().work_dir / "hub"


def base_model_patterns(filenames: list[str], *, weights: bool = True) -> tuple[list[str], list[str]]:
    """(allow_patterns, ignore_patterns) for a repo holding ``filenames``: BASE_MODEL_FILES, plus
    the legacy .bin weights only when no safetensors would be taken; ``weights=False``: the config
    and tokenizer files only (what a dummy-weights boot reads)."""
    from huggingface_hub.utils import filter_repo_objects

    allow, ignore = list(BASE_MODEL_FILES), list(BASE_MODEL_IGNORED)
    if not weights:
        return [p for p in allow if "safetensors" not in p], ignore
    if not any(filter_repo_objects(filenames, allow_patterns="*.safetensors", ignore_patterns=ignore)):
        allow += BASE_MODEL_LEGACY_WEIGHTS
    return allow, ignore


def resolve_base_model(repo_id: str, *, revision: str | None, token: str | None,
                       cache_dir: str | Path | None = None, endpoint: str | None = None,
                       token_env: str = "HF_TOKEN", secret_block: str | None = None,
                       retry: RetryPolicy = DEFAULT_RETRY, weights: bool = True) -> ResolvedModel:
    """Pin ``revision`` (branch, tag, sha or None = main) to a commit, then download that commit.

    Resolving first means the whole run (quantization, card, provenance) names one immutable
    sha, even if the branch moves while we download. Only the files quantizing and serving need
    are fetched (``base_model_patterns``; ``weights=False``: config and tokenizer only), into
    ``cache_dir`` (default: ``base_model_cache()``), and only after checking that the disk holding
    it has room for what the cache lacks.

    ``token`` None means the client's own default (the HF_TOKEN variable or a login on this
    machine); it is looked up here so that it is scrubbed from messages like a given one.
    ``token_env`` and ``secret_block`` only name where the token came from, for messages.
    """
    from huggingface_hub import get_token, snapshot_download

    token = token or get_token()
    cache = Path(cache_dir) if cache_dir is not None else base_model_cache()  # never str(None)
    api = _api(endpoint, token)
    call = _Call("resolve the base model", repo_id, revision, token, token_env, secret_block, retry,
                 writes=False)

    def attempt(_: int) -> ResolvedModel:
        info = api.model_info(repo_id, revision=revision, files_metadata=True)
        sha = info.sha
        if not sha or not SHA40.match(sha):
            raise HubError(f"the Hub returned no commit sha for {repo_id}@{revision}")
        siblings = info.siblings or []
        allow, ignore = base_model_patterns([s.rfilename for s in siblings], weights=weights)
        wanted = _select(siblings, allow, ignore)
        missing = _missing_bytes(cache, repo_id, wanted)
        free = _free_bytes(cache)
        if free is not None and missing > free:
            raise _disk_space_error(repo_id, sha, cache, missing, started=False)
        logger.info("downloading %d file(s) of %s@%s into %s (%.1f MB not in the cache yet)",
                    len(wanted), repo_id, sha[:12], cache, missing / 1e6)
        try:
            local = snapshot_download(repo_id, revision=sha, cache_dir=cache, token=token, endpoint=endpoint,
                                      allow_patterns=allow, ignore_patterns=ignore)
        except OSError as exc:
            if not any(isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS for e in _chain(exc)):
                raise
            local = None
        if local is None:  # raised here, not in the except: no client exception chained
            raise _disk_space_error(repo_id, sha, cache, missing, started=True)
        return ResolvedModel(repo_id=repo_id, revision=revision, sha=sha, local_dir=Path(local))

    resolved = _run(call, attempt)
    logger.info("base model %s@%s resolved to %s", repo_id, revision or "main", resolved.sha)
    return resolved


def _select(siblings: list, allow: list[str], ignore: list[str]) -> list:
    """The siblings snapshot_download will fetch with these patterns (the client's own filter)."""
    from huggingface_hub.utils import filter_repo_objects

    return list(filter_repo_objects(siblings, allow_patterns=allow, ignore_patterns=ignore,
                                    key=lambda s: s.rfilename))


def _missing_bytes(cache: Path, repo_id: str, siblings: list) -> int:
    """Bytes of ``siblings`` not yet in the cache. The client stores each file once, as
    ``blobs/<etag>`` (the sha256 of an LFS file, the git blob id of a small one), so a file already
    fetched for any revision counts as present."""
    from huggingface_hub.file_download import repo_folder_name

    blobs = cache / repo_folder_name(repo_id=repo_id, repo_type="model") / "blobs"
    missing = 0
    for s in siblings:
        etag = s.lfs.sha256 if s.lfs else s.blob_id
        blob = blobs / etag if etag else None
        if blob is None or not blob.is_file() or blob.stat().st_size != (s.size or 0):
            missing += s.size or 0
    return missing


def _free_bytes(folder: Path) -> int | None:
    """Free bytes on the disk that holds ``folder`` (its nearest existing parent); None if unknown."""
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    try:
        return shutil.disk_usage(existing).free if existing else None
    except OSError:
        return None


def _disk_space_error(repo_id: str, sha: str, cache: Path, needed: int, *, started: bool) -> HubError:
    """The disk cannot hold the base model: before the download (``started=False``, nothing fetched) or
    when a download filled it. Where, how much is free, how much the model needs, the fix."""
    free = _free_bytes(cache)

    def size(n: int | None) -> str:
        if n is None:
            return "an unknown amount"
        return f"{n / 1e9:.1f} GB ({n:,} bytes)" if n >= 1e9 else f"{n / 1e6:.1f} MB ({n:,} bytes)"

    what = f"download the base model {repo_id}@{sha}"
    if started:
        head = (f"{what} failed: the disk is full (no space left on the device holding the download "
                f"cache {cache}; {size(free)} free, the files to download take {size(needed)}).")
    else:
        head = (f"{what} was not started: the disk is full for this model (the files to download take "
                f"{size(needed)}, the device holding the download cache {cache} has {size(free)} free).")
    return HubError(
        f"{head} Fix: free space there, or point QS_WORK_DIR at a disk with room (base models are "
        "downloaded to its hub/ folder, not to HF_HUB_CACHE), and re-run: files already downloaded "
        "are kept.")


def fetch_model_config(repo_id: str, *, revision: str | None = None, token: str | None = None,
                       endpoint: str | None = None, token_env: str = "HF_TOKEN",
                       retry: RetryPolicy = RetryPolicy(attempts=1)) -> dict:
    """A Hub model's config.json, and nothing else (the planner and the command line's checks need
    only its shape). Made for a command line: one attempt, and one plain request first, because
    ``hf_hub_download`` alone retries a dead network for about half a minute; when the Hub cannot be
    reached, a copy in the local cache is used if there is one."""
    import httpx
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url, try_to_load_from_cache

    call = _Call("fetch config.json", repo_id, revision, token, token_env, None, retry, writes=False)

    def attempt(_: int) -> dict:
        if not constants.HF_HUB_OFFLINE:
            try:
                get_hf_file_metadata(hf_hub_url(repo_id, "config.json", revision=revision, endpoint=endpoint),
                                     token=token)
            except httpx.TransportError:
                cached = try_to_load_from_cache(repo_id, "config.json", revision=revision)
                if not isinstance(cached, str):
                    raise
                return json.loads(Path(cached).read_text())
        path = hf_hub_download(repo_id, "config.json", revision=revision, token=token, endpoint=endpoint)
        return json.loads(Path(path).read_text())

    return _run(call, attempt)


# --------------------------------------------------------------------------------------------
# Push
# --------------------------------------------------------------------------------------------


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


def push_candidate(hub: HubSection, folder: str | Path, *, token: str | None, commit_message: str,
                   commit_description: str = "", endpoint: str | None = None,
                   retry: RetryPolicy = DEFAULT_RETRY) -> PushResult:
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
        raise HubError(f"cannot push {folder}: it has no {CARD} model card (render one with "
                       "quantize_serve.model_card.render_model_card and save it there)")
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
                CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(local[p].path)) for p in changed]
            ops += [CommitOperationDelete(path_in_repo=p) for p in removed]
            logger.info("pushing %d changed and %d removed file(s) to %s on top of %s",
                        len(changed), len(removed), hub.repo_id, head[:12])
            head = api.create_commit(hub.repo_id, ops, commit_message=commit_message,
                                     commit_description=commit_description, revision="main",
                                     parent_commit=head).oid
        if info.private is not None and info.private != hub.private:
            logger.warning("%s exists with private=%s; hub.private=%s is applied on creation only",
                           hub.repo_id, info.private, hub.private)
        return PushResult(repo_id=hub.repo_id, commit_sha=head, created_commit=head != first_head[0],
                          url=f"{api.endpoint}/{hub.repo_id}/commit/{head}")

    result = _run(call, attempt)
    logger.info("%s: main is at %s (%s)", hub.repo_id, result.commit_sha,
                "new commit" if result.created_commit else "unchanged, no commit")
    return result


def update_model_card(hub: HubSection, card_text: str, *, parent_commit: str, token: str | None,
                      files: dict[str, bytes] | None = None, commit_message: str = "Update model card",
                      endpoint: str | None = None, retry: RetryPolicy = DEFAULT_RETRY) -> str:
    """One commit on ``main`` that changes README.md (and the card's own ``files``, such as its
    chart) only; returns the new sha, or the parent when nothing changed.

    ``parentCommit`` makes the Hub refuse (412 -> HubError) if ``main`` moved since the caller
    looked, so a card never lands on top of someone else's push.
    """
    from huggingface_hub import CommitOperationAdd

    contents = {CARD: card_text.encode(), **(files or {})}
    blob_ids = {name: hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() for name, data in contents.items()}
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
            if len(commits) > 1 and commits[1].commit_id == parent_commit and holds_card(commits[0].commit_id):
                return commits[0].commit_id
        ops = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=data) for name, data in contents.items()]
        return api.create_commit(hub.repo_id, ops, commit_message=commit_message, revision="main",
                                 parent_commit=parent_commit).oid

    return _run(call, attempt)


# --------------------------------------------------------------------------------------------
# Promote / reject
# --------------------------------------------------------------------------------------------


def _check_sha(commit_sha: str) -> None:
    if not SHA40.match(commit_sha):
        raise ValueError(f"expected a full 40-character commit sha, got {commit_sha!r}")


def _ref_target(api: HfApi, repo_id: str, name: str, kind: str) -> str | None:
    refs = api.list_repo_refs(repo_id)
    return next((r.target_commit for r in (refs.tags if kind == "tag" else refs.branches)
                 if r.name == name), None)


def promote_revision(hub: HubSection, commit_sha: str, *, token: str | None, run_id: str | None = None,
                     endpoint: str | None = None, retry: RetryPolicy = DEFAULT_RETRY) -> str:
    """Point the release ref (``hub.release_ref``, a tag or branch) at exactly ``commit_sha``.

    Checks the commit exists before touching the ref, moves the ref if it points elsewhere
    (delete + create: the Hub has no "move"), then verifies with ``list_repo_refs``. Returns the
    sha the ref points at. See the module docstring for why consumers never see a partial revision.
    """
    _check_sha(commit_sha)
    ref, kind = hub.release_ref, hub.release_ref_kind
    if kind == "branch" and ref == "main":
        raise HubError("hub.release_ref must not be 'main' when it is a branch: candidates are pushed "
                       "to main; name the release branch e.g. 'production'")
    api = _api(endpoint, token)
    call = _hub_call(hub, f"promote to {kind} {ref!r}", commit_sha, token, retry)
    message = f"quantize-serve: promoted {commit_sha}" + (f" (run {run_id})" if run_id else "")

    def attempt(_: int) -> str:
        api.model_info(hub.repo_id, revision=commit_sha)  # 404 here leaves the old ref in place
        current = _ref_target(api, hub.repo_id, ref, kind)
        if current != commit_sha:
            if kind == "tag":
                if current is not None:
                    api.delete_tag(hub.repo_id, tag=ref)
                api.create_tag(hub.repo_id, tag=ref, revision=commit_sha, tag_message=message)
            else:
                if current is not None:
                    api.delete_branch(hub.repo_id, branch=ref)
                api.create_branch(hub.repo_id, branch=ref, revision=commit_sha)
            logger.info("%s: %s %r moved %s -> %s", hub.repo_id, kind, ref,
                        current[:12] if current else "(none)", commit_sha[:12])
        after = _ref_target(api, hub.repo_id, ref, kind)
        if after != commit_sha:
            raise HubError(f"promote on {hub.repo_id}: {kind} {ref!r} points at {after} after the move, "
                           f"not {commit_sha}; another promotion ran at the same time. Re-run.")
        return commit_sha

    return _run(call, attempt)


def rejection_tag(commit_sha: str) -> str:
    from quantize_serve.recipe import REJECTION_TAG_PREFIX

    return f"{REJECTION_TAG_PREFIX}{commit_sha[:12]}"


def record_rejection(hub: HubSection, commit_sha: str, reasons: list[str], *, token: str | None,
                     run_id: str, card_text: str | None = None, endpoint: str | None = None,
                     retry: RetryPolicy = DEFAULT_RETRY) -> str:
    """Record that ``commit_sha`` failed its gates, without touching the release ref.

    Where a release engineer sees it: a tag ``rejected-<12-char sha>`` on that exact commit (listed
    in the repo's branch/tag menu and by ``list_repo_refs``) whose message lists the reasons and
    the run id, and, when ``card_text`` is given (a card rendered with status "rejected"), the
    model card on ``main`` - but only if ``main`` is still that commit, so a newer candidate's card
    is never overwritten. Idempotent: an existing tag is kept. Returns the tag name.
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
            update_model_card(hub, card_text, parent_commit=commit_sha, token=token, endpoint=endpoint,
                              commit_message=f"Model card: candidate {commit_sha[:12]} rejected",
                              retry=retry)
        else:
            logger.warning("%s: main moved on to %s; the rejection of %s is recorded in tag %s only",
                           hub.repo_id, head[:12], commit_sha[:12], tag)
    logger.info("%s: candidate %s rejected (%s); release ref %r untouched", hub.repo_id,
                commit_sha[:12], "; ".join(reasons), hub.release_ref)
    return tag
