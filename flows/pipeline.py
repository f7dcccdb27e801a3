"""The quantize-serve flow: the pipeline's table of contents (:func:`release`), one function a phase.

validate -> the base resolved and the format chosen (the shape measured with dummy weights first, when the
recipe asks; with quantization.candidates, each measured: flows/formats.py) -> the run's steps, decided once
(quantize_serve/report/steps.py: the base booted or reused, row (b), quantization beside the base, compile
ahead, the profile search, the boots prepared ahead) -> the base phase (the checkpoint made: beside the base's
accuracy run, where calibration fits beside its boot, or alone) -> the candidate phase (the serving profile
search; the candidate's push and the lookup of the release in production beside the boots; the base scored,
or reused, where not done yet; the quantized boots and their gates; production served again where its
recorded figures were measured under other conditions) -> the gates against the base and production
(capacity, accuracy, regression) -> decide -> release (promote or reject) -> report (and the release
history). A Hub step the release needs that fails for good stops the boots and gates at once and fails the
run (quantize_serve/release/blocked.py). Each boot's vLLM process starts (its imports) while the device still
works on the step before (tasks/boot.py prepare_boot); the quantization worker's as the run validates
(tasks/quantize.py worker_ahead).

vLLM boots each configuration once (flows/boots.py, shared with the format choice): (a) the base model
serves capacity and the base accuracy; (b), the quantized model with 16-bit KV, is capacity only: derived
from (c)'s KV cache bytes, or booted (serve.sixteen_bit_kv_row: boot), or reused from an earlier release of
the same base and format; (c) the quantized model with the production settings (fp8 KV) serves capacity, the
serving profile, accuracy, the stress test and, when the recipe sets gates.soak, the soak test. Another boot,
(d), serves the release already in production again (the regression gate, gates.regression). Quantization and
all boots run inside the `gpu` global concurrency limit, so two runs never share a GPU.

Three names for the run's recipe: ``validated`` (the recipe file with the run's overrides), ``chosen`` (with
the format the format choice picked; the validated recipe where the recipe has no candidates), ``profiled``
(with the serve settings the profile search found; the chosen recipe where no search runs).

Run locally (ephemeral Prefect API, no server needed):  quantize-serve run RECIPE
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.states import Failed, State
from prefect.utilities.annotations import quote

from flows.boots import (
    BaseServed,
    QuantizedServed,
    ReleaseServed,
    reused_base,
    serve_base,
    serve_quantized,
    serve_release,
)
from flows.formats import choose_format
from quantize_serve.capacity.measure import BaseBoot, CapacityReport
from quantize_serve.capacity.shape import ShapeCapacity
from quantize_serve.core.settings import get_settings
from quantize_serve.formats.choose import FormatChoice
from quantize_serve.gates.accuracy.results import scoring_notes
from quantize_serve.gates.decision import Decision
from quantize_serve.gates.regression import RegressionResult, ReleaseResults
from quantize_serve.hub.client import PushResult
from quantize_serve.quantize.run import STAGE as QUANTIZE_STAGE
from quantize_serve.quantize.run import QuantizeResult
from quantize_serve.recipe.model import Recipe
from quantize_serve.release.baseline import ProductionBaseline
from quantize_serve.release.blocked import Blocked
from quantize_serve.release.publish import release_reasons
from quantize_serve.report.base_reference import BaseReference, MeasuredRow
from quantize_serve.report.provenance import ACCURACY_BASE_DIR, ACCURACY_QUANTIZED_DIR
from quantize_serve.report.run_report import ReleaseRejected, RunReport
from quantize_serve.report.steps import (
    RunSteps,
    boots_base,
    boots_base_first,
    measures_shape,
    reused_sixteen_bit_kv,
)
from quantize_serve.gates.prefix_reuse import OffloadDecision
from quantize_serve.serve_profile.pinned import ServingProfile
from quantize_serve.serve_profile.search import ProfileSearchResult
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.compile_ahead import CompiledAhead, Until
from quantize_serve.validate.preflight import BaseModelRef, ValidatedRecipe
from tasks.base_reference import (
    find_base_reference,
    record_base_reference,
    record_sixteen_bit_kv,
    reference_stored,
)
from tasks.boot import gpu_slot, plan_base_boot, prepare_boot, prepared_boots
from tasks.capacity import derived_sixteen_bit_kv, measure_shape_capacity, summarize_capacity
from tasks.compile_ahead import compile_production_ahead, compiled_production_ahead, prepare_compile_ahead
from tasks.decide import compare_accuracy, decide_release
from tasks.formats import with_candidate
from tasks.hub import HubStep, promote_or_reject, push_candidate
from tasks.kv_tier import decide_kv_tier
from tasks.progress import Progress
from tasks.quantize import beside_base, quantize_model, worker_ahead
from tasks.regression import (
    compare_with_production,
    confirm_production_throughput,
    find_production_release,
    record_results,
)
from tasks.releases import publish_release_history
from tasks.report import publish_report, request_approval, run_folder, run_id, write_report_files
from tasks.serve_profile import (
    published_model,
    published_serve_command,
    search_serve_profile,
    with_found_profile,
    write_serving_profile,
)
from tasks.steps import decide_run_steps
from tasks.validate import base_architectures, resolve_base_model, validate_recipe


def outcome(state: State):
    """A gate's result, or the exception that stopped it (a failed check, never a skip). An accuracy run
    goes into a task quoted (Prefect's ``quote``): Prefect otherwise walks every field of every document
    of a task's inputs, ~0.3 s an input for the llama3 task set's 3,640 on 2 cores."""
    return state.result(raise_on_failure=False)


@flow(name="quantize-serve", log_prints=True)
def quantize_serve(recipe: Recipe | str, overrides: dict[str, Any] | None = None) -> RunReport:
    """``recipe``: a recipe file (or Recipe). ``overrides``: recipe fields to change for this run,
    by dotted key, e.g. {"gates.stress.num_requests": 64}; validated like the file, and the report
    lists them."""
    validated = validate_recipe(recipe, overrides)
    progress = Progress(validated.recipe.name)
    progress.done("validate", validated, mark="validated")
    # the quantization worker's imports while the base resolves (or downloads), and the base's boot's when
    # it boots first; none outlives the run
    with worker_ahead(validated), prepared_boots():
        return release(validated, progress)


def release(validated: ValidatedRecipe, progress: Progress) -> RunReport | State:
    """The flow's phases after validation (its return value: the report, or the failed state of a
    rejection)."""
    run_dir = run_folder(validated)
    resolved = resolve_release(validated, run_dir, progress)
    decided = decide_the_steps(resolved, progress)
    # a Hub step the release needs that failed for good stops the boots and every stage after it
    blocked = Blocked(run_dir, validated.recipe.hub)
    # one GPU slot from the first boot to the last (quantization on the device included): runs never share;
    # a boot's process starts while the device works on the one before
    with prepared_boots(), gpu_slot(), blocked.stops():
        made = base_phase(resolved, decided, run_dir, progress, blocked)
        served = candidate_phase(resolved, decided, made, run_dir, progress, blocked)
    gated = gate_phase(resolved, decided, made, served, progress)
    decision = decide_phase(served, gated, progress)
    report = write_report_files(run_report(resolved, decided, made, served, gated, decision), run_dir)
    return release_phase(served.profiled, report, run_dir, progress)


@dataclass(frozen=True)
class Resolved:
    """The base as resolved, the TP it boots at, and the recipe with the format the format choice picked."""

    chosen: ValidatedRecipe
    base: BaseModelRef
    base_boot: BaseBoot
    preflight: ShapeCapacity | None = None  # serve.preflight: measure
    formats: FormatChoice | None = None  # quantization.candidates


def resolve_release(validated: ValidatedRecipe, run_dir: Path, progress: Progress) -> Resolved:
    """The shape's capacity before any weights download (serve.preflight: measure), the base resolved (its
    boot's process started as it downloads where the base boots first) and, with candidates, the format."""
    preflight = None
    if measures_shape(validated.recipe):
        progress.start("shape capacity")
        with gpu_slot():
            preflight = progress.done("shape capacity", measure_shape_capacity(validated, run_dir))
    # the base's boot imports vLLM, then inspects its model, as it downloads
    if boots_base_first(get_settings(), reference_stored(validated)):
        prepare_boot(validated, run_dir, Boot.BASE)
        prepare_boot(validated, run_dir, Boot.BASE, base_architectures(validated))
    progress.start("resolve base")
    base = resolve_base_model(validated)
    base_boot = plan_base_boot(validated, base)  # a base too large for the recipe's GPUs: more, or stop here
    progress.done("resolve base", base, mark="base resolved")
    if not validated.recipe.quantization.candidates:
        return Resolved(chosen=validated, base=base, base_boot=base_boot, preflight=preflight)
    # several formats: measure each, keep the rule's choice
    progress.start("choose format")
    formats = progress.done(
        "choose format", choose_format(validated, base, run_dir, base_tp=base_boot.tensor_parallel_size)
    )
    chosen = with_candidate(validated, formats.winner, formats.row(formats.winner).scheme)
    return Resolved(chosen=chosen, base=base, base_boot=base_boot, preflight=preflight, formats=formats)


