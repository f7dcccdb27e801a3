"""Recipe validation: bad input fails before any model is loaded, naming file, field, value, fix."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from quantize_serve.core.errors import RecipeError, RecipeErrors
from quantize_serve.quantize.run import build_llmcompressor_recipe
from quantize_serve.recipe.load import load_recipe
from quantize_serve.validate.preflight import validate_recipe
from tests.conftest import ROOT

RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


def write_recipe(tmp_path: Path, base: str = "tiny-llama-awq.yaml", **changes) -> Path:
    """Copy a shipped recipe next to the project's files, with dotted-key changes applied."""
    data = yaml.safe_load((ROOT / "recipes" / base).read_text())
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        if value is ...:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    # same folder: relative paths hold. tmp_path's name alone is not unique across xdist workers (each
    # numbers its own from 0, and a parametrized test's cases run on both), so the worker names it too.
    path = ROOT / "recipes" / f".test-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{tmp_path.name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def recipe_file(tmp_path):
    made = []

    def make(**changes):
        made.append(write_recipe(tmp_path, **changes))
        return made[-1]

    yield make
    for p in made:
        p.unlink(missing_ok=True)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_shipped_recipes_validate(path):
    recipe = load_recipe(path)
    assert recipe.name == path.stem
    assert recipe.gates.accuracy.tasks, "every shipped recipe names accuracy tasks"
    build_llmcompressor_recipe(recipe.quantization)


@pytest.mark.parametrize("path", [p for p in RECIPES if "tiny" in p.name], ids=lambda p: p.name)
def test_tiny_recipes_validate_against_their_files(path):
    validated = validate_recipe(path)
    assert len(validated.calibration_fingerprint) == 64


def expect_error(path, field) -> RecipeError:
    with pytest.raises((RecipeError, RecipeErrors)) as info:
        validate_recipe(path)
    err = info.value
    errors = err.errors if isinstance(err, RecipeErrors) else [err]
    match = [e for e in errors if e.field == field]
    assert match, f"no error for {field}: {err}"
    text = str(match[0])
    assert str(path) in text and field in text and "Fix:" in text
    return match[0]


def test_unknown_key(recipe_file):
    err = expect_error(recipe_file(quantization__bits=4), "quantization.bits")
    assert "unknown key" in str(err) and "group_size" in str(err)  # the allowed keys are listed


def test_unknown_method(recipe_file):
    err = expect_error(recipe_file(quantization__method="smoothquant"), "quantization.method")
    assert "'smoothquant'" in str(err) and "'awq'" in str(err) and "'gptq'" in str(err)


def test_unknown_scheme(recipe_file):
    err = expect_error(recipe_file(quantization__scheme="W3A16"), "quantization.scheme")
    assert "'W4A16_ASYM'" in str(err)


def test_missing_model_path(recipe_file):
    err = expect_error(recipe_file(model__id="../models/no-such-model"), "model.id")
    assert "no-such-model" in str(err) and "config.json" in str(err)


def test_calibration_field_missing_lists_fields(recipe_file):
    err = expect_error(recipe_file(calibration__text_field="content"), "calibration.text_field")
    assert "'content'" in str(err) and "text" in str(err).split("it has:")[1]


def test_too_few_rows_says_both_numbers(recipe_file):
    rows = sum(1 for _ in (ROOT / "data/calibration/tiny_calibration.jsonl").open())
    err = expect_error(recipe_file(calibration__num_samples=rows + 1), "calibration.num_samples")
    assert str(rows + 1) in str(err) and f"only {rows} rows" in str(err)


@pytest.mark.parametrize("field", ["num_samples", "max_seq_len"])
@pytest.mark.parametrize("value", [0, -3])
def test_non_positive_sizes(recipe_file, field, value):
    err = expect_error(recipe_file(**{f"calibration__{field}": value}), f"calibration.{field}")
    assert str(value) in str(err)


def test_group_size_must_divide_model_dims(recipe_file):
    err = expect_error(recipe_file(quantization__group_size=96), "quantization.group_size")
    assert "hidden_size=128" in str(err) and "32" in str(err)


def test_max_model_len_beyond_model(recipe_file):
    config = json.loads((ROOT / "models/tiny-llama/config.json").read_text())
    err = expect_error(recipe_file(serve__max_model_len=4096), "serve.max_model_len")
    assert "4096" in str(err) and str(config["max_position_embeddings"]) in str(err)


