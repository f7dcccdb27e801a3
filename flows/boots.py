"""The boots a release is measured with, written once: the pipeline and the format choice compose them.

serve_base        (a) the base model, 16-bit KV: capacity and the base accuracy; reused_base instead
                  when a previous run measured the same base under the same conditions.
serve_quantized   (b) the quantized model, 16-bit KV: capacity, when booted (serve.sixteen_bit_kv_row:
                  boot; else derived from (c)); then (c) the production boot (the recipe's KV dtype):
                  capacity, the accuracy gate, the stress gate and, when asked, the soak test; with
                  serve.kv_offload (c) carries the host-memory tier and runs the prefix-reuse workload,
                  then (c) without the tier boots to run the same requests.
serve_release     (d) the release in production (hub.release_ref), when its recorded figures were
                  measured under other conditions: the production boot's settings, capacity,
                  accuracy and the stress test's throughput, for the regression gate.

Each boot is served once and stopped before the next starts (one GPU's memory, one boot at a time);
the caller holds the `gpu` slot around them. ``also`` runs on a boot right after its capacity is read
(the format choice's kernel check and bench; the pipeline's serving profile), with the live server.
``stop`` is asked before each boot and gate starts and after each ends: it raises once the release can no
longer happen (a Hub step it needs failed for good: quantize_serve/release/blocked.py), so none starts after.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect.states import Completed, State
from prefect.utilities.annotations import quote

from quantize_serve.capacity.host_tier import HostTier
from quantize_serve.capacity.measure import CapacityConfig
from quantize_serve.gates.accuracy.run import AccuracyRun, Prepared, lm_eval_concurrency
from quantize_serve.gates.prefix_reuse import PrefixPlan
from quantize_serve.report.base_reference import BaseReference
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.server import RunningServer, ServerSpec
from quantize_serve.serving.vllm_log import read_log, v2_model_runner
from quantize_serve.validate.preflight import ValidatedRecipe
from tasks.accuracy import prepare_accuracy, run_accuracy
from tasks.progress import Progress
from tasks.boot import prepare_boot, served
from tasks.kv_tier import TierSide, measure_prefix_reuse, tier_plan
from tasks.capacity import capacity_at_recipe_utilization, measure_capacity
from tasks.soak import run_soak_test
from tasks.stress import run_stress_test

Also = Callable[[RunningServer, ServerSpec, CapacityConfig], Any]
PREFIX_REUSE_DIR = "prefix-reuse"  # serve.kv_offload's workload: both sides' runs, the boot without the tier
Stop = Callable[[], None]  # raises when the boots are to stop


@dataclass
class BaseServed:
    capacity: CapacityConfig
    accuracy: State
    also: Any = None


@dataclass
class ReleaseServed:
    capacity: CapacityConfig
    accuracy: State | None  # None: measured for its throughput only
    stress: State


@dataclass
class QuantizedServed:
    capacity_16bit_kv: CapacityConfig | None
    capacity: CapacityConfig  # the production boot's
    accuracy: State
    stress: State
    soak: State | None = None
    also: Any = None
    spec: ServerSpec | None = None  # the production boot's
    kv_tier: KVTierMeasured | None = None  # serve.kv_offload: the tier measured on and off


@dataclass
class KVTierMeasured:
    """serve.kv_offload's workload on the production boot (the tier on) and on its settings without it."""

    plan: PrefixPlan
    host: HostTier | None  # the tier by vLLM's block arithmetic (None: LMCache sizes its own)
    on: TierSide
    off: TierSide