@dataclass(frozen=True)
class Decided:
    """The run's steps, and what they take from the store: the key of this run's base figures, the base
    reference reused (None: the base boots) and row (b) reused."""

    steps: RunSteps
    reference_key: str
    reference: BaseReference | None
    sixteen_bit_kv: MeasuredRow | None


def decide_the_steps(resolved: Resolved, progress: Progress) -> Decided:
    """What the run does and why (report/steps.py), from a known base's stored figures (same sha, tasks,
    serve settings, vLLM, hardware) and, where the base boots, the room calibration has beside it."""
    chosen, base, base_boot = resolved.chosen, resolved.base, resolved.base_boot
    reference_key, stored = find_base_reference(chosen, base, base_boot)
    beside = (
        beside_base(chosen, base, base_boot.tensor_parallel_size)
        if boots_base(stored, get_settings())
        else None
    )
    steps = progress.done(
        "decide steps", decide_run_steps(chosen, base, base_boot, stored, beside, resolved.formats)
    )
    reference = stored if steps.base_reused_from else None
    return Decided(steps, reference_key, reference, reused_sixteen_bit_kv(chosen.recipe, reference))


@dataclass(frozen=True)
class Made:
    """The base phase: the checkpoint, the base scored beside its quantization (None: scored or reused in the
    candidate phase) and what compiling the production boot's graphs ahead did (None: not started)."""

    checkpoint: QuantizeResult
    base_served: BaseServed | None = None
    compiled_ahead: CompiledAhead | None = None


