"""Choosing the release format by measurement (quantization.candidates; quantize_serve/formats/choose.py).

The rules (recipe, kernel check, choice, Pareto frontier, existing checkpoints) on their own, then
the whole flow on CPU with the real engines: an INT8 W8A8 candidate llm-compressor makes
(SmoothQuant + GPTQ) and an AutoAWQ checkpoint from the Hub (made by the autoawq package:
tests/fixtures/tiny-llama-autoawq), compared, the better one validated and promoted.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from quantize_serve.capacity import planner
from quantize_serve.core.errors import RecipeError, RecipeErrors
from quantize_serve.formats import choose as formats
from quantize_serve.quantize.existing_checkpoint import (
    check_checkpoint,
    checkpoint_group_size,
    checkpoint_scheme,
)
from quantize_serve.quantize.run import build_llmcompressor_recipe
from quantize_serve.recipe.load import load_recipe
from quantize_serve.recipe.quantization import FormatRule
from quantize_serve.traffic.bench import ThroughputFigures
from tests.conftest import ROOT

RECIPE = ROOT / "recipes" / "tiny-llama-formats.yaml"


AUTOAWQ = ROOT / "tests" / "fixtures" / "tiny-llama-autoawq"


BASE = ROOT / "models" / "tiny-llama"


def recipe_with(tmp_path: Path, quantization: dict) -> Path:
    data = yaml.safe_load(RECIPE.read_text())
    data["quantization"] = quantization
    for task in data["gates"]["accuracy"]["tasks"]:
        task["task"] = str(RECIPE.parent / task["task"])
    data["model"]["id"] = str(BASE)
    data["calibration"]["dataset"] = str(RECIPE.parent / data["calibration"]["dataset"])
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def error_of(path: Path) -> str:
    with pytest.raises((RecipeError, RecipeErrors)) as info:
        load_recipe(path)
    return str(info.value)


def test_the_formats_recipe_names_every_scheme_and_an_existing_checkpoint():
    q = load_recipe(RECIPE).quantization
    made = {c.name: q.candidate(c.name) for c in q.candidates}
    assert {(m.method, m.scheme) for m in made.values() if m.method} == {
        ("awq", "W4A16_ASYM"),
        ("gptq", "W4A16"),
        ("smoothquant-gptq", "W8A8"),
        ("rtn", "FP8_DYNAMIC"),
    }
    assert made["autoawq-checkpoint"].checkpoint and made["autoawq-checkpoint"].method is None
    assert made["int8-w8a8"].kv_cache_scales and made["int8-w8a8"].ignore == ["lm_head"]  # shared fields


def test_each_method_builds_the_llmcompressor_recipe_of_its_scheme():
    q = load_recipe(RECIPE).quantization
    w8a8 = yaml.safe_load(build_llmcompressor_recipe(q.candidate("int8-w8a8")))["quant_stage"][
        "quant_modifiers"
    ]
    assert list(w8a8) == ["SmoothQuantModifier", "GPTQModifier"]
    group = w8a8["GPTQModifier"]["config_groups"]["group_0"]
    assert group["weights"]["num_bits"] == 8 and group["weights"]["strategy"] == "channel"
    assert group["input_activations"] == {
        "num_bits": 8,
        "type": "int",
        "strategy": "token",
        "symmetric": True,
        "dynamic": True,
    }
    fp8 = yaml.safe_load(build_llmcompressor_recipe(q.candidate("fp8-dynamic")))["quant_stage"][
        "quant_modifiers"
    ]
    assert list(fp8) == ["QuantizationModifier"]
    assert fp8["QuantizationModifier"]["config_groups"]["group_0"]["weights"]["type"] == "float"


@pytest.mark.parametrize(
    "quantization, field, words",
    [
        (
            {"method": "awq", "scheme": "FP8_DYNAMIC"},
            "quantization",
            "method 'awq' does not make scheme 'FP8_DYNAMIC'",
        ),
        (
            {"method": "awq", "candidates": [{"name": "a", "method": "gptq"}]},
            "quantization",
            "sets method and candidates",
        ),
        ({}, "quantization", "names no quantization"),
        (
            {"candidates": [{"name": "a", "method": "gptq"}, {"name": "a", "method": "awq"}]},
            "quantization",
            "candidate names repeat",
        ),
        (
            {"candidates": [{"name": "a", "method": "smoothquant-gptq"}]},
            "quantization",
            "candidate 'a': method 'smoothquant-gptq' does not make scheme 'W4A16'",
        ),
        (
            {"candidates": [{"name": "a", "checkpoint": "org/x", "scheme": "W8A8"}]},
            "quantization.candidates.0",
            "read from its config.json",
        ),
        (
            {"candidates": [{"name": "a", "method": "gptq"}], "choose": {"rule": "throughput"}},
            "quantization.choose",
            "set quantization.choose.max_p99_ttft_ms",
        ),
        (
            {"candidates": [{"name": "a", "method": "gptq"}], "choose": {"concurrency": 64}},
            "quantization.choose.concurrency",
            "above serve.max_num_seqs (16)",
        ),
        (
            {"method": "gptq", "choose": {"rule": "kv_capacity"}},
            "quantization",
            "choose picks among candidates",
        ),
    ],
)
def test_a_bad_candidate_list_is_refused_at_load_naming_the_field_and_the_fix(
    tmp_path, quantization, field, words
):
    message = error_of(recipe_with(tmp_path, quantization))
    assert field in message and words in message, message
    assert "Fix" in message or "fix" in message or "set " in message


@pytest.mark.parametrize(
    "config, scheme",
    [
        (
            {"quant_method": "awq", "bits": 4, "zero_point": True, "group_size": 128, "version": "gemm"},
            "W4A16_ASYM",
        ),
        ({"quant_method": "gptq", "bits": 4, "sym": True, "group_size": 128}, "W4A16"),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "g": {
                        "weights": {"num_bits": 8, "type": "float"},
                        "input_activations": {"num_bits": 8, "type": "float", "dynamic": True},
                    }
                },
            },
            "FP8_DYNAMIC",
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "g": {
                        "weights": {"num_bits": 8, "type": "int"},
                        "input_activations": {"num_bits": 8, "type": "int", "dynamic": True},
                    }
                },
            },
            "W8A8",
        ),
    ],
)
def test_an_existing_checkpoints_scheme_is_read_from_its_config(config, scheme):
    assert checkpoint_scheme(config) == scheme


def test_the_autoawq_fixture_is_an_awq_checkpoint_of_the_reference_model():
    base = json.loads((BASE / "config.json").read_text())
    assert (
        check_checkpoint(AUTOAWQ, base, source="r.yaml", field="quantization.checkpoint", value="x")
        == "W4A16_ASYM"
    )
    assert checkpoint_group_size(AUTOAWQ) == 128


def test_a_checkpoint_of_another_model_or_an_unquantized_one_is_refused(tmp_path):
    base = json.loads((BASE / "config.json").read_text())
    other = tmp_path / "other"
    shutil.copytree(AUTOAWQ, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "hidden_size": 256}))
    with pytest.raises(RecipeError) as info:
        check_checkpoint(
            other, base, source="r.yaml", field="quantization.candidates[1].checkpoint", value="org/x"
        )
    assert "not a checkpoint of the recipe's base model: hidden_size 256 != base 128" in str(info.value)
    assert "quantization.candidates[1].checkpoint" in str(info.value)
    with pytest.raises(RecipeError, match="is not a quantized checkpoint"):
        check_checkpoint(BASE, base, source="r.yaml", field="quantization.checkpoint", value="m")


@pytest.mark.parametrize(
    "scheme, platform, log, ok",
    [
        ("W4A16", "cuda-fp8", "Using MacheteLinearKernel for CompressedTensorsWNA16", True),
        ("W4A16", "cuda-fp8", "Using ExllamaLinearKernel for CompressedTensorsWNA16", False),
        (
            "FP8_DYNAMIC",
            "cuda-fp8",
            "Selected CutlassFP8ScaledMMLinearKernel for CompressedTensorsW8A8Fp8",
            True,
        ),
        (
            "FP8_DYNAMIC",
            "cuda-fp8",
            "Selected ChannelWiseTorchFP8ScaledMMLinearKernel for CompressedTensorsW8A8Fp8",
            False,
        ),
        ("FP8_DYNAMIC", "cuda", "Your GPU does not have native support for FP8 computation", False),
        ("W8A8", "cuda-fp8", "Selected CutlassInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8", True),
        ("W8A8", "cpu", "Selected CPUInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8", True),
        ("W4A16_ASYM", "cpu", "Using CPUWNA16LinearKernel for AutoAWQMarlinLinearMethod", True),
        ("W8A8", "cpu", "no kernel named", False),
        # a mixture of experts (vLLM 0.26 CUDA): the attention's linears and the experts each get their kernel
        (
            "W4A16",
            "cuda-fp8",
            "Selected MacheteLinearKernel for CompressedTensorsWNA16\n"
            "Using CompressedTensorsWNA16MarlinMoEMethod",
            True,
        ),
        (
            "W4A16",
            "cuda-fp8",
            "Selected MacheteLinearKernel for CompressedTensorsWNA16\nUsing CompressedTensorsWNA16MoEMethod",
            False,
        ),
    ],
)
def test_the_kernel_check_passes_the_expected_kernel_and_fails_a_fallback_with_its_reason(
    scheme, platform, log, ok
):
    kernels, problem = formats.kernel_problem(scheme, platform, log)
    assert (problem is None) == ok, problem
    if not ok:
        assert scheme in problem


def row(
    name: str, kv: int, tok_s: float, *, recovery: float = 1.0, ttft: float = 100.0, fail: str = ""
) -> formats.FormatRow:
    run = ThroughputFigures(
        command="",
        result_path="",
        input_len=1,
        output_len=1,
        completed=1,
        failed=0,
        num_prompts=1,
        output_throughput=tok_s,
        p99_ttft_ms=ttft,
        mean_tpot_ms=10.0,
    )
    return formats.FormatRow(
        name=name,
        method="m",
        scheme="W4A16",
        kv_cache_dtype="fp8",
        kv_cache_tokens=kv,
        runs=[run],
        recovery=recovery,
        failures=[fail] if fail else [],
    )


BENCH = formats.BenchSettings(concurrency=16, input_tokens=64, output_tokens=32, num_prompts=64, repeats=1)


def test_the_rule_picks_the_best_candidate_that_passes_every_check():
    rows = [
        row("w4", 2000, 100.0),
        row("fp8", 1500, 150.0, ttft=400.0),
        row("int8", 1600, 160.0, fail="kernel check: x"),
    ]
    by_kv = formats.choose([r.model_copy() for r in rows], FormatRule(rule="kv_capacity"), BENCH, "cpu")
    assert by_kv.winner == "w4" and "int8" not in [r.name for r in by_kv.rows if r.passed]
    slo = FormatRule(rule="throughput", max_p99_ttft_ms=300)
    by_speed = formats.choose([r.model_copy() for r in rows], slo, BENCH, "cpu")
    assert by_speed.winner == "w4"  # fp8 is faster but breaks the TTFT limit; int8 failed its kernel check
    assert any("p99 TTFT 400.0 ms is over the limit 300" in f for f in by_speed.row("fp8").failures)
    none = formats.choose([row("a", 1, 1.0, fail="accuracy: x")], FormatRule(), BENCH, "cpu")
    assert none.winner is None and "nothing is released" in none.reason


def test_the_pareto_frontier_keeps_every_candidate_no_other_beats_on_all_three():
    rows = [
        row("w4", 2000, 100.0, recovery=0.97),
        row("fp8", 1500, 150.0, recovery=0.99),
        row("w4-worse", 1900, 90.0, recovery=0.96),
        row("int8", 1500, 140.0, recovery=0.99),
    ]
    assert formats.pareto_front(rows) == ["w4", "fp8"]


def test_the_planner_sizes_8_bit_weights_per_channel():
    shape = planner.ModelShape.from_config(json.loads((BASE / "config.json").read_text()))
    w8 = planner.weight_bytes(shape, scheme="W8A8", group_size=128, ignore=("lm_head",))
    w4 = planner.weight_bytes(shape, scheme="W4A16", group_size=128, ignore=("lm_head",))
    bf16 = planner.weight_bytes(shape, scheme="bf16")
    assert w4 < w8 < bf16
    assert planner.weight_bytes(shape, scheme="FP8_DYNAMIC", group_size=128, ignore=("lm_head",)) == w8


def test_a_local_checkpoint_candidate_of_another_model_is_refused_before_anything_runs(tmp_path):
    from quantize_serve.validate.preflight import validate_recipe

    other = tmp_path / "other-awq"
    shutil.copytree(AUTOAWQ, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 32}))
    path = recipe_with(
        tmp_path, {"candidates": [{"name": "a", "method": "gptq"}, {"name": "b", "checkpoint": str(other)}]}
    )
    with pytest.raises(RecipeError) as info:
        validate_recipe(path)
    message = str(info.value)
    assert "quantization.candidates[1].checkpoint" in message and "num_hidden_layers 32 != base 4" in message
    missing = recipe_with(tmp_path, {"candidates": [{"name": "b", "checkpoint": "./nowhere"}]})
    with pytest.raises(RecipeError, match="no such folder"):
        validate_recipe(missing)


def test_a_tie_on_the_rules_measure_goes_to_the_higher_recovery():
    rows = [row("gptq", 2000, 300.0, recovery=0.979), row("awq", 2000, 100.0, recovery=0.990)]
    choice = formats.choose(rows, FormatRule(rule="kv_capacity"), BENCH, "cpu")
    assert choice.winner == "awq" and "tied with gptq; the higher recovery decided" in choice.reason


def test_quantize_serve_validate_checks_local_checkpoint_candidates():
    from quantize_serve.validate.preflight import check_recipe

    assert any("existing checkpoints" in c for c in check_recipe(RECIPE).checked)