class _Stages:
    """A boot's stages: ``progress`` is told as each starts and ends (None: no one follows them line by line,
    e.g. the format choice's: its own stage), and ``stop`` is asked at each."""

    def __init__(self, progress: Progress | None, stop: Stop | None) -> None:
        self.progress, self.stop = progress, stop

    def start(self, stage: str) -> None:
        if self.stop:
            self.stop()
        if self.progress:
            self.progress.start(stage)

    def done(self, stage: str, result: Any = None, *, mark: str | None = None) -> Any:
        if self.progress:
            self.progress.done(stage, result, mark=mark)
        if self.stop:
            self.stop()
        return result

    def run(self, stage: str, work: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``work(*args, **kwargs)`` as the stage ``stage``: started, then done with its result."""
        self.start(stage)
        return self.done(stage, work(*args, **kwargs))

    def mark(self, name: str) -> None:
        if self.progress:
            self.progress.mark(name)


def accuracy_gate(
    validated: ValidatedRecipe,
    server: RunningServer,
    *,
    tokenizer_dir: str,
    output_dir: Path,
    paired_with: AccuracyRun | BaseException | None = None,
    prepared: Future[Prepared] | None = None,
    served: CapacityConfig,
) -> State:
    """The recipe's accuracy tasks against the live server (its final state, failed or not).
    ``paired_with``: the base's run, so the candidate stops at the first look that decides (a base that
    failed gives nothing to pair with: the candidate is scored in full, and the decision fails).
    ``prepared``: :func:`accuracy_ahead`, started as the server's boot did. ``served``: the server's
    capacity as its boot measured it (its KV cache bounds lm-eval's requests in flight)."""
    r = validated.recipe
    return run_accuracy(
        server.base_url,
        r.gates.accuracy,
        tokenizer_dir=tokenizer_dir,
        max_length=r.serve.max_model_len,
        base_dir=Path(r.base_dir),
        output_dir=output_dir,
        num_concurrent=lm_eval_concurrency(r.gates.accuracy, r.serve),
        paired_with=quote(paired_with) if isinstance(paired_with, AccuracyRun) else None,  # not walked
        reuse_rows=v2_model_runner(read_log(server.log_path)),
        prepared=prepared,
        kv_cache_tokens=served.kv_cache_tokens,
        return_state=True,
    )


def accuracy_ahead(validated: ValidatedRecipe) -> Future[Prepared] | None:
    """The accuracy run's lm-eval imports and task index, started as its server's boot starts."""
    return prepare_accuracy(validated.recipe.gates.accuracy, Path(validated.recipe.base_dir))


def serve_base(
    validated: ValidatedRecipe,
    model_dir: str,
    log_dir: Path,
    *,
    accuracy_dir: Path,
    tensor_parallel_size: int | None = None,
    served_at: float | None = None,
    also: Also | None = None,
    prepare_next: tuple[Boot, ...] = (),
    progress: Progress | None = None,
    stop: Stop | None = None,
) -> BaseServed:
    """(a): ``tensor_parallel_size`` when the base needs more GPUs than the recipe's (plan-base-boot).
    ``served_at``: a gpu_memory_utilization below the recipe's (calibration beside it): the row is then
    derived at the recipe's (capacity-at-recipe-utilization).
    ``prepare_next``: the boots that follow in ``log_dir``, their processes started once capacity is read.
    ``progress`` is told as the boot and its accuracy run start and end; ``stop`` is asked then."""
    stages = _Stages(progress, stop)
    stages.start("boot base")
    ahead = accuracy_ahead(validated)
    boot = served(
        validated,
        Boot.BASE,
        model_dir,
        log_dir,
        tensor_parallel_size=tensor_parallel_size,
        gpu_memory_utilization=served_at,
        stop=stop,
    )
    with boot as (server, spec):
        measured = capacity = measure_capacity(server, spec, Boot.BASE)
        if served_at is not None:
            capacity = capacity_at_recipe_utilization(validated, measured, model_dir, served_at)
        stages.done("boot base", capacity)
        for name in prepare_next:  # their imports overlap this boot's accuracy run (nothing here is timed)
            prepare_boot(validated, log_dir, name)
        extra = also(server, spec, capacity) if also else None
        accuracy = stages.run(
            "accuracy base",
            accuracy_gate,
            validated,
            server,
            tokenizer_dir=model_dir,
            output_dir=accuracy_dir,
            prepared=ahead,
            served=measured,
        )
    return BaseServed(capacity=capacity, accuracy=accuracy, also=extra)


def reused_base(reference: BaseReference) -> BaseServed:
    """(a) not booted: a known base's figures, as the run that measured them recorded them
    (report/base_reference.py says when they are reused)."""
    return BaseServed(capacity=reference.capacity, accuracy=Completed(data=reference.accuracy))


def serve_quantized(
    validated: ValidatedRecipe,
    checkpoint_dir: str,
    log_dir: Path,
    *,
    accuracy_dir: Path,
    stress_dir: Path,
    sixteen_bit_kv: bool = True,
    soak_dir: Path | None = None,
    also: Also | None = None,
    progress: Progress | None = None,
    base_accuracy: AccuracyRun | BaseException | None = None,
    stop: Stop | None = None,
) -> QuantizedServed:
    """(b) when ``sixteen_bit_kv``, then (c). ``soak_dir``: run the soak test too (gates.soak), its
    files there. ``progress`` is told as each boot and gate starts and ends; ``stop`` is asked then.
    ``base_accuracy``: the base's run, which the accuracy gate pairs with look by look."""
    r = validated.recipe
    stages = _Stages(progress, stop)
    sixteen = None
    if sixteen_bit_kv:
        stages.start("boot quantized 16-bit KV")
        with served(validated, Boot.QUANTIZED_16BIT_KV, checkpoint_dir, log_dir, stop=stop) as (server, spec):
            sixteen = stages.done(
                "boot quantized 16-bit KV", measure_capacity(server, spec, Boot.QUANTIZED_16BIT_KV)
            )
            # (c)'s imports while (b) stops, unless started before
            prepare_boot(validated, log_dir, Boot.PRODUCTION)
        stages.mark("quantized served")
    stages.start("boot production")
    ahead = accuracy_ahead(validated)
    with served(validated, Boot.PRODUCTION, checkpoint_dir, log_dir, stop=stop) as (server, spec):
        capacity = stages.done("boot production", measure_capacity(server, spec, Boot.PRODUCTION))
        extra = also(server, spec, capacity) if also else None
        accuracy = stages.run(
            "accuracy",
            accuracy_gate,
            validated,
            server,
            tokenizer_dir=checkpoint_dir,
            output_dir=accuracy_dir,
            paired_with=base_accuracy,
            prepared=ahead,
            served=capacity,
        )
        stress = stages.run(
            "stress", stress_gate, validated, server, tokenizer_dir=checkpoint_dir, output_dir=stress_dir
        )
        soak = None
        if soak_dir is not None and r.gates.soak:  # gates.soak is optional
            soak = stages.run(
                "soak",
                run_soak_test,
                server,
                r.gates.soak,
                r.serve,
                stress=r.gates.stress,
                tokenizer_dir=checkpoint_dir,
                output_dir=soak_dir,
                return_state=True,
            )
        tier_on = None
        if r.serve.kv_offload is not None:
            plan, host = tier_plan(validated, checkpoint_dir, capacity)
            tier_on = stages.run(
                "prefix reuse, tier on",
                measure_prefix_reuse,
                validated,
                server,
                plan,
                tier=True,
                tokenizer_dir=checkpoint_dir,
                output_dir=log_dir / PREFIX_REUSE_DIR,
            )
    stages.mark("fp8 served")
    kv_tier = None
    if tier_on is not None:  # the same requests on the production settings without the tier
        off = tier_off(validated, checkpoint_dir, log_dir, plan, stages)
        kv_tier = KVTierMeasured(plan, host, tier_on, off)
    return QuantizedServed(
        capacity_16bit_kv=sixteen,
        capacity=capacity,
        accuracy=accuracy,
        stress=stress,
        soak=soak,
        also=extra,
        spec=spec,
        kv_tier=kv_tier,
    )


def tier_off(
    validated: ValidatedRecipe, checkpoint_dir: str, log_dir: Path, plan: PrefixPlan, stages: _Stages
) -> TierSide:
    """The production settings without the host-memory tier, booted to run the same prefix-reuse requests
    (its log and the runs' files under ``log_dir/PREFIX_REUSE_DIR``)."""
    folder = log_dir / PREFIX_REUSE_DIR
    stages.start("boot production without the tier")
    with served(validated, Boot.PRODUCTION, checkpoint_dir, folder, stop=stages.stop, kv_tier=False) as (
        server,
        _spec,
    ):
        stages.done("boot production without the tier")
        return stages.run(
            "prefix reuse, tier off",
            measure_prefix_reuse,
            validated,
            server,
            plan,
            tier=False,
            tokenizer_dir=checkpoint_dir,
            output_dir=folder,
        )


def stress_gate(
    validated: ValidatedRecipe, server: RunningServer, *, tokenizer_dir: str, output_dir: Path
) -> State:
    """The stress test against the live server (its final state, failed or not)."""
    r = validated.recipe
    return run_stress_test(
        server, r.gates.stress, r.serve, tokenizer_dir=tokenizer_dir, output_dir=output_dir, return_state=True
    )


def serve_release(
    validated: ValidatedRecipe,
    model_dir: str,
    log_dir: Path,
    *,
    accuracy_dir: Path,
    stress_dir: Path,
    throughput_only: bool = False,
    stop: Stop | None = None,
) -> ReleaseServed:
    """(d): the release the release ref serves, downloaded (release/baseline.py), booted with this run's
    production settings, measured as the candidate's (c) is; its logs in ``log_dir``. ``throughput_only``:
    its accuracy is the one recorded with it (its stress test measures the throughput again). ``stop`` is
    asked as each boot and gate starts and ends (the caller tells the stage as a whole)."""
    stages = _Stages(None, stop)
    ahead = None if throughput_only else accuracy_ahead(validated)
    stages.start("boot production again")
    with served(validated, Boot.PRODUCTION, model_dir, log_dir, stop=stop) as (server, spec):
        capacity = stages.done("boot production again", measure_capacity(server, spec, Boot.PRODUCTION))
        accuracy = None
        if not throughput_only:
            accuracy = stages.run(
                "accuracy of production",
                accuracy_gate,
                validated,
                server,
                tokenizer_dir=model_dir,
                output_dir=accuracy_dir,
                prepared=ahead,
                served=capacity,
            )
        stress = stages.run(
            "stress of production",
            stress_gate,
            validated,
            server,
            tokenizer_dir=model_dir,
            output_dir=stress_dir,
        )
    return ReleaseServed(capacity=capacity, accuracy=accuracy, stress=stress)
