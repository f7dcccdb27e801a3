"""The run's steps (quantize_serve/report/steps.py decide_steps): which boot goes first, what is reused, what
is done beside what, each with its reason: the combinations the whole-flow tests prove one run at a time."""

from __future__ import annotations

import pytest

from quantize_serve.capacity.measure import BaseBoot
from quantize_serve.core.settings import Settings
from quantize_serve.formats.choose import FormatChoice
from quantize_serve.recipe.load import load_recipe
from quantize_serve.release.card import render_model_card, report_card_inputs
from quantize_serve.report.base_reference import MeasuredRow, format_key
from quantize_serve.report.run_report import render_markdown
from quantize_serve.report.steps import (
    BASELINE_OVERRIDES,
    BesideBase,
    baseline_overrides,
    boots_base,
    boots_base_first,
    decide_steps,
    measures_shape,
)
from quantize_serve.serving.boot import Boot
from quantize_serve.validate.preflight import BaseModelRef, ValidatedRecipe
from tests.conftest import ROOT
from tests.release_fixtures import capacity_config, placeholder_reference, run_report

TINY = ROOT / "recipes" / "tiny-llama-awq.yaml"
BASE = BaseModelRef(local_dir="models/tiny-llama", sha="f" * 40)
TP1 = BaseBoot(tensor_parallel_size=1)
FITS = BesideBase(fits=True, why="calibration.beside_base is always (a CPU host: the two share its cores)")
LOWER = BesideBase(fits=True, why="1.2 GiB free beside the base: the base scored at 0.48", served_at=0.48)
NO_ROOM = BesideBase(fits=False, why="a CPU host: the two would share its cores")


def validated(overrides: dict | None = None, path=TINY) -> ValidatedRecipe:
    recipe = load_recipe(path, overrides)
    return ValidatedRecipe(
        recipe=recipe, source=str(path), recipe_sha256="0" * 64, calibration_fingerprint="1"
    )


def settings(**more) -> Settings:
    return Settings(**{"prepare_boots": True, "reuse_base_reference": True, **more})


def decide(v=None, *, reference=None, beside=FITS, gpu=False, formats=None, **more):
    return decide_steps(
        v or validated(),
        BASE,
        TP1,
        reference=reference,
        beside=beside,
        gpu=gpu,
        settings=settings(**more),
        formats=formats,
    )


def with_row_b(reference, v, run_id="run-7"):
    row = MeasuredRow(run_id=run_id, capacity=capacity_config(name=Boot.QUANTIZED_16BIT_KV))
    return reference.model_copy(update={"sixteen_bit_kv": {format_key(v.recipe): row}})


def test_a_first_release_boots_its_base_first_and_quantizes_beside_its_accuracy_run():
    steps = decide()
    assert steps.first_boot is Boot.BASE and steps.after_base == (Boot.PRODUCTION,)
    assert steps.base_reused_from is None and steps.quantized_beside_base and steps.served_at is None
    assert steps.sixteen_bit_kv == "derived"  # the tiny recipe derives row (b)
    assert steps.step("quantize").why == FITS.why
    assert steps.step("base").choice == "booted at TP 1"
    assert steps.step("base").why.startswith(f"no stored reference for {BASE.identity}")
    # the tiny recipe's production boot is eager; one that compiles does not compile ahead on a CPU host
    assert steps.step("compile ahead").why == "serve.enforce_eager: the production boot compiles nothing"
    cpu = decide(validated({"serve.enforce_eager": False})).step("compile ahead")
    assert cpu.choice == "no" and "a CPU host" in cpu.why