def base_phase(
    resolved: Resolved, decided: Decided, run_dir: Path, progress: Progress, blocked: Blocked
) -> Made:
    """The checkpoint: quantized beside the base's accuracy run where the steps say so (the base boots first;
    the production boot's graphs compiled beside it too, where they say that), else before any boot."""
    chosen, base = resolved.chosen, resolved.base
    # imports and inspection while quantizing (the base first: started as the run started)
    prepare_boot(chosen, run_dir, decided.steps.first_boot, base.config.get("architectures"))
    if not decided.steps.quantized_beside_base:
        progress.start(QUANTIZE_STAGE)
        return Made(progress.done(QUANTIZE_STAGE, quantize_model(chosen, base), mark="quantized"))
    until = Until()  # the production boot compiling ahead stops once the base is scored, or at once
    also = partial(quantize_beside, resolved, decided, run_dir, progress, until)
    try:
        base_served = score_base(chosen, resolved, decided, run_dir, progress, blocked, also=also)
    except BaseException:
        until.abandon()  # a boot compiling ahead stops at once
        raise
    until.base_scored()  # it stops once its graphs are saved
    quantized, compiling = base_served.also
    checkpoint = progress.done(QUANTIZE_STAGE, quantized.result(), mark="quantized")
    # the boot compiling ahead is gone before the production boot takes the memory
    return Made(checkpoint, base_served, compiled_production_ahead(compiling))


def quantize_beside(
    resolved: Resolved, decided: Decided, run_dir: Path, progress: Progress, until: Until, *_boot: Any
) -> tuple[Any, Any]:
    """Run on the base's boot once its capacity is read, before its accuracy run: the quantization started
    beside it and, where the steps say so, the production boot that compiles its graphs once the checkpoint
    is saved (its process started with its imports while calibrating). Their futures."""
    chosen, base = resolved.chosen, resolved.base
    progress.start(QUANTIZE_STAGE)
    quantized = quantize_model.submit(chosen, base)
    if not decided.steps.compile_ahead:
        return quantized, None
    prepare_compile_ahead(chosen, run_dir, base.config.get("architectures"))
    return quantized, compile_production_ahead.submit(chosen, base, quote(quantized), run_dir, quote(until))


