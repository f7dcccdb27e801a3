"""Mixture of experts on CPU: llm-compressor's own MoE support quantizes the project's tiny Qwen3-MoE
through the pipeline's quantization stage (the worker linearizes the fused experts and calibrates every
expert on every token), and the checkpoint has the layout vLLM's MoE kernels load: every expert's
gate/up/down projections quantized one by one, the router gates, the embeddings and the LM head in 16
bits, the routers named in the checkpoint's ignore list.

One quantization (GPTQ W4A16, 8 calibration samples of 64 tokens: seconds), shared by the module's
tests. GPTQ rather than the recipe's AWQ: both go through the same MoE path (linearize_moe,
moe_calibrate_all_experts), and AWQ with the recipe's calibration took 109 s on the suite's 2-core
CPU (benchmarks/results/release-formats/cpu_moe.json). Serving it on this CPU is refused by vLLM
(tests/unit/test_moe.py:
the run stops at validation with vLLM's reason).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantize_serve.quantize.run import MANIFEST, RECIPE_FILE
from tests.conftest import ROOT, _quantize, safetensors_tensors

RECIPE = ROOT / "recipes" / "tiny-qwen3-moe-awq.yaml"
CHEAP_GPTQ = {
    "quantization.method": "gptq",
    "quantization.scheme": "W4A16",
    "quantization.kv_cache_scales": False,
    "calibration.num_samples": 8,
    "calibration.max_seq_len": 64,
}
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
QUANTIZED = ("weight_packed", "weight_scale", "weight_shape")  # symmetric: no zero point


@pytest.fixture(scope="module")
def moe_run():
    """(the quantization result, its log lines): made once for the module."""
    lines: list[str] = []
    result = _quantize(RECIPE, log=lines.append, overrides=CHEAP_GPTQ)
    return result, lines


@pytest.fixture(scope="module")
def tensors(moe_run) -> dict[str, tuple[str, list[int]]]:
    """name -> (dtype, shape) of every tensor in the checkpoint."""
    return safetensors_tensors(Path(moe_run[0].checkpoint_dir) / "model.safetensors")


@pytest.fixture(scope="module")
def base_config() -> dict:
    return json.loads((ROOT / "models" / "tiny-qwen3-moe" / "config.json").read_text())


def test_the_tiny_moe_quantizes_on_cpu_through_llm_compressors_moe_support(moe_run):
    result, lines = moe_run
    ckpt = Path(result.checkpoint_dir)
    assert result.device == "cpu" and result.method == "gptq" and result.scheme == "W4A16"
    assert "GPTQModifier" in (ckpt / RECIPE_FILE).read_text()
    manifest = json.loads((ckpt / MANIFEST).read_text())
    assert manifest["result"]["engine_versions"]["llmcompressor"].startswith("0.14")
    if not result.cached:  # the experts were linearized by llm-compressor (a reused checkpoint logs one line)
        assert any("Linearizing experts" in line for line in lines), lines[-20:]
    assert 0 < result.quantized_bytes < 0.6 * result.base_bytes


def test_every_expert_is_quantized_and_the_routers_are_not(moe_run, tensors, base_config):
    layers, experts = base_config["num_hidden_layers"], base_config["num_local_experts"]
    hidden, width = base_config["hidden_size"], base_config["moe_intermediate_size"]
    config = json.loads((Path(moe_run[0].checkpoint_dir) / "config.json").read_text())
    q = config["quantization_config"]
    weights = q["config_groups"]["group_0"]["weights"]
    assert (q["quant_method"], q["format"]) == ("compressed-tensors", "pack-quantized")
    assert (weights["num_bits"], weights["group_size"], weights["symmetric"]) == (4, 128, True)
    assert {f"model.layers.{i}.mlp.gate" for i in range(layers)} | {"lm_head"} <= set(q["ignore"])

    for i in range(layers):
        prefix = f"model.layers.{i}"
        for e in range(experts):
            for proj in PROJECTIONS:
                name = f"{prefix}.mlp.experts.{e}.{proj}"
                assert all(f"{name}.{part}" in tensors for part in QUANTIZED), name
                assert f"{name}.weight" not in tensors, name
                out_f, in_f = (hidden, width) if proj == "down_proj" else (width, hidden)
                assert tensors[f"{name}.weight_packed"] == ("I32", [out_f, in_f // 8]), (
                    name
                )  # 8 int4 per int32
                assert tensors[f"{name}.weight_scale"][1] == [out_f, in_f // 128], name  # one scale per group
        for proj in ATTENTION:
            assert f"{prefix}.self_attn.{proj}.weight_packed" in tensors
        router = f"{prefix}.mlp.gate"
        assert tensors[f"{router}.weight"] == ("BF16", [experts, hidden])
        assert not any(k.startswith(router + ".") and k != f"{router}.weight" for k in tensors)
    assert tensors["model.embed_tokens.weight"][0] == "BF16" and tensors["lm_head.weight"][0] == "BF16"
    assert not any(k.startswith(("model.embed_tokens.", "lm_head.")) and "packed" in k for k in tensors)
    # nothing of the fused 3D layout is left (vLLM's compressed-tensors MoE loader reads experts one by one)
    assert not any("gate_up_proj" in k or k.endswith("experts.down_proj") for k in tensors)
