"""A known base's reference (report/base_reference.py): what its key depends on, and the store."""

from __future__ import annotations

import shutil
from pathlib import Path

from quantize_serve.serving.spec import capacity_spec
from quantize_serve.gates.accuracy.run import lm_eval_concurrency
from quantize_serve.recipe.load import load_recipe
from quantize_serve.recipe.model import ProfileSearch
from quantize_serve.report.base_reference import (
    MeasuredRow,
    add_sixteen_bit_kv,
    find_reference,
    format_key,
    reference_factors,
    reference_key,
    save_reference,
    stored_for,
)
from quantize_serve.serving.boot import Boot
from tests.conftest import ROOT
from tests.release_fixtures import placeholder_reference

RECIPE = ROOT / "recipes" / "tiny-llama-awq.yaml"
BASE = ROOT / "models" / "tiny-llama"


def key_of(
    recipe,
    *,
    base: str = "local:abc",
    vllm: str | None = "0.32.0",
    hardware: str = "x86_64 2 CPUs, no GPU",
    model_dir: Path = BASE,
) -> str:
    spec = capacity_spec(recipe, Boot.BASE, model_dir)
    return reference_key(
        reference_factors(
            recipe, base, spec.vllm_config(), vllm_version=vllm, hardware=hardware, lm_eval_version="0.4.13"
        )
    )


def test_the_key_changes_with_each_thing_the_base_figures_depend_on(tmp_path):
    recipe = load_recipe(RECIPE)
    key = key_of(recipe)
    assert key == key_of(recipe)  # deterministic
    elsewhere = shutil.copytree(BASE, tmp_path / "tiny-llama")
    assert key == key_of(recipe, model_dir=elsewhere)  # the folder is not the base: its sha is
    assert key != key_of(recipe, base="local:abd")
    assert key != key_of(recipe, vllm="0.33.0")
    assert key != key_of(recipe, hardware="x86_64 16 CPUs, NVIDIA H200")
    serve = recipe.model_copy(update={"serve": recipe.serve.model_copy(update={"max_model_len": 256})})
    assert key != key_of(serve)
    gate = recipe.gates.accuracy.model_copy(update={"tasks": recipe.gates.accuracy.tasks[:1]})
    fewer = recipe.model_copy(update={"gates": recipe.gates.model_copy(update={"accuracy": gate})})
    assert key != key_of(fewer)
    scoring = gate.model_copy(update={"tasks": recipe.gates.accuracy.tasks, "scoring": "echo"})
    assert key != key_of(
        recipe.model_copy(update={"gates": recipe.gates.model_copy(update={"accuracy": scoring})})
    )
    # not in the key: what does not change the base's figures (the stress profile, the quantization)
    stress = recipe.gates.stress.model_copy(update={"num_requests": 7})
    assert key == key_of(
        recipe.model_copy(update={"gates": recipe.gates.model_copy(update={"stress": stress})})
    )


def test_a_task_file_or_its_data_changing_changes_the_key(tmp_path):
    tasks = tmp_path / "evals" / "tasks"
    shutil.copytree(ROOT / "evals" / "tasks", tasks)
    shutil.copytree(ROOT / "data" / "evals", tmp_path / "data" / "evals")
    recipe = load_recipe(RECIPE).model_copy(update={"base_dir": str(tmp_path / "recipes")})
    key = key_of(recipe)
    data = tmp_path / "data" / "evals" / "heldout_ppl.jsonl"
    data.write_text(data.read_text() + '{"text": "one more document"}\n')
    assert key_of(recipe) != key
    key = key_of(recipe)
    template = tasks / "_qs_passkey_template_yaml"  # included by the passkey tasks
    template.write_text(template.read_text() + "\n# changed\n")
    assert key_of(recipe) != key