def score_base(
    recipe: ValidatedRecipe,
    resolved: Resolved,
    decided: Decided,
    run_dir: Path,
    progress: Progress,
    blocked: Blocked,
    also: Any = None,
) -> BaseServed:
    """(a) booted and scored (``also`` on its boot: the quantization beside it), its figures kept for the next
    release of this base."""
    served_base = serve_base(
        recipe,
        resolved.base.local_dir,
        run_dir,
        accuracy_dir=run_dir / ACCURACY_BASE_DIR,
        tensor_parallel_size=resolved.base_boot.tensor_parallel_size,
        served_at=decided.steps.served_at
        if also
        else None,  # a lower utilization leaves calibration its memory
        also=also,
        prepare_next=decided.steps.after_base,
        progress=progress,
        stop=blocked.check,
    )
    accuracy = quote(outcome(served_base.accuracy))
    record_base_reference(
        recipe, resolved.base, decided.reference_key, served_base.capacity, accuracy, run_id(), run_dir
    )
    progress.mark("base served")
    return served_base


@dataclass(frozen=True)
class Served:
    """The candidate phase: the recipe the profile search changed, what each boot measured, the candidate's
    push (beside the boots: its result is read after them), and the release in production."""

    profiled: ValidatedRecipe
    profile: ProfileSearchResult | None
    pushed: HubStep
    base_served: BaseServed
    quantized: QuantizedServed
    results: ReleaseResults
    baseline: ProductionBaseline
    release_served: ReleaseServed | None
    kv_tier: OffloadDecision | None = None  # serve.kv_offload: whether the serving profile carries the tier
    serving_profile: ServingProfile | None = None  # serve-profile.yaml as the release carries it


def candidate_phase(
    resolved: Resolved, decided: Decided, made: Made, run_dir: Path, progress: Progress, blocked: Blocked
) -> Served:
    """The serving profile search; the candidate pushed and the release in production found beside the boots
    (Hub I/O needs no device; either failing for good stops them: HubStep); the base reused or scored where
    the base phase did not; the quantized boots and their gates; production served again where needed."""
    base, checkpoint = resolved.base, made.checkpoint
    profiled, profile = search_profile(resolved.chosen, decided.steps, checkpoint, run_dir, progress)
    command = (
        profile.serve_command if profile else published_serve_command(profiled, checkpoint.checkpoint_dir)
    )
    pushed = HubStep(
        "push-candidate",
        push_candidate.submit(profiled, base, checkpoint, command, run_dir, profile),
        blocked,
    )
    # its recorded figures, or its files
    in_production = HubStep("find-production-release", find_production_release.submit(profiled), blocked)
    base_served = made.base_served
    if base_served is None and decided.reference:
        base_served = reused_base(decided.reference)
        progress.done("base reused", decided.reference)
        progress.mark("base served")
    elif base_served is None:
        base_served = score_base(profiled, resolved, decided, run_dir, progress, blocked)
    quantized = serve_quantized(
        profiled,
        checkpoint.checkpoint_dir,
        run_dir,
        accuracy_dir=run_dir / ACCURACY_QUANTIZED_DIR,
        stress_dir=run_dir / "stress",
        soak_dir=run_dir,
        sixteen_bit_kv=decided.steps.sixteen_bit_kv == "booted",
        progress=progress,  # soak.png beside report.md
        stop=blocked.check,
        base_accuracy=outcome(base_served.accuracy),
        also=partial(write_profile, profiled, base, checkpoint, run_dir),
    )
    if quantized.capacity_16bit_kv:
        record_sixteen_bit_kv(profiled, decided.reference_key, quantized.capacity_16bit_kv, run_id())
    results = record_results(
        profiled, quote(outcome(quantized.accuracy)), quantized.capacity, outcome(quantized.stress)
    )
    # production's throughput again where the candidate's fell below its recorded figure (a slower host)
    baseline = confirm_production_throughput(profiled, in_production.result(), results)
    release_served = serve_production_again(profiled, baseline, run_dir, progress, blocked)
    kv_tier, serving = decide_tier(profiled, base, checkpoint, run_dir, quantized)
    return Served(
        profiled, profile, pushed, base_served, quantized, results, baseline, release_served, kv_tier, serving
    )


