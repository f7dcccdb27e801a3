"""benchmarks/activation_peak.py without a boot: each variant changes what it says and nothing else, the
planner sees the change, and a bad choice is refused before any boot."""

from __future__ import annotations

import json

import pytest

from benchmarks import activation_peak as ap
from quantize_serve.capacity.model_shape import ModelShape
from quantize_serve.capacity.planner import activation_peak_bytes
from quantize_serve.serving import vllm_log


def config_of(folder) -> dict:
    return json.loads((folder / "config.json").read_text())


def test_each_qwen2_variant_changes_one_thing(tmp_path):
    base = config_of(ap.variant_folder("qwen2-72b", ap.VARIANTS, 4, tmp_path))
    assert base["num_hidden_layers"] == 4 and base["architectures"] == ["Qwen2ForCausalLM"]
    assert base["max_window_layers"] <= 4
    for name, changed in (
        ("qwen2-72b-i28672", {"intermediate_size"}),
        ("qwen2-72b-v128256", {"vocab_size"}),
        ("qwen2-72b-no-bias", {"architectures", "model_type", "attention_bias", "mlp_bias"}),
    ):
        folder = ap.variant_folder(name, ap.VARIANTS, 4, tmp_path)
        config = config_of(folder)
        assert {k for k in config.keys() | base.keys() if config.get(k) != base.get(k)} == changed, name
        assert (folder / "tokenizer.json").is_file()  # a dummy boot still needs a tokenizer
    full = config_of(ap.variant_folder("qwen2-72b", ap.VARIANTS, None, tmp_path))
    assert full["num_hidden_layers"] == 80


def test_the_planner_sees_each_variant(tmp_path):
    """The compiled peak follows the vocabulary (as vLLM's did: 2.21 GiB with Llama's, 2.57 with Qwen2's), not
    the intermediate size or the biases (2.57 GiB with either changed); depth does not enter it."""

    def peak(name: str, layers: int | None = 4) -> int:
        shape = ModelShape.from_config(ap.variant_folder(name, ap.VARIANTS, layers, tmp_path) / "config.json")
        return activation_peak_bytes(shape, max_num_batched_tokens=8192, compiled=True)

    assert peak("qwen2-72b") == peak("qwen2-72b", None)  # the planner's term, like vLLM's peak, ignores depth
    assert (
        peak("qwen2-72b-v128256") < peak("qwen2-72b") == peak("qwen2-72b-i28672") == peak("qwen2-72b-no-bias")
    )
    assert (
        peak("qwen2-72b") - peak("qwen2-72b-v128256") == (152_064 - 128_256) * 8192 * 2
    )  # 0.363 GiB, as measured
    assert peak("qwen2-72b-v128256") == peak("llama-3-70b") == peak("llama-3-70b-i29568")
    no_bias = ModelShape.from_config(
        ap.variant_folder("qwen2-72b-no-bias", ap.VARIANTS, 4, tmp_path) / "config.json"
    )
    assert not no_bias.qkv_bias and no_bias.architecture == "LlamaForCausalLM"


def test_every_variant_is_a_shape_the_planner_models(tmp_path):
    for name in ap.VARIANTS:
        shape = ModelShape.from_config(ap.variant_folder(name, ap.VARIANTS, 4, tmp_path) / "config.json")
        assert shape.num_layers == 4
        assert shape.is_moe is name.startswith(("qwen3", "mixtral")), name


def test_boots_of_one_row_and_the_compile_cache_lines():
    assert ap.row_id("qwen2-72b", "w4a16", "graphs") == "qwen2-72b/w4a16/graphs"
    assert ap.row_id("qwen2-72b", "w4a16", "graphs", 2) == "qwen2-72b/w4a16/graphs#2"
    assert (
        vllm_log.compile_cache(
            "INFO [compilation/backends.py:393] Compiling a graph for compile range (1, 8192) takes 10.81 s"
        )
        == "miss"
    )
    assert (
        vllm_log.compile_cache(
            "INFO [compilation/backends.py:293] Directly load the compiled graph(s) for compile "
            "range (1, 8192) from the cache, took 0.22 s"
        )
        == "hit"
    )
    assert vllm_log.compile_cache("eager: nothing compiled") is None


def test_replan_puts_todays_planner_beside_each_recorded_peak():
    rows = [
        {
            "id": "qwen2-72b/w4a16/graphs",
            "variant": "qwen2-72b",
            "layers": 4,
            "mode": "graphs",
            "status": "measured",
            "vllm_actual_usage_gib": {"peak_activation": 2.57},
            "planner_activation_gib": 2.27,
        },
        {"id": "x/w4a16/graphs", "status": "error", "reason": "boom"},
    ]
    out = ap.replan(rows)
    assert out[0]["planner_activation_gib"] == 2.57 and out[0]["peak_minus_planner_gib"] == 0.0
    assert out[1] == rows[1]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--variants", "qwen9"], "unknown variant qwen9"),
        (["--configs", "w8a8"], "unknown configuration w8a8"),
        (["--modes", "fast"], "unknown mode fast"),
    ],
)
def test_a_bad_choice_is_refused_before_any_boot(args, needle):
    with pytest.raises(SystemExit) as info:
        ap.main([*args, "--out", "/dev/null"])
    assert needle in str(info.value)
