"""benchmarks/activation_peak.py without a boot: each variant changes what it says and nothing else, the
planner sees the change, and a bad choice is refused before any boot."""

from __future__ import annotations

import json

import pytest

from benchmarks import activation_peak as ap
from quantize_serve.capacity.model_shape import ModelShape
from quantize_serve.capacity.planner import activation_peak_bytes


def config_of(folder) -> dict:
    return json.loads((folder / "config.json").read_text())


def test_each_qwen2_variant_changes_one_thing(tmp_path):
    base = config_of(ap.variant_folder("qwen2-72b", ap.VARIANTS, 4, tmp_path))
    assert base["num_hidden_layers"] == 4 and base["architectures"] == ["Qwen2ForCausalLM"]
    assert base["max_window_layers"] <= 4
    for name, changed in (("qwen2-72b-i28672", {"intermediate_size"}), ("qwen2-72b-v128256", {"vocab_size"}),
                          ("qwen2-72b-no-bias", {"architectures", "model_type", "attention_bias", "mlp_bias"})):
        folder = ap.variant_folder(name, ap.VARIANTS, 4, tmp_path)
        config = config_of(folder)
        assert {k for k in config.keys() | base.keys() if config.get(k) != base.get(k)} == changed, name
        assert (folder / "tokenizer.json").is_file()  # a dummy boot still needs a tokenizer
    full = config_of(ap.variant_folder("qwen2-72b", ap.VARIANTS, None, tmp_path))
    assert full["num_hidden_layers"] == 80


def test_the_planner_sees_each_variant(tmp_path):
    """The variants the planner models differently (bias, intermediate) plan a different peak; depth does not."""
    def peak(name: str, layers: int | None = 4) -> int:
        shape = ModelShape.from_config(ap.variant_folder(name, ap.VARIANTS, layers, tmp_path) / "config.json")
        return activation_peak_bytes(shape, max_num_batched_tokens=8192, compiled=True)

    assert peak("qwen2-72b") == peak("qwen2-72b", None)  # the planner's term, like vLLM's peak, ignores depth
    assert peak("qwen2-72b-i28672") < peak("qwen2-72b")
    assert peak("qwen2-72b-v128256") == peak("qwen2-72b") == peak("qwen2-72b-no-bias")
    no_bias = ModelShape.from_config(ap.variant_folder("qwen2-72b-no-bias", ap.VARIANTS, 4, tmp_path) / "config.json")
    assert not no_bias.qkv_bias and no_bias.architecture == "LlamaForCausalLM"


def test_every_variant_is_a_shape_the_planner_models(tmp_path):
    for name in ap.VARIANTS:
        shape = ModelShape.from_config(ap.variant_folder(name, ap.VARIANTS, 4, tmp_path) / "config.json")
        assert shape.num_layers == 4
        assert shape.is_moe is name.startswith(("qwen3", "mixtral")), name


@pytest.mark.parametrize("args, needle", [(["--variants", "qwen9"], "unknown variant qwen9"),
                                          (["--configs", "w8a8"], "unknown configuration w8a8"),
                                          (["--modes", "fast"], "unknown mode fast")])
def test_a_bad_choice_is_refused_before_any_boot(args, needle):
    with pytest.raises(SystemExit) as info:
        ap.main([*args, "--out", "/dev/null"])
    assert needle in str(info.value)