def test_on_a_gpu_the_base_is_served_lower_beside_calibration_and_the_production_graphs_compile_ahead():
    steps = decide(validated({"serve.enforce_eager": False}), beside=LOWER, gpu=True)
    assert steps.quantized_beside_base and steps.served_at == 0.48 and steps.compile_ahead
    assert steps.step("quantize").choice.endswith("the base served at gpu_memory_utilization 0.48")
    # compile ahead off: an eager production boot compiles nothing; the boots not prepared ahead
    assert not decide(validated({"serve.enforce_eager": True}), beside=LOWER, gpu=True).compile_ahead
    off = decide(validated({"serve.enforce_eager": False}), beside=LOWER, gpu=True, prepare_boots=False)
    assert not off.compile_ahead and off.step("compile ahead").why == "QS_PREPARE_BOOTS is false"
    assert off.step("boots prepared ahead").choice == "none"
    # nor where calibration does not fit beside the base: quantized first
    first = decide(validated({"serve.enforce_eager": False}), beside=NO_ROOM, gpu=True)
    assert not first.quantized_beside_base and not first.compile_ahead and first.served_at is None
    assert first.step("quantize").choice == "before the boots" and first.step("quantize").why == NO_ROOM.why


def test_a_re_release_reuses_the_stored_reference_and_boots_the_checkpoint_first():
    reference = placeholder_reference("k1", "run-1")
    steps = decide(reference=reference, beside=None)
    assert steps.base_reused_from == "run-1" and steps.step("base").choice == "reused from run run-1"
    assert steps.first_boot is Boot.PRODUCTION and not steps.quantized_beside_base and not steps.compile_ahead
    assert steps.step("quantize").why == "the base is reused: no boot of it to quantize beside"
    assert not boots_base(reference, settings()) and boots_base(None, settings())
    # reuse off: the stored reference is not taken, the base boots (and its room beside is measured)
    off = decide(reference=reference, reuse_base_reference=False)
    assert off.base_reused_from is None and off.first_boot is Boot.BASE
    assert off.step("base").why == "QS_REUSE_BASE_REFERENCE is false" and boots_base(
        reference, settings(reuse_base_reference=False)
    )


def test_row_b_is_reused_from_an_earlier_release_of_this_format_else_booted_or_derived():
    v = validated({"serve.sixteen_bit_kv_row": "boot"})
    booted = decide(v)
    assert booted.sixteen_bit_kv == "booted" and booted.first_boot is Boot.BASE
    assert booted.after_base == (Boot.QUANTIZED_16BIT_KV, Boot.PRODUCTION)
    # a re-release that boots (b) boots it first
    again = decide(v, reference=placeholder_reference(), beside=None)
    assert again.sixteen_bit_kv == "booted" and again.first_boot is Boot.QUANTIZED_16BIT_KV
    # a re-release of the same format reuses (b): the production boot first, nothing booted with 16-bit KV
    reused = decide(v, reference=with_row_b(placeholder_reference(), v), beside=None)
    assert reused.sixteen_bit_kv == "reused" and reused.sixteen_bit_kv_reused_from == "run-7"
    assert reused.first_boot is Boot.PRODUCTION and reused.after_base == (Boot.PRODUCTION,)
    # a row of the format is not taken where the base itself boots (reuse off)
    assert decide(
        v, reference=with_row_b(placeholder_reference(), v), reuse_base_reference=False
    ).sixteen_bit_kv == ("booted")
    # a run that searches its serve settings has no format key: its (b) is never reused
    searched = validated({"serve.search": {"min_num_seqs": 4, "max_num_seqs": 16}})
    steps = decide(searched, reference=with_row_b(placeholder_reference(), v), beside=None)
    assert steps.profile_search and steps.sixteen_bit_kv == "derived"
    assert not decide(v).profile_search and decide(v).step("serving profile search").choice == "no"


def test_the_format_step_names_the_rules_choice_among_the_candidates():
    v = validated(path=ROOT / "recipes" / "tiny-llama-formats.yaml")
    rows = [
        type("Row", (), {"name": n, "reference": n == "base"})() for n in ("base", "awq-w4a16", "int8-w8a8")
    ]
    choice = FormatChoice.model_construct(winner="int8-w8a8", reason="the most KV tokens", rows=rows)
    steps = decide(v, formats=choice)
    assert steps.release_format == "int8-w8a8"
    assert (
        steps.step("format").why
        == "quantization.candidates: awq-w4a16, int8-w8a8, each measured; the most KV tokens"
    )
    plain = decide().step("format")
    assert (plain.choice, plain.why) == ("awq W4A16_ASYM", "the recipe's quantization")
    made = decide(validated({"quantization.checkpoint": "ckpt", "quantization.method": None})).step("format")
    assert (made.choice, made.why) == (
        "an existing checkpoint, not quantized here",
        "quantization.checkpoint",
    )


