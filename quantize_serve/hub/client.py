"""The Hub client: one translator of ``huggingface_hub`` failures, retries for transient ones, the token.

Failures from the client are translated in one place (``_run``): 401/403/404 become
``HubAuthError``/``HubNotFoundError`` with the fix, everything else ``HubError``. 5xx and 429 answers
and dropped connections are retried with bounded exponential backoff (a 429's Retry-After honoured);
other 4xx never are. The token is
scrubbed from every message and our errors are raised outside the ``except`` block, so no chained
exception (whose request carries the ``Authorization`` header) travels with them.

Downloads (the base model, existing checkpoints) are in ``hub.download``; the release (push, promote,
reject) in ``hub.publish``.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from quantize_serve.core.errors import HubAuthError, HubError, HubNotFoundError
from quantize_serve.recipe.model import HubSection

if TYPE_CHECKING:
    from huggingface_hub import HfApi

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
        return scrub_tokens(text, self.token)


def scrub_tokens(text: str, token: str | None = None) -> str:
    """``text`` without ``token``, bearer credentials or anything shaped like a Hub token."""
    if token:
        text = text.replace(token, "<token>")
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
        f" or the Prefect Secret block {call.secret_block!r}" if call.secret_block else ""
    )
    namespace = call.repo_id.split("/")[0]
    if status == 401:
        err: HubError = HubAuthError(
            f"{where} failed: the Hub rejected the token (missing or wrong): set {token_source} "
            "to a valid token (https://huggingface.co/settings/tokens) and re-run."
        )
    elif status == 403 and not call.writes:
        err = HubAuthError(
            f"{where} failed: the token may not read {call.repo_id!r} (HTTP 403: {message}). If it "
            "is a gated or restricted repo, request access on its page, then use a token of that "
            f"account in {token_source}."
        )
    elif status == 403:
        err = HubAuthError(
            f"{where} failed: the token has no write access to {namespace!r} (HTTP 403: "
            f"{message}). Put a token with the 'write' role, or a fine-grained token with write "
            f"access to {namespace!r}, in {token_source}."
        )
    elif status == 404 and code == "RevisionNotFound":
        err = HubNotFoundError(
            f"{where} failed: revision {call.revision!r} does not exist in {call.repo_id}. "
            "Use an existing branch, tag or full 40-character commit sha."
        )
    elif status == 404 and code == "EntryNotFound":
        err = HubNotFoundError(f"{where} failed: a file is missing at that revision ({message}).")
    elif status == 404:
        err = HubNotFoundError(
            f"{where} failed: the repo {call.repo_id!r} (revision {call.revision or 'main'!r}) was "
            "not found, or it is private and the token cannot see it. Check the repo id and "
            f"that {token_source} holds a token with access."
        )
    elif status in (409, 412):
        err = HubError(
            f"{where} failed: the repo changed while this run worked (HTTP {status}: {message}); "
            "another run pushed or moved a ref at the same time. Nothing was overwritten; re-run "
            "to work on top of the new state."
        )
    elif status == 429:
        err = HubError(
            f"{where} failed after {attempts} attempt(s): the Hub rate-limited these requests (HTTP 429: "
            f"{message}). Wait a few minutes and re-run; pushes are content-addressed, so a re-run "
            "ends in one complete revision and the release ref is untouched until promotion."
        )
    elif transient and "xet" in message.lower():
        err = HubError(
            f"{where} failed: {message}. The endpoint does not speak the Xet upload protocol (the "
            "local test hub speaks plain LFS only): set HF_HUB_DISABLE_XET=1 before starting."
        )
    elif transient and not call.writes:
        err = HubError(
            f"{where} failed after {attempts} attempt(s): {message or 'HTTP ' + str(status)}. "
            "The Hub or the network failed; check that the Hub (or HF_ENDPOINT) is reachable and re-run."
        )
    elif transient:
        err = HubError(
            f"{where} failed after {attempts} attempt(s): {message or 'HTTP ' + str(status)}. "
            "The Hub or the network failed; re-run: pushes are content-addressed, so a re-run "
            "ends in one complete revision and the release ref is untouched until promotion."
        )
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
                logger.warning(
                    "%s on %s: %s; retrying in %.2fs (attempt %d of %d)",
                    call.action,
                    call.repo_id,
                    call.scrub(message),
                    delay,
                    attempt + 1,
                    call.retry.attempts,
                )
            else:
                failure = _translate(call, exc, attempt)
        if failure is not None:
            raise failure
        time.sleep(delay)


def _api(endpoint: str | None, token: str | None) -> HfApi:
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint, token=token)


def _hub_call(
    hub: HubSection, action: str, revision: str | None, token: str | None, retry: RetryPolicy
) -> _Call:
    return _Call(action, hub.repo_id, revision, token, hub.token_env, hub.token_secret_block, retry)