def test_token_never_in_recipe(recipe_file):
    with pytest.raises(RecipeErrors) as info:
        validate_recipe(recipe_file(hub__token="hf_secret_value_123"))
    assert "token_env" in str(info.value)


def test_reserved_vllm_flag_in_extra_args(recipe_file):
    err = expect_error(recipe_file(serve__extra_args=["--max-model-len=99"]), "serve.extra_args")
    assert "serve.max_model_len" in str(err)


@pytest.mark.parametrize("args", [["--revision", "v1"], ["--seed=7", "--revision=abc123"]])
def test_a_pinned_revision_in_extra_args_is_refused(recipe_file, args):
    """The published profile names hub.release_ref as the revision (what promotion moves): a revision of the
    recipe's own would make production serve a commit the gates never judged."""
    err = expect_error(recipe_file(serve__extra_args=args), "serve.extra_args")
    assert "--revision" in str(err.value) and "hub.release_ref" in err.fix and "remove --revision" in err.fix


def test_llmcompressor_recipe_states_every_number():
    recipe = load_recipe(ROOT / "recipes/tiny-llama-awq.yaml")
    built = yaml.safe_load(build_llmcompressor_recipe(recipe.quantization))
    mods = built["quant_stage"]["quant_modifiers"]
    assert set(mods) == {"AWQModifier", "QuantizationModifier"}
    weights = mods["QuantizationModifier"]["config_groups"]["group_0"]["weights"]
    assert weights == {
        "num_bits": 4,
        "type": "int",
        "strategy": "group",
        "group_size": 128,
        "symmetric": False,
        "dynamic": False,
    }
    assert mods["QuantizationModifier"]["kv_cache_scheme"]["type"] == "float"
    gptq = load_recipe(ROOT / "recipes/tiny-llama-gptq.yaml")
    mods = yaml.safe_load(build_llmcompressor_recipe(gptq.quantization))["quant_stage"]["quant_modifiers"]
    assert list(mods) == ["GPTQModifier"]
    assert mods["GPTQModifier"]["config_groups"]["group_0"]["weights"]["symmetric"] is True


def test_speed_options_default_to_the_measured_choice():
    """benchmarks/results/release-time/quantize_speed.json: AWQ with a 5-point grid and one pass without the
    second
    forward per layer; GPTQ keeps its error propagation; methods not measured and raw llm-compressor recipes
    keep llm-compressor's defaults; a recipe that sets an option gets it."""
    from quantize_serve.quantize.run import calibration_pipeline

    def resolved(name: str, overrides: dict | None = None) -> tuple:
        p = calibration_pipeline(load_recipe(ROOT / "recipes" / name, overrides))
        return p["pipeline"], p["propagate_error"], p["sequential_targets_per_subgraph"]

    awq = load_recipe(ROOT / "recipes/tiny-llama-awq.yaml")
    built = yaml.safe_load(build_llmcompressor_recipe(awq.quantization))["quant_stage"]["quant_modifiers"]
    assert built["AWQModifier"] == {"duo_scaling": True, "n_grid": 5}
    assert resolved("tiny-llama-awq.yaml") == ("sequential", False, 1)
    assert resolved("tiny-llama-gptq.yaml") == ("independent", True, 1)
    assert resolved("tiny-llama-sparse-gptq.yaml") == ("independent", True, 1)  # a raw llm-compressor recipe
    formats = load_recipe(ROOT / "recipes/tiny-llama-formats.yaml")
    int8 = formats.model_copy(update={"quantization": formats.quantization.candidate("int8-w8a8")})
    assert (
        calibration_pipeline(int8)["pipeline"] == "independent"
    )  # SmoothQuant must run before GPTQ sees data
    assert resolved(
        "tiny-llama-awq.yaml",
        {
            "calibration.pipeline": "basic",
            "calibration.propagate_error": True,
            "calibration.sequential_targets_per_subgraph": 4,
        },
    ) == ("basic", True, 4)