def test_the_preflight_and_the_base_first_are_known_before_the_base_resolves():
    assert not measures_shape(validated().recipe)
    assert measures_shape(validated({"serve.preflight": "measure"}).recipe)
    assert decide(validated({"serve.preflight": "measure"})).preflight
    assert boots_base_first(settings(), stored=False) and not boots_base_first(settings(), stored=True)
    assert boots_base_first(settings(reuse_base_reference=False), stored=True)


def test_the_baseline_is_one_setting_that_turns_every_speed_up_off(monkeypatch):
    from quantize_serve.core import settings as settings_module
    from quantize_serve.serving.server import serving_env

    base = settings(steps="baseline")
    assert not (base.prepare_boots or base.reuse_base_reference or base.quantize_on_device)
    assert baseline_overrides(base) == BASELINE_OVERRIDES and baseline_overrides(settings()) == {}
    v = validated(BASELINE_OVERRIDES)
    steps = decide_steps(
        v, BASE, TP1, reference=placeholder_reference(), beside=NO_ROOM, gpu=True, settings=base
    )
    assert steps.baseline and steps.base_reused_from is None and not steps.compile_ahead
    assert steps.step("base").why == "QS_REUSE_BASE_REFERENCE is false (QS_STEPS=baseline)"
    assert steps.step("boots prepared ahead").why == "QS_PREPARE_BOOTS is false (QS_STEPS=baseline)"
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    monkeypatch.setattr(settings_module, "get_settings", lambda: base)
    monkeypatch.setattr("quantize_serve.serving.server.get_settings", lambda: base)
    assert serving_env()["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"  # as `vllm serve` starts its workers


@pytest.mark.parametrize("beside", [FITS, None])
def test_the_report_shows_the_steps_and_the_lines_they_replace(beside):
    reference = None if beside else placeholder_reference("k1", "run-1")
    steps = decide(reference=reference, beside=beside).with_outcome("compile ahead", "its graphs compiled")
    markdown = render_markdown(run_report(repo_id="org/m", candidate_sha="a" * 40, run_id="r1", steps=steps))
    assert "## Steps (each choice and why, decided before the base or the checkpoint boots)" in markdown
    assert f"- {steps.step('base').line()}" in markdown
    assert "- the production boot: its graphs compiled" in markdown
    assert (f"; beside the base's accuracy run ({FITS.why})" in markdown) == bool(beside)
    assert ("reused from run `run-1`" in markdown) == (not beside)
    # the released card says the same, each choice with its reason
    report = run_report(repo_id="org/m", candidate_sha="a" * 40, run_id="r1", steps=steps)
    card = str(render_model_card(report_card_inputs(validated(), report, status="promoted")))
    assert f"## How the run made it (each choice and why)\n\n{steps.markdown()}" in card


def test_the_kv_tier_step_says_whether_the_tier_is_measured_and_when_it_ships():
    assert not decide().kv_tier and decide().step("host-memory KV tier").line() == (
        "host-memory KV tier: no (serve.kv_offload unset)"
    )
    tiered = decide(validated({"serve.kv_offload": {"size_gib": 96}}), gpu=True)
    assert tiered.kv_tier
    assert tiered.step("host-memory KV tier").line() == (
        "host-memory KV tier: the production boot with a 96 GiB tier (native), then one without it, on a "
        "prefix-reuse workload (serve.kv_offload: shipped only where it helps (ship: if_it_helps))"
    )
    always = decide(validated({"serve.kv_offload": {"host_memory_share": 0.5, "ship": "always"}}), gpu=True)
    assert always.step("host-memory KV tier").line() == (
        "host-memory KV tier: the production boot with a 50%-of-host-memory tier (native), then one without "
        "it, on a prefix-reuse workload (serve.kv_offload: shipped whatever it shows (ship: always))"
    )