def test_a_reference_is_found_under_its_key_only(tmp_path):
    ref = placeholder_reference("k1", "run-1")
    capacity = ref.capacity
    assert find_reference(tmp_path, "k1") is None
    save_reference(tmp_path, ref)
    assert find_reference(tmp_path, "k1") == ref and find_reference(tmp_path, "k2") is None
    # row (b) of a format joins the base's figures; under a key with no reference it is not kept
    row = MeasuredRow(run_id="run-2", capacity=capacity.model_copy(update={"name": Boot.QUANTIZED_16BIT_KV}))
    add_sixteen_bit_kv(tmp_path, "k1", "fmt", row)
    add_sixteen_bit_kv(tmp_path, "k2", "fmt", row)
    assert find_reference(tmp_path, "k1").sixteen_bit_kv == {"fmt": row}
    assert find_reference(tmp_path, "k2") is None
    (tmp_path / "base-references" / "k1.json").write_text("{not json")
    assert find_reference(tmp_path, "k1") is None  # unreadable: the base is measured again


def test_a_run_knows_before_its_base_resolves_whether_a_stored_reference_could_be_its_base(
    tmp_path, monkeypatch
):
    """stored_for: a Hub base's references name its repo (any commit), a local base's are all "local:"
    ones; with none, the run boots its base (report/steps.py boots_base_first, unless reuse is off), so the
    base's boot can start as the base downloads (tasks/base_reference.py reference_stored asks the store)."""
    from quantize_serve.core.settings import get_settings
    from quantize_serve.report.steps import boots_base_first
    from quantize_serve.validate.preflight import validate_recipe
    from tasks.base_reference import reference_stored

    assert not stored_for(tmp_path, "org/base") and not stored_for(tmp_path, None)
    ref = placeholder_reference("k1", "run-1")
    save_reference(tmp_path, ref.model_copy(update={"factors": {"base": "org/base@" + "a" * 40}}))
    (tmp_path / "base-references" / "broken.json").write_text("[not a reference")
    assert stored_for(tmp_path, "org/base") and not stored_for(tmp_path, "org/base-2")
    assert not stored_for(tmp_path, None)
    save_reference(
        tmp_path, placeholder_reference("k2", "run-2").model_copy(update={"factors": {"base": "local:ab"}})
    )
    assert stored_for(tmp_path, None)

    monkeypatch.setenv("QS_WORK_DIR", str(tmp_path / "work"))
    get_settings.cache_clear()
    try:
        local = validate_recipe(RECIPE)
        assert boots_base_first(get_settings(), reference_stored(local))
        shutil.copytree(tmp_path / "base-references", tmp_path / "work" / "base-references")
        assert not boots_base_first(get_settings(), reference_stored(local))
        monkeypatch.setenv("QS_REUSE_BASE_REFERENCE", "false")
        get_settings.cache_clear()
        assert boots_base_first(get_settings(), reference_stored(local))
    finally:
        monkeypatch.delenv("QS_WORK_DIR")
        monkeypatch.delenv("QS_REUSE_BASE_REFERENCE", raising=False)
        get_settings.cache_clear()


def test_the_format_key_follows_the_checkpoints_bytes_and_the_serve_settings_not_the_calibration():
    recipe = load_recipe(RECIPE)
    fmt = format_key(recipe)

    def changed(section: str, **update) -> str:
        return format_key(
            recipe.model_copy(update={section: getattr(recipe, section).model_copy(update=update)})
        )

    assert changed("calibration", shuffle_seed=43, num_samples=7) == fmt  # the values, not the sizes
    assert changed("quantization", group_size=64) != fmt
    assert changed("quantization", scheme="W8A8") != fmt
    assert changed("serve", max_num_seqs=3) != fmt
    # a run that searches its serve settings boots the search's, not the recipe's: no row (b) to share
    assert changed("serve", search=ProfileSearch(enabled=True)) is None


def test_lm_eval_concurrency_is_the_servers_batch_unless_the_gate_says():
    recipe = load_recipe(RECIPE)
    assert recipe.gates.accuracy.num_concurrent is None
    assert lm_eval_concurrency(recipe.gates.accuracy, recipe.serve) == recipe.serve.max_num_seqs == 16
    gate = recipe.gates.accuracy.model_copy(update={"num_concurrent": 3})
    assert lm_eval_concurrency(gate, recipe.serve) == 3