def test_the_production_recipe_calibrates_at_the_batch_size_measured_on_the_gpu():
    """benchmarks/results/release-time/h200_quantize_speed.json: the fastest set on the H200 within the
    reference model's
    recovery tolerance sets the llama3 recipe's calibration batch size."""
    from quantize_serve.quantize.run import calibration_pipeline

    chosen = json.loads((ROOT / "benchmarks/results/release-time/h200_quantize_speed.json").read_text())[
        "choice"
    ]["awq"]
    recipe = load_recipe(ROOT / "recipes/llama3-8b-instruct-awq.yaml")
    assert recipe.calibration.batch_size == chosen["changes"]["calibration.batch_size"] == 4
    assert calibration_pipeline(recipe)["pipeline"] == chosen["changes"]["calibration.pipeline"]


@pytest.mark.parametrize(
    "dotted,value",
    [
        ("quantization.n_grid", 3),
        ("quantization.duo_scaling", "half"),
        ("calibration.pipeline", "parallel"),
        ("calibration.sequential_targets_per_subgraph", 0),
    ],
)
def test_speed_options_out_of_range(dotted, value):
    with pytest.raises((RecipeError, RecipeErrors)) as info:
        load_recipe(ROOT / "recipes/tiny-llama-awq.yaml", {dotted: value})
    assert dotted in str(info.value)


def test_run_overrides_change_the_recipe_and_are_validated_like_the_file():
    """A deployment's `overrides` parameter: dotted keys, list items by index; the result is checked
    like the file, and the validated recipe records what was changed."""
    llama3 = ROOT / "recipes/llama3-8b-instruct-awq.yaml"
    overrides = {
        "gates.accuracy.tasks": [{"task": "../evals/tasks/qs_heldout_ppl.yaml", "limit": 20}],
        "gates.stress.num_requests": 64,
        "serve.enforce_eager": True,
    }
    recipe = load_recipe(llama3, overrides)
    assert [t.task for t in recipe.gates.accuracy.tasks] == ["../evals/tasks/qs_heldout_ppl.yaml"]
    assert (recipe.gates.stress.num_requests, recipe.serve.enforce_eager) == (64, True)
    assert load_recipe(llama3, {"gates.accuracy.tasks.0.limit": 7}).gates.accuracy.tasks[0].limit == 7
    assert load_recipe(llama3).gates.accuracy.tasks[0].task == "gsm8k"  # the file itself is untouched

    with pytest.raises(RecipeErrors) as misspelled:
        load_recipe(llama3, {"serve.max_num_seq": 8})
    assert "serve.max_num_seq" in str(misspelled.value) and "did you mean 'max_num_seqs'" in str(
        misspelled.value
    )
    with pytest.raises(RecipeError) as no_item:
        load_recipe(llama3, {"gates.accuracy.tasks.9.limit": 7})
    message = str(no_item.value)
    assert "overrides.gates.accuracy.tasks.9.limit" in message and "has no entry '9'" in message
    with pytest.raises(RecipeErrors) as bad_value:
        load_recipe(llama3, {"serve.max_model_len": -1})
    assert "serve.max_model_len" in str(bad_value.value)


def test_validated_recipe_records_the_overrides():
    tiny = ROOT / "recipes/tiny-llama-awq.yaml"
    validated = validate_recipe(tiny, {"gates.stress.num_requests": 12})
    assert validated.overrides == {"gates.stress.num_requests": 12}
    assert validated.recipe.gates.stress.num_requests == 12
    assert validated.recipe_sha256 != validate_recipe(tiny).recipe_sha256  # the run's recipe, not the file's


# --------------------------------------------------------------------------------------------
# gates.accuracy: on_uncertain and min_samples (see docs/gates.md)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -5, 10_000_001])
def test_min_samples_out_of_range(recipe_file, value):
    err = expect_error(recipe_file(gates__accuracy__min_samples=value), "gates.accuracy.min_samples")
    assert str(value) in str(err) and "between 1 and 10000000" in str(err)


@pytest.mark.parametrize(
    "field, value, fix",
    [
        ("default_recovery", 0.95, "set gates.accuracy.error_rates"),
        ("on_uncertain", "fail", "max_false_pass"),
    ],
)
def test_retired_point_rule_fields_say_what_replaces_them(recipe_file, field, value, fix):
    err = expect_error(recipe_file(**{f"gates__accuracy__{field}": value}), "gates.accuracy")
    assert f"{field} = {value!r}" in str(err) and fix in str(err)


