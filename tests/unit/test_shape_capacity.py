"""Capacity of a model shape before its weights are downloaded, without a boot: the folders with
dummy-weight configs (the boots: tests/engines/test_shape_capacity.py, the flow's preflight:
tests/flows/test_shape_capacity.py)."""


from __future__ import annotations

import json
from pathlib import Path

from quantize_serve.capacity.shape import quantization_config
from quantize_serve.cli import main
from tests.conftest import ROOT

TINY = ROOT / "models" / "tiny-llama"


RECIPE = ROOT / "recipes" / "tiny-llama-awq.yaml"


def test_quantization_config_is_what_llm_compressor_writes(awq_recipe, awq_checkpoint):
    """The dummy W4A16 folder's config says what the real checkpoint's says, so vLLM picks the same
    scheme and kernel (KV scales aside: the dummy boot runs fp8 KV with vLLM's default scale)."""
    written = json.loads((Path(awq_checkpoint.checkpoint_dir) / "config.json").read_text())["quantization_config"]
    ours = quantization_config(awq_recipe.quantization)
    for key in ("quant_method", "format", "ignore"):
        assert ours[key] == written[key], key
    assert list(ours["config_groups"]) == list(written["config_groups"]) == ["group_0"]
    group, real = ours["config_groups"]["group_0"], written["config_groups"]["group_0"]
    assert (group["targets"], group["format"]) == (real["targets"], real["format"])
    for key in ("num_bits", "type", "strategy", "group_size", "symmetric", "dynamic", "actorder"):
        assert group["weights"][key] == real["weights"][key], key  # what vLLM's compressed-tensors config reads
    assert ours.get("kv_cache_scheme") is None


def test_measure_needs_a_recipe_and_no_gpu_preset(capsys):
    assert main(["plan", "--model", str(TINY), "--measure"]) == 2
    err = capsys.readouterr().err
    assert "needs a RECIPE" in err and "quantize-serve plan RECIPE --measure" in err
    assert main(["plan", str(RECIPE), "--measure", "--gpu", "h200"]) == 2
    assert "--gpu only applies to a prediction" in capsys.readouterr().err
