"""The run's steps as a task: its decisions (quantize_serve/report/steps.py decide_steps) taken on this host's
facts and this process's settings, written to the run's log and shown in the Prefect UI as an artifact."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from quantize_serve.capacity.measure import BaseBoot
from quantize_serve.core.settings import get_settings
from quantize_serve.formats.choose import FormatChoice
from quantize_serve.report.base_reference import BaseReference
from quantize_serve.report.steps import BesideBase, RunSteps, decide_steps
from quantize_serve.serving import gpu
from quantize_serve.validate.preflight import BaseModelRef, ValidatedRecipe


@task(name="decide-steps", cache_policy=NO_CACHE)
def decide_run_steps(
    validated: ValidatedRecipe,
    base: BaseModelRef,
    base_boot: BaseBoot,
    reference: BaseReference | None,
    beside: BesideBase | None,
    formats: FormatChoice | None = None,
) -> RunSteps:
    """What the run does and why (decide_steps), before the base or the checkpoint boots."""
    steps = decide_steps(
        validated,
        base,
        base_boot,
        reference=reference,
        beside=beside,
        gpu=bool(gpu.memory_info()),
        settings=get_settings(),
        formats=formats,
    )
    get_run_logger().info("the run's steps:\n%s", steps.markdown())
    create_markdown_artifact(
        key=f"{validated.recipe.name}-steps",
        markdown=f"# The run's steps\n\n{steps.markdown()}",
        description="What the run does and why, decided before the base or the checkpoint boots",
    )
    return steps
