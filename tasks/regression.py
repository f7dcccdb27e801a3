"""The regression gate as tasks: find the release in production, record a served model's figures,
compare the candidate with production (the work: quantize_serve/release/baseline.py and
quantize_serve/gates/regression.py)."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from quantize_serve.capacity.measure import CapacityConfig
from quantize_serve.gates import regression
from quantize_serve.gates.accuracy.run import AccuracyRun
from quantize_serve.gates.stress import StressResult
from quantize_serve.release.baseline import ProductionBaseline, find_baseline, to_measure_again
from quantize_serve.report.provenance import describe_hardware, serving_vllm_version
from quantize_serve.validate.preflight import ValidatedRecipe
from tasks.decide import accuracy_task_labels


def conditions_now(validated: ValidatedRecipe) -> regression.MeasurementConditions:
    return regression.measurement_conditions(
        validated.recipe, vllm_version=serving_vllm_version(), hardware=describe_hardware()
    )


@task(name="find-production-release", cache_policy=NO_CACHE)
def find_production_release(validated: ValidatedRecipe) -> ProductionBaseline:
    """The release the release ref serves now: its recorded figures, or its files to serve it again."""
    baseline = find_baseline(validated.recipe, conditions_now(validated))
    logger = get_run_logger()
    if baseline.off:
        logger.info("regression gate off: %s", baseline.off)
    elif baseline.recorded:
        logger.info("production %s: comparing with its recorded figures (same conditions)", baseline.commit)
    else:
        logger.info("production %s is served again (%s)", baseline.commit, "; ".join(baseline.differences))
    return baseline


@task(name="confirm-production-throughput", cache_policy=NO_CACHE)
def confirm_production_throughput(
    validated: ValidatedRecipe, baseline: ProductionBaseline, candidate: regression.ReleaseResults
) -> ProductionBaseline:
    """``baseline`` as it is, or, where the candidate's throughput fell below the limit against production's
    recorded figure, with production's files downloaded to measure its throughput again on this host."""
    if baseline.recorded is None:
        return baseline
    why = regression.throughput_to_confirm(baseline.recorded, candidate, validated.recipe.gates.regression)
    if why is None:
        return baseline
    get_run_logger().info("production %s: its throughput is measured again (%s)", baseline.commit, why)
    return to_measure_again(validated.recipe, baseline.model_copy(update={"differences": [why]}))


@task(name="record-results")
def record_results(
    validated: ValidatedRecipe,
    accuracy: AccuracyRun | BaseException | None,
    capacity: CapacityConfig | None,
    stress: StressResult | BaseException | None,
) -> regression.ReleaseResults:
    """A served model's figures under this run's conditions (what the release records and compares)."""
    return regression.release_results(
        conditions_now(validated),
        accuracy=accuracy,
        stress=stress,
        kv_cache_tokens=capacity.kv_cache_tokens if capacity else None,
        max_concurrency=capacity.max_concurrency if capacity else None,
    )


@task(name="compare-with-production")
def compare_with_production(
    validated: ValidatedRecipe,
    baseline: ProductionBaseline,
    candidate: regression.ReleaseResults,
    *,
    base: regression.ReleaseResults | None = None,
    served_again: regression.ReleaseResults | None = None,
) -> regression.RegressionResult:
    if baseline.off:
        return regression.regression_off(baseline.off, release_ref=baseline.release_ref)
    production = baseline.recorded or served_again
    if production is None:  # the flow serves it again whenever nothing was recorded: a bug if reached
        raise ValueError(f"production {baseline.commit} has neither recorded nor measured figures")
    source = "recorded" if baseline.recorded else "served again"
    if baseline.recorded and served_again:  # its recorded figures, its throughput measured again
        production = regression.with_throughput_of(baseline.recorded, served_again)
        source = "recorded, throughput served again"
    result = regression.compare_with_production(
        candidate,
        production,
        validated.recipe.gates.regression,
        base=base,
        release_ref=baseline.release_ref,
        production_sha=baseline.commit,
        source=source,
        differences=baseline.differences,
        task_labels=accuracy_task_labels(validated),
    )
    get_run_logger().info("against production:\n%s", result.markdown())
    return result