def test_a_retired_per_metric_recovery_names_the_task_error_rates(recipe_file):
    tasks = [{"task": "../evals/tasks/qs_facts_mc.yaml", "recovery": {"acc": 0.9}}]
    err = expect_error(recipe_file(gates__accuracy__tasks=tasks), "gates.accuracy.tasks.0")
    assert "error_rates: {bad_recovery:" in str(err)


@pytest.mark.parametrize(
    "rates, field, words",
    [
        ({"bad_recovery": 0.99, "good_recovery": 0.95}, "", "must be above bad_recovery"),
        ({"max_false_pass": 0.5}, ".max_false_pass", "between 0.001 and 0.25"),
        ({"min_true_pass": 0.3}, ".min_true_pass", "between 0.5 and 0.999"),
    ],
)
def test_error_rates_out_of_order_or_range(recipe_file, rates, field, words):
    err = expect_error(recipe_file(gates__accuracy__error_rates=rates), "gates.accuracy.error_rates" + field)
    assert words in str(err)


@pytest.mark.parametrize("looks", [[0.5, 0.25, 1.0], [0.25, 0.5], [0.0, 1.0]])
def test_looks_must_rise_to_the_whole_task(recipe_file, looks):
    err = expect_error(recipe_file(gates__accuracy__looks=looks), "gates.accuracy.looks")
    assert "increasing fractions" in str(err)


def test_min_samples_above_a_task_limit_fails_at_load(recipe_file):
    tasks = [
        {"task": "../evals/tasks/qs_facts_mc.yaml", "limit": 40},
        {"task": "../evals/tasks/qs_heldout_ppl.yaml"},
    ]
    err = expect_error(
        recipe_file(gates__accuracy__tasks=tasks, gates__accuracy__min_samples=100),
        "gates.accuracy.tasks.0.limit",
    )
    assert "40" in str(err) and "min_samples (100)" in str(err)
    assert "raise the limit to at least 100" in str(err)


def test_error_rates_looks_and_min_samples_load(recipe_file):
    gate = validate_recipe(
        recipe_file(
            gates__accuracy__error_rates={"bad_recovery": 0.9},
            gates__accuracy__looks=[0.5, 1.0],
            gates__accuracy__min_samples=20,
        )
    ).recipe.gates.accuracy
    assert (gate.error_rates.bad_recovery, gate.error_rates.good_recovery, gate.looks, gate.min_samples) == (
        0.9,
        0.99,
        [0.5, 1.0],
        20,
    )
    default = load_recipe(ROOT / "recipes/tiny-llama-awq.yaml").gates.accuracy
    assert default.looks == [0.25, 0.5, 0.75, 1.0] and default.error_rates.max_false_pass == 0.05


def test_a_key_written_twice_is_an_error_that_shows_both_lines(tmp_path) -> None:
    text = (ROOT / "recipes" / "tiny-llama-awq.yaml").read_text()
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("name:"))
    path = tmp_path / "twice.yaml"
    path.write_text(text + "\nname: another-name\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert err.value.field == "name"
    assert (
        f"line {first + 1} ({lines[first]!r}) and line {len(lines) + 2} ('name: another-name')"
        in err.value.problem
    )
    assert "keep one of the two lines" in err.value.fix


def test_an_unset_concurrency_is_every_sequence_slot_for_every_gate_and_the_format_choice():
    """One resolution of "unset means serve.max_num_seqs" (lm-eval's requests, stress, soak, the measured
    conditions, the format choice's benchmark all call it)."""
    recipe = load_recipe(ROOT / "recipes/llama3-8b-instruct-awq.yaml")
    from quantize_serve.formats.choose import BenchSettings
    from quantize_serve.gates.accuracy.run import lm_eval_concurrency
    from quantize_serve.gates.regression import measurement_conditions

    serve = recipe.serve
    assert serve.concurrency(None) == serve.max_num_seqs and serve.concurrency(3) == 3
    assert lm_eval_concurrency(recipe.gates.accuracy, serve) == serve.max_num_seqs
    assert BenchSettings.from_recipe(recipe).concurrency == (
        recipe.quantization.rule.concurrency or serve.max_num_seqs
    )
    stress = recipe.gates.stress.concurrency or serve.max_num_seqs
    assert measurement_conditions(recipe, vllm_version="0", hardware="h").stress["concurrency"] == stress
