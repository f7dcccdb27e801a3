"""Whether the release can still happen, while the boots run beside the Hub steps it needs.

The candidate's push (any release needs it) and the release in production (the regression gate's
baseline) run beside the boots (flows/pipeline.py). The first of them to fail for good, its retries
spent (hub/client.py), makes the release impossible: :meth:`Blocked.fail` stops the run's live vLLM
boots at once (serving/server.py ``stop_servers_under``), and the flow's stages ask :meth:`Blocked.check`
as each starts and ends (flows/boots.py), so none starts after it. The run then fails with the step, the
Hub, the repo and the fix, and promotes nothing. An answer that is no failure (no release in production
yet: a first release) never blocks.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from quantize_serve.core.errors import HubError, QuantizeServeError
from quantize_serve.hub.client import scrub_tokens
from quantize_serve.recipe.model import HubSection
from quantize_serve.serving.server import stop_servers_under


def hub_endpoint() -> str:
    """The Hub this process's client reaches (HF_ENDPOINT, else huggingface.co), without any credentials
    a URL may carry."""
    from huggingface_hub import constants

    parts = urlsplit(constants.ENDPOINT)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def blocked_message(step: str, error: BaseException, *, endpoint: str, repo_id: str | None) -> str:
    """The run's last words when ``step`` failed for good: the step, its error (what failed and the fix),
    the Hub and the repo, and what the run did about it."""
    where = f"the Hub at {endpoint}" + (f", repo {repo_id}" if repo_id else "")
    said = str(error).strip() or type(error).__name__
    return (
        f"{step} failed for good ({where}): {said.rstrip('.')}.\n"
        "The release needs that Hub step, so the run stopped its boots and gates there and promoted "
        f"nothing. Fix: as said above (HF_ENDPOINT names the Hub this host reaches), then re-run."
    )


class Blocked:
    """Set once, by the first Hub step the release needs that failed for good: the live boots logging under
    ``run_dir`` are stopped then, and :meth:`check` raises from then on. ``hub``: the recipe's (its repo
    is named, its token never)."""

    def __init__(self, run_dir: Path, hub: HubSection | None) -> None:
        self.run_dir, self.hub = run_dir, hub
        self._lock = threading.Lock()
        self._error: QuantizeServeError | None = None

    @property
    def error(self) -> QuantizeServeError | None:
        """What the run fails with once blocked (a Hub error keeps its class: an auth error stays one)."""
        return self._error

    def fail(self, step: str, error: BaseException) -> bool:
        """``step`` failed for good with ``error``; the first failure counts. Stops the run's live boots
        (from any thread). False when another step had blocked the release already."""
        repo_id, token = (self.hub.repo_id, os.environ.get(self.hub.token_env)) if self.hub else (None, None)
        message = scrub_tokens(blocked_message(step, error, endpoint=hub_endpoint(), repo_id=repo_id), token)
        try:  # a Hub error keeps its class (an auth error stays a user's to fix: the CLI exits 2)
            blocked = (type(error) if isinstance(error, HubError) else HubError)(message)
        except TypeError:
            blocked = HubError(message)
        with self._lock:
            if self._error is not None:
                return False
            self._error = blocked
        stop_servers_under(self.run_dir)
        return True

    def check(self) -> None:
        """Raise the step's failure once the release can no longer happen."""
        if self._error is not None:
            raise self._error

    @contextmanager
    def stops(self) -> Iterator[None]:
        """What a boot stopped by :meth:`fail` raises (its process gone mid-boot, a gate without its server)
        becomes the Hub step's failure."""
        try:
            yield
        except Exception:
            self.check()
            raise
