"""Prefect tasks of the format choice (quantize_serve/formats/choose.py); flows/formats.py composes them."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from quantize_serve.capacity import measure as capacity
from quantize_serve.formats import choose as formats
from quantize_serve.gates.accuracy.run import AccuracyCheck
from quantize_serve.gates.stress import StressResult
from quantize_serve.quantize import existing_checkpoint
from quantize_serve.serving import gpu
from quantize_serve.serving.server import RunningServer, ServerSpec
from quantize_serve.validate.preflight import BaseModelRef, ValidatedRecipe
from tasks.quantize import checkpoint_folder


def with_candidate(validated: ValidatedRecipe, name: str, scheme: str | None = None) -> ValidatedRecipe:
    """The run's recipe with one candidate as its quantization: how that candidate is made, served and,
    once chosen, released (``scheme``: an existing checkpoint's, read from its config.json)."""
    q = validated.recipe.quantization.candidate(name)
    if scheme:
        q = q.model_copy(update={"scheme": scheme})
    return validated.model_copy(update={"recipe": validated.recipe.model_copy(update={"quantization": q})})


@task(name="check-candidate-checkpoints")
def check_candidate_checkpoints(validated: ValidatedRecipe, base: BaseModelRef) -> dict[str, str]:
    """Each existing-checkpoint candidate's scheme, checked (format, scheme, same base model) before
    anything is quantized or booted. Hub checkpoints are downloaded here."""
    base_config = base.config
    schemes = {}
    for i, c in enumerate(validated.recipe.quantization.candidates):
        if c.checkpoint:
            folder, _ = checkpoint_folder(with_candidate(validated, c.name))
            schemes[c.name] = existing_checkpoint.check_checkpoint(
                folder,
                base_config,
                source=validated.source,
                field=f"quantization.candidates[{i}].checkpoint",
                value=c.checkpoint,
            )
    return schemes


@task(name="measure-format", cache_policy=NO_CACHE)
def measure_format(
    server: RunningServer,
    spec: ServerSpec,
    config: capacity.CapacityConfig,
    *,
    name: str,
    method: str,
    scheme: str,
    settings: formats.BenchSettings,
    output_dir: Path,
    reference: bool = False,
) -> formats.FormatRow:
    """One boot's row: its capacity, throughput runs and (for a candidate) the kernel check."""
    log_text = Path(server.log_path).read_text(errors="replace")
    if reference:
        kernels, problem = formats.boot_kernels(log_text), None
    else:
        kernels, problem = formats.kernel_problem(
            scheme, formats.platform_of(gpu.compute_capability()), log_text
        )
    failures = ["kernel check: " + problem] if problem else []
    try:
        runs = formats.run_format_bench(
            server,
            tokenizer_dir=spec.tokenizer_dir or spec.model_dir,
            settings=settings,
            output_dir=output_dir / f"bench-{name}",
        )
    except RuntimeError as exc:
        runs, failures = [], [*failures, f"throughput: {exc}"]
    row = formats.FormatRow(
        name=name,
        method=method,
        scheme=scheme,
        kv_cache_dtype=config.kv_cache_dtype,
        weights_bytes=config.weights_bytes,
        kv_cache_tokens=config.kv_cache_tokens,
        max_concurrency=config.max_concurrency,
        runs=runs,
        kernels=kernels,
        failures=failures,
        reference=reference,
    )
    get_run_logger().info(
        "%s: %s KV tokens, %s output tok/s, kernels %s%s",
        name,
        config.kv_cache_tokens,
        row.output_throughput,
        kernels,
        f"; FAILS: {failures}" if failures else "",
    )
    return row


def with_accuracy(row: formats.FormatRow, checks: list[AccuracyCheck] | BaseException) -> formats.FormatRow:
    """The row with its accuracy recovery (the lowest of the gated metrics) and the gate's verdict."""
    if isinstance(checks, BaseException):
        return row.model_copy(update={"failures": [*row.failures, f"accuracy: {checks}"]})
    recoveries = [c.recovery for c in checks if c.recovery is not None]
    failed = [f"accuracy: {c.task} {c.metric} {c.reason}" for c in checks if not c.passed]
    return row.model_copy(
        update={"recovery": min(recoveries) if recoveries else None, "failures": [*row.failures, *failed]}
    )


def with_stress(row: formats.FormatRow, result: StressResult | BaseException) -> formats.FormatRow:
    """The row with the stress gate's verdict (its failures, or why it could not run)."""
    failed = (
        [f"stress: {result}"]
        if isinstance(result, BaseException)
        else [f"stress: {f}" for f in result.failures]
    )
    return row.model_copy(update={"failures": [*row.failures, *failed]})


@task(name="choose-format")
def choose_format_task(
    validated: ValidatedRecipe, rows: list[formats.FormatRow], settings: formats.BenchSettings, run_dir: Path
) -> formats.FormatChoice:
    """Apply the recipe's rule; write formats.json/.md/.png into the run folder."""
    platform = formats.platform_of(gpu.compute_capability())
    choice = formats.choose(
        rows, validated.recipe.quantization.rule, settings, gpu.describe_devices() or f"CPU ({platform})"
    )
    formats.write_files(choice, run_dir)
    get_run_logger().info("release format:\n%s", choice.markdown())
    return choice
