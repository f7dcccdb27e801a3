"""Report tasks: the run folder, the sign-off pause and the UI artifacts (the stages: tasks/progress.py)."""

from __future__ import annotations

import time
from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from prefect.logging import get_run_logger
from prefect.runtime import flow_run
from prefect.utilities.urls import url_for

from quantize_serve.core import progress
from quantize_serve.core.settings import get_settings
from quantize_serve.report.run_report import RunReport, render_markdown, stress_summary, write_report
from quantize_serve.validate.preflight import ValidatedRecipe


def run_id() -> str:
    return flow_run.get_id() or f"local-{int(time.time())}"


def run_url() -> str | None:
    """The run's page in the Prefect UI (PREFECT_UI_URL + /runs/flow-run/<id>, Prefect's own
    format); None outside a flow run or without a UI URL (an ephemeral API has none)."""
    run = flow_run.get_id()
    return url_for("flow-run", obj_id=run) if run else None


def run_folder(validated: ValidatedRecipe) -> Path:
    """runs/<recipe>-<time>-<run>: the report, the boots' logs and (``quantize-serve run``) run.log."""
    folder = (
        get_settings().runs_dir / f"{validated.recipe.name}-{time.strftime('%Y%m%d-%H%M%S')}-{run_id()[:8]}"
    )
    folder.mkdir(parents=True, exist_ok=True)
    progress.publish(progress.RunFolder(str(folder)))
    return folder


class Approval(RunInput):
    """The sign-off form a release engineer fills in when the recipe says approval: manual."""

    approve: bool = False
    reviewer: str = ""
    note: str = ""


def request_approval(validated: ValidatedRecipe, report: RunReport) -> tuple[bool, str | None]:
    """Automatic approval, or pause the run until a person approves or rejects it in the UI."""
    if validated.recipe.approval == "auto":
        return True, None
    if not report.decision.passed:
        return False, None  # nothing to sign off: the gates already rejected it
    create_markdown_artifact(
        key=f"{validated.recipe.name}-pending-approval",
        markdown=render_markdown(report, embed_images=True),
        description="Report awaiting sign-off",
    )
    answer = pause_flow_run(
        wait_for_input=Approval.with_initial_data(
            description="Gates passed. Read the report artifact, then approve to promote, or reject."
        ),
        timeout=7 * 24 * 3600,
    )
    report.approval_note = answer.note.strip()  # the release step records it (a rejection's reason)
    return answer.approve, answer.reviewer or "reviewer"


@task(name="write-report")
def write_report_files(report: RunReport, run_dir: Path) -> RunReport:
    """report.md, report.json and the chart before the release step (the model card and the
    sign-off read them). No artifacts yet: publish_report writes each key once, with the release.
    Adds the run's UI page and the serving vLLM version, which the card and the report show."""
    report.run_url = report.run_url or run_url()
    paths = write_report(report, run_dir)
    get_run_logger().info("report written to %s (before the release step)", paths["markdown"].parent)
    return report


@task(name="publish-report")
def publish_report(report: RunReport, run_dir: Path) -> RunReport:
    """The final report on disk and as the run's artifacts, one write per key."""
    paths = write_report(report, run_dir)
    name = report.recipe
    create_markdown_artifact(
        key=f"{name}-report",
        markdown=render_markdown(report, embed_images=True),
        description=f"quantize-serve report ({'passed' if report.decision.passed else 'failed'})",
    )
    create_table_artifact(
        key=f"{name}-decision",
        table=[c.model_dump() for c in report.decision.checks],
        description="Promotion checks",
    )
    if report.capacity:
        create_table_artifact(
            key=f"{name}-capacity",
            table=[c.model_dump() for c in report.capacity.configs],
            description=report.capacity.method,
        )
    if report.accuracy:
        labels = report.task_labels()  # lm-eval's names, not the recipe's (maybe absolute) task paths
        create_table_artifact(
            key=f"{name}-accuracy",
            table=[{**c.model_dump(), "task": labels[c.task]} for c in report.accuracy],
            description="Accuracy recovery, quantized vs base",
        )
    if report.stress:
        create_table_artifact(
            key=f"{name}-stress",
            table=[{"figure": k, "value": v} for k, v in stress_summary(report.stress).items()],
            description="Stress test on the production serving settings",
        )
    get_run_logger().info("report written to %s", paths["markdown"].parent)
    return report
