"""The regression gate's baseline: the release the release ref serves now, found on the Hub.

Its figures recorded with it (``release-results.json``) are used as they are when they were measured
under this run's conditions (gates/regression.py ``condition_differences``); otherwise its commit is
downloaded, for the flow to serve it again with this run's settings (flows/boots.py ``serve_release``);
so it is when the candidate's throughput falls below production's recorded one (:func:`to_measure_again`).
With no gated release at the ref, the gate is off, and ``off`` says why.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from quantize_serve.core.errors import HubNotFoundError
from quantize_serve.gates.regression import MeasurementConditions, ReleaseResults, condition_differences
from quantize_serve.hub.client import resolve_token
from quantize_serve.hub.download import download_model
from quantize_serve.recipe.model import Recipe
from quantize_serve.release.history import current_release, release_history


class ProductionBaseline(BaseModel):
    off: str = Field(default="", description="why there is nothing to compare with")
    release_ref: str | None = None
    commit: str | None = None
    recorded: ReleaseResults | None = Field(
        default=None, description="its recorded figures, comparable as they are"
    )
    differences: list[str] = Field(
        default_factory=list, description="why it must be served again (all of it, or its throughput)"
    )
    local_dir: str | None = Field(default=None, description="its files, downloaded to serve it again")


def find_baseline(recipe: Recipe, conditions: MeasurementConditions) -> ProductionBaseline:
    """The release in production and how to compare with it (see the module docstring)."""
    gate, hub = recipe.gates.regression, recipe.hub
    if not gate.enabled:
        return ProductionBaseline(
            off="gates.regression.enabled is false: the candidate is compared with its base only"
        )
    if hub is None:
        return ProductionBaseline(off="the recipe has no hub section, so no release is in production")
    ref = f"{hub.release_ref_kind} {hub.release_ref!r}"
    try:
        history = release_history(hub, token=resolve_token(hub))
    except HubNotFoundError:  # the flow pushes its candidate first, so only outside a run
        return ProductionBaseline(
            off=f"no release to compare with: {hub.repo_id} does not exist yet (a first release)",
            release_ref=hub.release_ref,
        )
    entry = current_release(history)
    if entry is None:
        where = (
            f"points at {history.current[:12]}, which is no gated commit of {hub.repo_id}"
            if history.current
            else f"does not exist in {hub.repo_id} yet"
        )
        return ProductionBaseline(
            off=f"no release to compare with: the {ref} {where} (a first release)",
            release_ref=hub.release_ref,
        )
    found = ProductionBaseline(release_ref=hub.release_ref, commit=entry.commit)
    recorded = entry.record.results if entry.record else None
    if recorded is not None:
        found.differences = condition_differences(recorded.conditions, conditions)
        if not found.differences:
            found.recorded = recorded
            return found
    else:
        found.differences = ["no figures recorded with it (released before release-results.json)"]
    return to_measure_again(recipe, found)


def to_measure_again(recipe: Recipe, baseline: ProductionBaseline) -> ProductionBaseline:
    """``baseline`` (a release found, its ``differences`` saying why) with the release's files downloaded, to
    serve it again on this host."""
    if recipe.hub is None or baseline.commit is None:  # a bug if reached: the gate is off without a release
        raise ValueError("no release in production to serve again")
    local_dir = download_model(recipe, recipe.hub.repo_id, baseline.commit).local_dir
    return baseline.model_copy(update={"local_dir": str(local_dir)})
