"""The quantize-serve flow: the pipeline's table of contents. Composition only.

validate -> resolve base -> [choose the format: flows/formats.py] -> quantize -> push candidate and
find the release in production (both beside the boots: Hub I/O needs no device; either failing for good
stops the boots and gates at once and fails the run: quantize_serve/release/blocked.py) -> measure capacity ->
accuracy gate -> stress gate -> [serve production again] -> compare with production -> decide ->
promote or reject -> report (and the release history). Each boot's vLLM process starts (its imports)
while the device still works on the step before (tasks/boot.py prepare_boot; the base's, when no stored
reference can spare its boot, while the base resolves or downloads), and fills vLLM's model-info cache
for the model's architectures; the quantization worker's as the run validates (tasks/quantize.py
worker_ahead). A run that scores its base boots the base first and quantizes beside the base's accuracy
run when calibration, the model on the device, fits the memory the base's boot leaves
(calibration.beside_base, tasks/quantize.py; on a GPU host the base at a lower gpu_memory_utilization
where the recipe's leaves too little, its row derived).

vLLM boots twice, each configuration once (flows/boots.py, shared with the format choice): (a) the base
model serves capacity and the base accuracy; (b), the quantized model with 16-bit KV, is capacity only:
derived from (c)'s KV cache bytes, or booted (serve.sixteen_bit_kv_row: boot), or reused from an earlier
release of the same base and format; (c) the quantized model with the production settings (fp8 KV)
serves capacity, the serving profile, accuracy, the stress test and, when the recipe sets gates.soak,
the soak test (sustained traffic; memory growth and preemptions). Another boot, (d), serves the release
already in production again when its recorded figures were measured under other conditions (the
regression gate, gates.regression). Quantization and all boots run inside the `gpu` global concurrency
limit, so two runs never share a GPU.

Run locally (ephemeral Prefect API, no server needed):  quantize-serve run RECIPE
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow
from prefect.states import Failed, State
from prefect.utilities.annotations import quote

from flows.boots import BaseServed, reused_base, serve_base, serve_quantized, serve_release
from flows.formats import choose_format
from quantize_serve.gates.accuracy.results import scoring_notes
from quantize_serve.quantize.run import STAGE as QUANTIZE_STAGE
from quantize_serve.recipe.model import Recipe
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.compile_ahead import Until
from quantize_serve.release.blocked import Blocked
from quantize_serve.release.publish import release_reasons
from quantize_serve.report.provenance import ACCURACY_BASE_DIR, ACCURACY_QUANTIZED_DIR
from quantize_serve.report.run_report import ReleaseRejected, RunReport
from quantize_serve.validate.preflight import ValidatedRecipe
from tasks.decide import compare_accuracy, decide_release
from tasks.formats import with_candidate
from tasks.hub import HubStep, promote_or_reject, push_candidate
from tasks.quantize import beside_base, quantize_model, worker_ahead
from tasks.regression import (
    compare_with_production,
    confirm_production_throughput,
    find_production_release,
    record_results,
)
from tasks.releases import publish_release_history
from tasks.progress import Progress
from tasks.report import publish_report, request_approval, run_folder, run_id, write_report_files
from quantize_serve.core.settings import get_settings
from quantize_serve.report.steps import boots_base, boots_base_first, measures_shape, reused_sixteen_bit_kv
from tasks.base_reference import (
    find_base_reference,
    record_base_reference,
    record_sixteen_bit_kv,
    reference_stored,
)
from tasks.boot import gpu_slot, plan_base_boot, prepare_boot, prepared_boots
from tasks.capacity import derived_sixteen_bit_kv, measure_shape_capacity, summarize_capacity
from tasks.compile_ahead import compile_production_ahead, compiled_production_ahead, prepare_compile_ahead
from tasks.steps import decide_run_steps
from tasks.serve_profile import (
    published_model,
    published_serve_command,
    search_serve_profile,
    with_found_profile,
    write_serving_profile,
)
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
    """The flow's stages after validation (its return value: the report, or the failed state of a
    rejection)."""
    run_dir = run_folder(validated)
    preflight = None
    if measures_shape(validated.recipe):  # the shape's capacity, before any weights download
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
    formats = None
    if validated.recipe.quantization.candidates:  # several formats: measure each, keep the rule's choice
        progress.start("choose format")
        formats = progress.done(
            "choose format", choose_format(validated, base, run_dir, base_tp=base_boot.tensor_parallel_size)
        )
        validated = with_candidate(validated, formats.winner, formats.row(formats.winner).scheme)
    # a known base (same sha, tasks, serve settings, vLLM, hardware): its figures from the run that measured
    # them; where the base boots, whether calibration fits beside it (calibration.beside_base)
    reference_key, stored = find_base_reference(validated, base, base_boot)
    beside_room = (
        beside_base(validated, base, base_boot.tensor_parallel_size)
        if boots_base(stored, get_settings())
        else None
    )
    steps = progress.done(
        "decide steps", decide_run_steps(validated, base, base_boot, stored, beside_room, formats)
    )
    reference = stored if steps.base_reused_from else None
    sixteen_bit_kv = reused_sixteen_bit_kv(validated.recipe, reference)  # row (b) of this format, if measured
    boot_sixteen = steps.sixteen_bit_kv == "booted"
    beside, served_at = steps.quantized_beside_base, steps.served_at
    first_boot, after_base = steps.first_boot, steps.after_base

    # a Hub step the release needs that failed for good stops the boots and every stage after it
    blocked = Blocked(run_dir, validated.recipe.hub)

    def score_base(also=None) -> BaseServed:  # (a), its figures kept for the next release of this base
        served_base = serve_base(
            validated,
            base.local_dir,
            run_dir,
            accuracy_dir=run_dir / ACCURACY_BASE_DIR,
            tensor_parallel_size=base_boot.tensor_parallel_size,
            served_at=served_at if also else None,  # a lower utilization leaves calibration its memory
            also=also,
            prepare_next=after_base,
            progress=progress,
            stop=blocked.check,
        )
        record_base_reference(
            validated,
            base,
            reference_key,
            served_base.capacity,
            quote(outcome(served_base.accuracy)),
            run_id(),
            run_dir,
        )
        progress.mark("base served")
        return served_base

    # the production boot's graphs compiled beside the base's accuracy run once the checkpoint is saved
    until, ahead = Until(), steps.compile_ahead

    def quantize_beside(server, spec, capacity):  # with the base's capacity read, before its accuracy run
        progress.start(QUANTIZE_STAGE)
        quantized = quantize_model.submit(validated, base)
        if not ahead:
            return quantized, None
        # its imports while calibrating
        prepare_compile_ahead(validated, run_dir, base.config.get("architectures"))
        return quantized, compile_production_ahead.submit(
            validated, base, quote(quantized), run_dir, quote(until)
        )

    # one GPU slot from the first boot to the last (quantization on the device included): runs never share
    with prepared_boots(), gpu_slot(), blocked.stops():  # a boot's process starts while the device works on
        # the one before; a boot stopped for a failed Hub step ends the run with that step's failure
        # imports and inspection while quantizing (the base first: started as the run started)
        prepare_boot(validated, run_dir, first_boot, base.config.get("architectures"))
        base_served, compiling = None, None
        if beside:
            try:
                base_served = score_base(also=quantize_beside)
            except BaseException:
                until.abandon()  # a boot compiling ahead stops at once
                raise
            until.base_scored()  # it stops once its graphs are saved
            quantized, compiling = base_served.also
        else:
            progress.start(QUANTIZE_STAGE)
        checkpoint = progress.done(
            QUANTIZE_STAGE,
            quantized.result() if beside else quantize_model(validated, base),
            mark="quantized",
        )
        # the boot compiling ahead is gone before the production boot takes the memory (None: not started)
        compiled_ahead = compiled_production_ahead(compiling)
        profile = None
        if steps.profile_search:  # the largest stable batch
            progress.start("serving profile search")
            profile = search_serve_profile(
                validated.recipe,
                checkpoint.checkpoint_dir,
                output_dir=run_dir,
                model=published_model(validated, checkpoint.checkpoint_dir),
            )
            progress.done("serving profile search", profile)
            validated = with_found_profile(validated, profile)  # replaces serve.max_num_seqs
        serving_command = (
            profile.serve_command
            if profile
            else published_serve_command(validated, checkpoint.checkpoint_dir)
        )
        # Hub I/O needs no device: the push and the production release's download run beside the boots;
        # either failing for good stops them (HubStep)
        pushed = HubStep(
            "push-candidate",
            push_candidate.submit(validated, base, checkpoint, serving_command, run_dir, profile),
            blocked,
        )
        # its recorded figures, or its files
        in_production = HubStep("find-production-release", find_production_release.submit(validated), blocked)
        if base_served is None and reference:
            base_served = reused_base(reference)
            progress.done("base reused", reference)
            progress.mark("base served")
        elif base_served is None:
            base_served = score_base()
        quantized = serve_quantized(
            validated,
            checkpoint.checkpoint_dir,
            run_dir,
            accuracy_dir=run_dir / ACCURACY_QUANTIZED_DIR,
            stress_dir=run_dir / "stress",
            soak_dir=run_dir,
            sixteen_bit_kv=boot_sixteen,
            progress=progress,  # soak.png beside report.md
            stop=blocked.check,
            base_accuracy=outcome(base_served.accuracy),
            also=lambda server, spec, cap: write_serving_profile(
                validated, base, spec, cap, checkpoint.checkpoint_dir, run_dir
            ),
        )
        if quantized.capacity_16bit_kv:
            record_sixteen_bit_kv(validated, reference_key, quantized.capacity_16bit_kv, run_id())
        results = record_results(
            validated, quote(outcome(quantized.accuracy)), quantized.capacity, outcome(quantized.stress)
        )
        # production's throughput again where the candidate's fell below its recorded figure (a slower host)
        baseline = confirm_production_throughput(validated, in_production.result(), results)
        release_served = None
        if baseline.local_dir:  # other conditions, or that throughput: served again with this run's settings
            progress.start("production served again")
            release_served = serve_release(
                validated,
                baseline.local_dir,
                run_dir / "production-release",
                accuracy_dir=run_dir / "production-release" / "accuracy",
                stress_dir=run_dir / "production-release" / "stress",
                throughput_only=baseline.recorded is not None,
                stop=blocked.check,
            )
            progress.done("production served again", release_served.capacity)
    candidate = progress.done("push candidate", pushed.result(), mark="candidate pushed")  # beside the boots
    production, gates = quantized.also, validated.recipe.gates
    sixteen = quantized.capacity_16bit_kv or (
        sixteen_bit_kv.capacity
        if sixteen_bit_kv
        else derived_sixteen_bit_kv(validated, base, quantized.capacity, checkpoint.checkpoint_dir)
    )
    capacity = summarize_capacity(
        validated, base, [base_served.capacity, sixteen, quantized.capacity], base_boot
    )
    checks = progress.done(
        "accuracy gate",
        compare_accuracy(
            quote(outcome(base_served.accuracy)), quote(outcome(quantized.accuracy)), gates.accuracy
        ),
    )
    soak = outcome(quantized.soak) if quantized.soak else None
    regression = compare_with_production(
        validated,
        baseline,
        results,
        base=record_results(validated, quote(outcome(base_served.accuracy)), base_served.capacity, None),
        served_again=record_results(
            validated,
            quote(outcome(release_served.accuracy)) if release_served.accuracy else None,
            release_served.capacity,
            outcome(release_served.stress),
        )
        if release_served
        else None,
    )
    progress.done("regression", regression)
    decision = progress.done(
        "decide",
        decide_release(
            validated,
            checks,
            outcome(quantized.stress),
            soak,
            soak_required=gates.soak is not None,
            regression=regression,
        ),
        mark="decided",
    )
    report = write_report_files(
        RunReport(
            run_id=run_id(),
            recipe=validated.recipe.name,
            recipe_source=validated.source,
            recipe_sha256=validated.recipe_sha256,
            overrides=validated.overrides,
            base=base,
            checkpoint=checkpoint,
            candidate=candidate,
            capacity=capacity,
            preflight=preflight,
            profile=profile,
            formats=formats,
            steps=steps.with_outcome("compile ahead", compiled_ahead.line() if compiled_ahead else None),
            accuracy=checks if isinstance(checks, list) else [],
            scoring=scoring_notes(
                {"base": outcome(base_served.accuracy), "candidate": outcome(quantized.accuracy)}
            ),
            results=results,
            regression=regression,
            stress=outcome(quantized.stress) if quantized.stress.is_completed() else None,
            soak=soak if quantized.soak and quantized.soak.is_completed() else None,
            decision=decision,
            serving_command=production.command,
            serving_profile=production,
        ),
        run_dir,
    )
    approved, approved_by = request_approval(validated, report)
    progress.start("release")
    report.release = progress.done(
        "release", promote_or_reject(validated, report, approved, approved_by), mark="released"
    )
    report = publish_report(report, run_dir)
    publish_release_history(validated.recipe.hub)  # the Hub's history as a table in the UI
    progress.done("report", report, mark="reported")
    if report.release.status == "rejected" or not report.decision.passed:
        # a rejected release is a failed run (red in the UI, non-zero for `deployment run --watch`)
        message = "release rejected: " + "; ".join(release_reasons(report, approved, approved_by))
        return Failed(message=message, data=ReleaseRejected(message, report))  # report_of(result) reads it
    return report


def run_local(recipe_path: str | Path) -> State:
    """Run the flow on a recipe file with a local, temporary Prefect API; the run's final state."""
    return quantize_serve(Path(recipe_path).resolve().as_posix(), return_state=True)
