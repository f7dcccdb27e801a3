"""Hub tasks: push the candidate, then promote or reject it (the work is in
``quantize_serve.release.publish``; these add the logs, the event and the link artifact); and
:class:`HubStep`, a Hub step the release needs submitted beside the boots, which stops them the moment it
fails for good (quantize_serve/release/blocked.py).

The token is resolved inside the release functions (environment or Prefect Secret block) and never
passed as a task parameter: Prefect records task inputs, and a token must not be among them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Generic, TypeVar

from prefect import task
from prefect.artifacts import create_link_artifact
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event
from prefect.futures import PrefectFuture
from prefect.logging import get_run_logger

from quantize_serve.core import progress
from quantize_serve.hub.client import PushResult
from quantize_serve.quantize.run import QuantizeResult
from quantize_serve.release import publish as rel
from quantize_serve.release.blocked import Blocked
from quantize_serve.report.run_report import Release, RunReport
from quantize_serve.serve_profile.search import ProfileSearchResult
from quantize_serve.validate.preflight import BaseModelRef, ValidatedRecipe

T = TypeVar("T")


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


class HubStep(Generic[T]):
    """A Hub step the release needs (``name``: its task's), submitted beside the boots: the moment it has
    failed for good (its retries spent inside the task), ``blocked`` stops the run's boots, the step's
    failure ends on the run's screen and in its log, and :meth:`result` raises it as ``blocked`` words it."""

    def __init__(self, name: str, future: PrefectFuture[T], blocked: Blocked) -> None:
        self.name, self.future, self.blocked = name, future, blocked
        self._logger = get_run_logger()  # the flow run's: the callback runs in the task's thread
        future.add_done_callback(self._ended)

    def _ended(self, future: PrefectFuture[T]) -> None:
        try:
            future.wait()
            state = future.state
            if not (state.is_failed() or state.is_crashed()):
                return
            error = state.result(raise_on_failure=False)
            if not isinstance(error, BaseException):
                error = RuntimeError(state.message or state.name)
            if self.blocked.fail(self.name, error):
                self._logger.error("the release can no longer happen: %s", self.blocked.error)
                figure = f"{type(error).__name__}, failed for good: the release cannot happen"
                progress.publish(progress.StageEnded(self.name.replace("-", " "), None, figure, False))
        except Exception:  # noqa: BLE001 - a callback's error would vanish in the task runner's thread
            self._logger.exception("%s: its failure could not stop the boots", self.name)

    def result(self) -> T:
        """The step's result; its failure first blocks the release (as the callback would), then is raised
        as ``blocked`` words it."""
        self.future.wait()
        self._ended(self.future)
        self.blocked.check()
        return self.future.result()