def decide_tier(
    profiled: ValidatedRecipe,
    base: BaseModelRef,
    checkpoint: QuantizeResult,
    run_dir: Path,
    quantized: QuantizedServed,
) -> tuple[OffloadDecision | None, ServingProfile | None]:
    """serve.kv_offload: whether the serving profile keeps the host-memory tier the production boot carried,
    and the profile the release carries: where the tier is left out, serve-profile.yaml written again from
    the same boot's figures without it."""
    measured, serving = quantized.kv_tier, quantized.also
    if measured is None:
        return None, serving
    decision = decide_kv_tier(profiled, measured.plan, measured.on, measured.off)
    if not decision.ship and quantized.spec is not None:
        without = quantized.spec.model_copy(update={"kv_offload": None})
        serving = write_profile(profiled, base, checkpoint, run_dir, None, without, quantized.capacity)
    return decision, serving


def search_profile(
    chosen: ValidatedRecipe, steps: RunSteps, checkpoint: QuantizeResult, run_dir: Path, progress: Progress
) -> tuple[ValidatedRecipe, ProfileSearchResult | None]:
    """The largest stable batch (serve.search), and the recipe with it as serve.max_num_seqs (``profiled``);
    the chosen recipe as it is where no search runs."""
    if not steps.profile_search:
        return chosen, None
    progress.start("serving profile search")
    profile = search_serve_profile(
        chosen.recipe,
        checkpoint.checkpoint_dir,
        output_dir=run_dir,
        model=published_model(chosen, checkpoint.checkpoint_dir),
    )
    progress.done("serving profile search", profile)
    return with_found_profile(chosen, profile), profile


def write_profile(
    profiled: ValidatedRecipe,
    base: BaseModelRef,
    checkpoint: QuantizeResult,
    run_dir: Path,
    _server,
    spec,
    cap,
):
    """Run on the production boot once its capacity is read: serve-profile.yaml, its KV cache pinned."""
    return write_serving_profile(profiled, base, spec, cap, checkpoint.checkpoint_dir, run_dir)


def serve_production_again(
    profiled: ValidatedRecipe,
    baseline: ProductionBaseline,
    run_dir: Path,
    progress: Progress,
    blocked: Blocked,
) -> ReleaseServed | None:
    """(d) where production's recorded figures were measured under other conditions, or its throughput
    is in doubt: served again with this run's settings (None: not needed)."""
    if not baseline.local_dir:
        return None
    progress.start("production served again")
    release_served = serve_release(
        profiled,
        baseline.local_dir,
        run_dir / "production-release",
        accuracy_dir=run_dir / "production-release" / "accuracy",
        stress_dir=run_dir / "production-release" / "stress",
        throughput_only=baseline.recorded is not None,
        stop=blocked.check,
    )
    progress.done("production served again", release_served.capacity)
    return release_served


@dataclass(frozen=True)
class Gated:
    """The gates against the base and production: the pushed candidate, capacity, accuracy, soak and the
    regression against the release in production."""

    candidate: PushResult | None
    capacity: CapacityReport
    checks: Any  # the accuracy checks, or the exception that stopped them
    soak: Any
    regression: RegressionResult


