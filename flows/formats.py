"""The format choice (``quantization.candidates``): a subflow of the quantize-serve flow. Composition only.

check existing checkpoints -> quantize each candidate -> base boot (reference row, base accuracy)
-> per candidate: its 16-bit KV row (derived, or booted: serve.sixteen_bit_kv_row) and production boot
(capacity, kernel check, `vllm bench serve`, accuracy gate, stress gate) -> the recipe's rule picks the
release among the candidates that pass every check (quantize_serve/formats/choose.py).

The flow then runs the chosen candidate through the whole pipeline (its checkpoint is reused, not
made again; the soak test, when the recipe sets one, runs there, for the chosen one only). No
candidate passing stops the run here, before anything is pushed.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.utilities.annotations import quote

from flows.boots import serve_base, serve_quantized
from quantize_serve.formats.choose import BenchSettings, FormatChoice, release_format
from quantize_serve.validate.preflight import BaseModelRef, ValidatedRecipe
from tasks.decide import compare_accuracy
from tasks.formats import (
    check_candidate_checkpoints,
    choose_format_task,
    measure_format,
    with_accuracy,
    with_candidate,
    with_stress,
)
from tasks.quantize import quantize_model
from tasks.boot import gpu_slot
from tasks.capacity import derived_sixteen_bit_kv

FORMATS_DIR = "formats"


@flow(name="choose-format", log_prints=True)
def choose_format(
    validated: ValidatedRecipe, base: BaseModelRef, run_dir: Path, base_tp: int | None = None
) -> FormatChoice:
    """``base_tp``: the base model's TP when it needs more GPUs than the recipe's (plan-base-boot)."""
    r = validated.recipe
    settings = BenchSettings.from_recipe(r)
    schemes = check_candidate_checkpoints(validated, base)  # before anything heavy
    made = {}
    for c in r.quantization.candidates:
        v = with_candidate(validated, c.name, schemes.get(c.name))
        made[c.name] = (v, quantize_model(v, base))
    out = run_dir / FORMATS_DIR
    # row (b) of each candidate: none with an "auto" KV cache (it is (c)), else as serve.sixteen_bit_kv_row
    sixteen_bit_kv = r.serve.sixteen_bit_kv_row if r.serve.kv_cache_dtype != "auto" else None

    def format_row(name: str, method: str, scheme: str, reference: bool = False):
        return lambda server, spec, cap: measure_format(
            server,
            spec,
            cap,
            name=name,
            method=method,
            scheme=scheme,
            settings=settings,
            output_dir=out / name,
            reference=reference,
        )

    with gpu_slot():
        base_served = serve_base(
            validated,
            base.local_dir,
            out / "base",
            accuracy_dir=out / "base" / "accuracy",
            tensor_parallel_size=base_tp,
            also=format_row("base", "base", "bf16", reference=True),
        )
        rows = [base_served.also]
        for name, (v, made_by) in made.items():
            quantized = serve_quantized(
                v,
                made_by.checkpoint_dir,
                out / name,
                accuracy_dir=out / name / "accuracy",
                stress_dir=out / name / "stress",
                sixteen_bit_kv=sixteen_bit_kv == "boot",
                also=format_row(name, made_by.method, made_by.scheme),
                base_accuracy=base_served.accuracy.result(raise_on_failure=False),
            )
            checks = compare_accuracy(
                quote(base_served.accuracy.result(raise_on_failure=False)),
                quote(quantized.accuracy.result(raise_on_failure=False)),
                r.gates.accuracy,
            )
            row = with_stress(
                with_accuracy(quantized.also, checks), quantized.stress.result(raise_on_failure=False)
            )
            sixteen = quantized.capacity_16bit_kv
            if sixteen_bit_kv == "derive":
                sixteen = derived_sixteen_bit_kv(v, base, quantized.capacity, made_by.checkpoint_dir)
            rows.append(
                row.model_copy(update={"kv_cache_tokens_16bit": sixteen.kv_cache_tokens if sixteen else None})
            )
    choice = choose_format_task(validated, rows, settings, run_dir)
    release_format(choice)  # none passing: the run stops here, with the table
    return choice
