"""The production boot's graphs compiled ahead, beside the base's accuracy run, once the checkpoint beside it
is saved (quantize_serve/serving/compile_ahead.py): the boot that compiles, what it did, and its process
started ahead while calibration runs."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture
from prefect.logging import get_run_logger

from quantize_serve.capacity import measure as capacity
from quantize_serve.quantize.run import QuantizeResult
from quantize_serve.serving import compile_ahead, gpu
from quantize_serve.serving.server import prepare_server
from quantize_serve.serving.spec import capacity_spec
from quantize_serve.validate.preflight import BaseModelRef, ValidatedRecipe


@task(name="compile-production-ahead", cache_policy=NO_CACHE)
def compile_production_ahead(
    validated: ValidatedRecipe,
    base: BaseModelRef,
    quantized: PrefectFuture[QuantizeResult],
    run_dir: Path,
    until: compile_ahead.Until,
) -> compile_ahead.CompiledAhead:
    """Once ``quantized`` (the quantization beside the base's accuracy run) has saved the checkpoint: the
    production settings booted beside the base in the least memory they fit in, until ``until`` says enough
    (serving/compile_ahead.py), so the production boot finds its graphs compiled."""
    logger, r = get_run_logger(), validated.recipe
    checkpoint = quantized.result(raise_on_failure=False)
    utilization = None
    why = "the quantization failed" if not isinstance(checkpoint, QuantizeResult) else until.ended
    if not why:
        usable = gpu.usable_memory_bytes()
        utilization, why = compile_ahead.utilization_ahead(
            gpu.free_bytes(r.serve.tensor_parallel_size),
            usable,
            recipe_utilization=r.serve.gpu_memory_utilization,
            fits=partial(
                capacity.fits_at, r, base.config, capacity.Boot.PRODUCTION, device_memory_bytes=usable
            ),
            keep_free_bytes=compile_ahead.kept_for_base_bytes(base.config, r.serve.batched_tokens),
        )
    if utilization is None:
        done = compile_ahead.CompiledAhead(outcome="skipped", detail=why)
        logger.info("the production boot: %s", done.line())
        return done
    logger.info("compile ahead: %s", why)
    spec = capacity_spec(
        r,
        capacity.Boot.PRODUCTION,
        Path(checkpoint.checkpoint_dir),
        gpu_memory_utilization=utilization,
        as_published=True,
    )
    log_path = compile_ahead.compile_log(run_dir, capacity.boot_label(r, capacity.Boot.PRODUCTION))
    return compile_ahead.compile_ahead(spec, log_path, until, log=logger.info)


def compiled_production_ahead(
    future: PrefectFuture[compile_ahead.CompiledAhead] | None,
) -> compile_ahead.CompiledAhead | None:
    """What :func:`compile_production_ahead` did, once done (None: it was not started). It never fails the
    release: an error of its own is said as a failed compile."""
    if future is None:
        return None
    done = future.result(raise_on_failure=False)
    if isinstance(done, compile_ahead.CompiledAhead):
        return done
    get_run_logger().warning("compiling the production boot's graphs ahead failed: %r", done)
    return compile_ahead.CompiledAhead(outcome="failed", detail=repr(done))


def prepare_compile_ahead(validated: ValidatedRecipe, run_dir: Path, architectures: list[str] | None) -> None:
    """The process of the boot that compiles ahead, started with its imports while calibration runs."""
    label = capacity.boot_label(validated.recipe, capacity.Boot.PRODUCTION)
    prepare_server(compile_ahead.compile_log(run_dir, label), architectures)
