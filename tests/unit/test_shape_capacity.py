"""Capacity of a model shape before its weights are downloaded, without a boot: the folders with
dummy-weight configs (the boots: tests/engines/test_shape_capacity.py, the flow's preflight:
tests/flows/test_shape_capacity.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from quantize_serve.capacity.shape import quantization_config
from quantize_serve.cli import main
from tests.conftest import ROOT
from tests.release_fixtures import capacity_config

TINY = ROOT / "models" / "tiny-llama"


RECIPE = ROOT / "recipes" / "tiny-llama-awq.yaml"


def test_quantization_config_is_what_llm_compressor_writes(awq_recipe, awq_checkpoint):
    """The dummy W4A16 folder's config says what the real checkpoint's says, so vLLM picks the same
    scheme and kernel (KV scales aside: the dummy boot runs fp8 KV with vLLM's default scale)."""
    written = json.loads((Path(awq_checkpoint.checkpoint_dir) / "config.json").read_text())[
        "quantization_config"
    ]
    ours = quantization_config(awq_recipe.quantization)
    for key in ("quant_method", "format", "ignore"):
        assert ours[key] == written[key], key
    assert list(ours["config_groups"]) == list(written["config_groups"]) == ["group_0"]
    group, real = ours["config_groups"]["group_0"], written["config_groups"]["group_0"]
    assert (group["targets"], group["format"]) == (real["targets"], real["format"])
    for key in ("num_bits", "type", "strategy", "group_size", "symmetric", "dynamic", "actorder"):
        assert group["weights"][key] == real["weights"][key], (
            key
        )  # what vLLM's compressed-tensors config reads
    assert ours.get("kv_cache_scheme") is None


def test_measure_needs_a_recipe_and_no_gpu_preset(capsys):
    assert main(["plan", "--model", str(TINY), "--measure"]) == 2
    err = capsys.readouterr().err
    assert "needs a RECIPE" in err and "quantize-serve plan RECIPE --measure" in err
    assert main(["plan", str(RECIPE), "--measure", "--gpu", "h200"]) == 2
    assert "--gpu only applies to a prediction" in capsys.readouterr().err


def fake_boots(monkeypatch, recipe, *, refuse: set[str] = frozenset()) -> list[str]:
    """measure_shape's boots of ``recipe`` without vLLM: each boot's role is recorded, read from its log's
    name (named by what it runs: capacity.boot_log_name); a boot in ``refuse`` is refused."""
    from contextlib import contextmanager

    from quantize_serve.capacity import shape
    from quantize_serve.capacity.measure import boot_log_name
    from quantize_serve.core.errors import ServerBootError
    from quantize_serve.serving.boot import Boot

    booted: list[str] = []
    roles = {boot_log_name(recipe, b, kind="shape"): b for b in Boot}

    @contextmanager
    def server(spec, *, log_path):
        name = roles[log_path.name]
        booted.append(name)
        if name in refuse:
            raise ServerBootError("vLLM exited with code 1 before it became healthy: No available memory")
        yield spec

    def measure(server, spec, *, name):
        return capacity_config(
            name=name, kv_cache_dtype=spec.effective_kv_dtype, kv_cache_tokens=4096, block_size=128
        )

    monkeypatch.setattr(shape, "vllm_server", server)
    monkeypatch.setattr(shape, "measure_capacity", measure)
    return booted


def test_a_shape_can_be_measured_one_configuration_at_a_time(monkeypatch, tmp_path, awq_recipe):
    """``boots``: a benchmark measures row by row (benchmarks/h200_shapes.py); the rows not asked for are
    planned only and say why."""
    from quantize_serve.capacity.shape import measure_shape
    from quantize_serve.serving.boot import Boot

    booted = fake_boots(monkeypatch, awq_recipe)
    result = measure_shape(awq_recipe, TINY, out_dir=tmp_path, model="tiny", boots={Boot.PRODUCTION})
    assert booted == [Boot.PRODUCTION]
    rows = {r.name: r for r in result.rows}
    assert rows[Boot.PRODUCTION].measured.kv_cache_tokens == 4096 and rows[Boot.PRODUCTION].not_booted is None
    for other in (Boot.BASE, Boot.QUANTIZED_16BIT_KV):
        assert rows[other].measured is None and rows[other].not_booted == "not asked for"
    assert result.markdown().count("not booted: not asked for") == 2


def test_the_preflight_boots_nothing_after_production_is_refused(monkeypatch, tmp_path, awq_recipe):
    from quantize_serve.capacity.shape import measure_shape
    from quantize_serve.serving.boot import Boot

    booted = fake_boots(monkeypatch, awq_recipe, refuse={str(Boot.PRODUCTION)})
    result = measure_shape(awq_recipe, TINY, out_dir=tmp_path, model="tiny", production_first=True)
    assert booted == [Boot.PRODUCTION]
    assert result.row(Boot.PRODUCTION).refused.endswith("No available memory")
    assert result.markdown().count("not booted: production was refused first") == 2


def test_a_shape_the_planner_refuses_is_measured_on_a_gpu_and_refused_on_a_fixed_budget(
    monkeypatch, tmp_path, awq_recipe
):
    """The planner's refusal of a sliding-window or multi-latent-attention shape points to `plan RECIPE
    --measure`: on a GPU its rows are vLLM's figures without a prediction; a fixed (CPU) budget cannot be
    split without the planner's weight bytes, and says so."""
    from quantize_serve.capacity.shape import measure_shape
    from quantize_serve.core.errors import RecipeError
    from quantize_serve.serving.boot import Boot

    model = tmp_path / "sliding"
    model.mkdir()
    for f in TINY.iterdir():
        if f.suffix != ".safetensors":
            shutil.copyfile(f, model / f.name)
    config = json.loads((TINY / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "sliding_window": 256}))
    booted = fake_boots(monkeypatch, awq_recipe)

    with pytest.raises(RecipeError) as err:
        measure_shape(awq_recipe, model, out_dir=tmp_path / "cpu", model="sliding")
    assert err.value.field == "serve.memory_budget" and "sliding_window = 256" in str(err.value)
    assert "measure on the GPU host" in str(err.value) and booted == []

    on_gpu = awq_recipe.model_copy(
        update={"serve": awq_recipe.serve.model_copy(update={"memory_budget": None})}
    )
    result = measure_shape(
        on_gpu, model, out_dir=tmp_path / "gpu", model="sliding", device_memory_bytes=150 * 2**30
    )
    assert booted == list(Boot) and all(
        r.measured and r.planned is None and r.error_pct is None for r in result.rows
    )
    text = result.markdown()
    # the production row as this host serves it (an AVX2 CPU's session recipe: a 16-bit KV cache)
    prod = result.row(Boot.PRODUCTION)
    label = prod.name.label(awq_recipe.quantization.scheme, kv_cache_dtype=prod.kv_cache_dtype)
    name = f"{label} ({prod.kv_cache_dtype})"
    if awq_recipe.serve.kv_cache_dtype == "fp8":
        assert name == "w4a16-fp8kv (fp8)"
    assert f"| {name} | 0.00 | 4,096 | 8.00x | - |" in text and "max concurrency @ 512" in text
    assert (
        "No planner prediction: sliding_window = 256: LlamaForCausalLM attends through a sliding window"
        in text
    )
