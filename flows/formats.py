"""The format choice (``quantization.candidates``): a subflow of the quantize-serve flow. Composition only.

check existing checkpoints -> quantize each candidate -> base boot (reference row, base accuracy)
-> per candidate: 16-bit KV boot (capacity) and production boot (capacity, kernel check,
`vllm bench serve`, accuracy gate, stress gate) -> the recipe's rule picks the release among the
candidates that pass every check (quantize_serve/formats/choose.py).

The flow then runs the chosen candidate through the whole pipeline (its checkpoint is reused, not
made again; the soak test, when the recipe sets one, runs there, for the chosen one only). No
candidate passing stops the run here, before anything is pushed.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from quantize_serve.core.errors import GateError
from quantize_serve.formats.choose import BenchSettings, FormatChoice
from quantize_serve.serving.boot import Boot
from quantize_serve.validate.preflight import BaseModelRef, ValidatedRecipe
from tasks.accuracy import run_accuracy
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
from tasks.serve import gpu_slot, measure_capacity, served
from tasks.stress import run_stress_test

FORMATS_DIR = "formats"


@flow(name="choose-format", log_prints=True)
def choose_format(validated: ValidatedRecipe, base: BaseModelRef, run_dir: Path,
                  base_tp: int | None = None) -> FormatChoice:
    """``base_tp``: the base model's TP when it needs more GPUs than the recipe's (plan-base-boot)."""
    r = validated.recipe
    settings = BenchSettings.from_recipe(r)
    schemes = check_candidate_checkpoints(validated, base)  # before anything heavy
    made = {}
    for c in r.quantization.candidates:
        v = with_candidate(validated, c.name, schemes.get(c.name))
        made[c.name] = (v, quantize_model(v, base))
    out = run_dir / FORMATS_DIR
    accuracy = dict(gate=r.gates.accuracy, max_length=r.serve.max_model_len, base_dir=Path(r.base_dir),
                    return_state=True)
    with gpu_slot():
        with served(validated, Boot.BASE, base.local_dir, out / "base", tensor_parallel_size=base_tp) as (server, spec):
            cap = measure_capacity(server, spec, Boot.BASE)
            rows = [measure_format(server, spec, cap, name="base", method="base", scheme="bf16", settings=settings,
                                   output_dir=out / "base", reference=True)]
            acc_base = run_accuracy(server.base_url, tokenizer_dir=base.local_dir,
                                    output_dir=out / "base" / "accuracy", **accuracy)
        for name, (v, made_by) in made.items():
            sixteen = None
            if r.serve.kv_cache_dtype != "auto":  # the same checkpoint with a 16-bit KV cache
                with served(v, Boot.QUANTIZED_16BIT_KV, made_by.checkpoint_dir, out / name) as (server, spec):
                    sixteen = measure_capacity(server, spec, Boot.QUANTIZED_16BIT_KV)
            with served(v, Boot.PRODUCTION, made_by.checkpoint_dir, out / name) as (server, spec):
                cap = measure_capacity(server, spec, Boot.PRODUCTION)
                row = measure_format(server, spec, cap, name=name, method=made_by.method, scheme=made_by.scheme,
                                     settings=settings, output_dir=out / name)
                acc = run_accuracy(server.base_url, tokenizer_dir=made_by.checkpoint_dir,
                                   output_dir=out / name / "accuracy", **accuracy)
                stress = run_stress_test(server, r.gates.stress, r.serve, tokenizer_dir=made_by.checkpoint_dir,
                                         output_dir=out / name / "stress", return_state=True)
            checks = compare_accuracy(acc_base.result(raise_on_failure=False), acc.result(raise_on_failure=False),
                                      r.gates.accuracy)
            row = with_stress(with_accuracy(row, checks), stress.result(raise_on_failure=False))
            rows.append(row.model_copy(update={"kv_cache_tokens_16bit": sixteen.kv_cache_tokens if sixteen else None}))
    choice = choose_format_task(validated, rows, settings, run_dir)
    if choice.winner is None:
        raise GateError("no release format passed every check, so nothing is pushed or released:\n"
                        + choice.markdown())
    return choice