def gate_phase(resolved: Resolved, decided: Decided, made: Made, served: Served, progress: Progress) -> Gated:
    """The candidate's push (done beside the boots), the capacity table (row (b) booted, reused or derived),
    the accuracy gate and the comparison with the release in production."""
    profiled, quantized, base_served = served.profiled, served.quantized, served.base_served
    candidate = progress.done("push candidate", served.pushed.result(), mark="candidate pushed")
    sixteen = quantized.capacity_16bit_kv or (
        decided.sixteen_bit_kv.capacity
        if decided.sixteen_bit_kv
        else derived_sixteen_bit_kv(
            profiled, resolved.base, quantized.capacity, made.checkpoint.checkpoint_dir
        )
    )
    capacity = summarize_capacity(
        profiled, resolved.base, [base_served.capacity, sixteen, quantized.capacity], resolved.base_boot
    )
    base_accuracy = quote(outcome(base_served.accuracy))
    checks = progress.done(
        "accuracy gate",
        compare_accuracy(base_accuracy, quote(outcome(quantized.accuracy)), profiled.recipe.gates.accuracy),
    )
    soak = outcome(quantized.soak) if quantized.soak else None
    again = served.release_served
    regression = compare_with_production(
        profiled,
        served.baseline,
        served.results,
        base=record_results(profiled, base_accuracy, base_served.capacity, None),
        served_again=record_results(
            profiled,
            quote(outcome(again.accuracy)) if again.accuracy else None,
            again.capacity,
            outcome(again.stress),
        )
        if again
        else None,
    )
    progress.done("regression", regression)
    return Gated(candidate, capacity, checks, soak, regression)


def decide_phase(served: Served, gated: Gated, progress: Progress) -> Decision:
    """Every gate's result against the recipe's rules: passed or not, and why."""
    quantized = served.quantized
    return progress.done(
        "decide",
        decide_release(
            served.profiled,
            gated.checks,
            outcome(quantized.stress),
            gated.soak,
            soak_required=served.profiled.recipe.gates.soak is not None,
            regression=gated.regression,
        ),
        mark="decided",
    )


def run_report(
    resolved: Resolved, decided: Decided, made: Made, served: Served, gated: Gated, decision: Decision
) -> RunReport:
    """The run's report as the release step, the card and the UI read it."""
    profiled, quantized, base_served = served.profiled, served.quantized, served.base_served
    production, compiled = served.serving_profile, made.compiled_ahead
    return RunReport(
        run_id=run_id(),
        recipe=profiled.recipe.name,
        recipe_source=profiled.source,
        recipe_sha256=profiled.recipe_sha256,
        overrides=profiled.overrides,
        base=resolved.base,
        checkpoint=made.checkpoint,
        candidate=gated.candidate,
        capacity=gated.capacity,
        preflight=resolved.preflight,
        profile=served.profile,
        formats=resolved.formats,
        steps=decided.steps.with_outcome("compile ahead", compiled.line() if compiled else None).with_outcome(
            "host-memory KV tier", served.kv_tier.why if served.kv_tier else None
        ),
        accuracy=gated.checks if isinstance(gated.checks, list) else [],
        scoring=scoring_notes(
            {"base": outcome(base_served.accuracy), "candidate": outcome(quantized.accuracy)}
        ),
        results=served.results,
        regression=gated.regression,
        stress=outcome(quantized.stress) if quantized.stress.is_completed() else None,
        soak=gated.soak if quantized.soak and quantized.soak.is_completed() else None,
        decision=decision,
        serving_command=production.command,
        serving_profile=production,
        kv_tier=served.kv_tier,
        kv_host_tier=quantized.kv_tier.host if quantized.kv_tier else None,
        kv_tier_sizing=profiled.host_tier_note(),
    )


def release_phase(profiled: ValidatedRecipe, report: RunReport, run_dir: Path, progress: Progress):
    """Promote or reject (after the sign-off, where the recipe asks for one), then the report published and
    the release history; a rejected release is a failed run (red in the UI, non-zero for `deployment run
    --watch`)."""
    approved, approved_by = request_approval(profiled, report)
    progress.start("release")
    report.release = progress.done(
        "release", promote_or_reject(profiled, report, approved, approved_by), mark="released"
    )
    report = publish_report(report, run_dir)
    publish_release_history(profiled.recipe.hub)  # the Hub's history as a table in the UI
    progress.done("report", report, mark="reported")
    if report.release.status == "rejected" or not report.decision.passed:
        message = "release rejected: " + "; ".join(release_reasons(report, approved, approved_by))
        return Failed(message=message, data=ReleaseRejected(message, report))  # report_of(result) reads it
    return report


def run_local(recipe_path: str | Path) -> State:
    """Run the flow on a recipe file with a local, temporary Prefect API; the run's final state."""
    return quantize_serve(Path(recipe_path).resolve().as_posix(), return_state=True)
