"""Unit tests of the capacity planner against arithmetic and the measured H200 figures.

The H200 figures were measured on the host described in scripts/gpu/README.md: a
Llama-3-8B-shaped model, vLLM 0.26, ``LLM()`` (max_num_batched_tokens 16384), max_model_len
8192, gpu_memory_utilization 0.90 of 139.8 GiB. Those runs and issue 14's Llama-3-70B runs were
planned and measured without CUDA graphs (``enforce_eager``). The non-torch overhead is the figure vLLM
logs for it (0.22 GiB on every H200 boot at TP 1). Production boots (graphs on, issue 25's rows of
benchmarks/results/capacity/h200_shapes.json) are the ``*_graphs_on`` tests.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from quantize_serve.capacity.plan_table import format_table, plan_table
from quantize_serve.capacity.planner import (
    CUDAGRAPH_ESTIMATE_BYTES_PER_LAYER,
    CUDAGRAPH_ESTIMATE_FIXED_BYTES,
    CUDAGRAPH_POOL_BYTES_PER_LAYER,
    FP8_KV_LOAD_BYTES,
    RECOMMENDED_SEQS_FRACTION,
    CapacityPlan,
    GiB,
    ModelShape,
    activation_peak_bytes,
    compiled_pass_peak_bytes,
    kv_bytes_per_token,
    plan_capacity,
    vllm_model_runner,
    weight_breakdown,
    weight_bytes,
)
from quantize_serve.capacity.weights import allocator_rounding_bytes
from quantize_serve.core.errors import RecipeError, RecipeErrors
from quantize_serve.recipe.inputs import check_model_config
from quantize_serve.recipe.load import load_recipe
from tests.conftest import ROOT

CONFIGS = ROOT / "benchmarks" / "configs"
H200 = 139.8 * GiB
GPU_80GB = 79.6 * GiB

# Measured on the H200 with LLM() at max_num_batched_tokens 16384 (README table).
MEASURED_TOKENS = {"base": 892_240, "w4a16": 971_472, "w4a16-fp8kv": 1_942_448}


@pytest.fixture(scope="module")
def llama8b() -> ModelShape:
    return ModelShape.from_config(CONFIGS / "llama-3-8b.json")


@pytest.fixture(scope="module")
def llama70b() -> ModelShape:
    return ModelShape.from_config(CONFIGS / "llama-3-70b.json")


def test_config_parsing(llama8b: ModelShape, llama70b: ModelShape) -> None:
    assert (llama8b.num_layers, llama8b.num_heads, llama8b.num_kv_heads, llama8b.head_dim) == (32, 32, 8, 128)
    assert (llama8b.hidden_size, llama8b.intermediate_size, llama8b.vocab_size) == (4096, 14336, 128256)
    assert llama8b.dtype == "bfloat16" and llama8b.dtype_bytes == 2
    assert not llama8b.tie_word_embeddings and llama8b.max_position_embeddings == 8192
    assert llama8b.num_parameters() == 8_030_261_248  # the published 8.03 B
    assert (llama70b.num_layers, llama70b.hidden_size, llama70b.head_dim) == (80, 8192, 128)
    assert round(llama70b.num_parameters() / 1e9, 1) == 70.6


def test_from_config_variants(tmp_path: Path) -> None:
    base = json.loads((CONFIGS / "llama-3-8b.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(base))
    assert ModelShape.from_config(tmp_path) == ModelShape.from_config(base)  # folder or dict
    explicit = {**base, "head_dim": 64, "dtype": "float16"}
    explicit.pop("torch_dtype")
    shape = ModelShape.from_config(explicit)
    assert shape.head_dim == 64 and shape.dtype == "float16"
    nested = {
        "text_config": {k: v for k, v in base.items() if k != "tie_word_embeddings"},
        "tie_word_embeddings": True,
    }
    assert ModelShape.from_config(nested).tie_word_embeddings is True


def test_kv_bytes_per_token_8b(llama8b: ModelShape) -> None:
    assert kv_bytes_per_token(llama8b, kv_cache_dtype="auto") == 131_072
    for fp8 in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        assert kv_bytes_per_token(llama8b, kv_cache_dtype=fp8) == 65_536


def test_weight_bytes_8b_match_h200(llama8b: ModelShape) -> None:
    bf16 = weight_bytes(llama8b, scheme="bf16") / GiB
    w4 = weight_bytes(llama8b, scheme="W4A16") / GiB
    assert bf16 == pytest.approx(14.96, rel=0.02)
    assert w4 == pytest.approx(5.32, rel=0.02)
    # The W4A16 checkpoint measured 5.70 GB on disk.
    assert weight_bytes(llama8b, scheme="W4A16") / 1e9 == pytest.approx(5.70, rel=0.01)


def test_asym_adds_packed_zero_points() -> None:
    # One layer, every Linear 256 -> 256, group 128: zero points are int32
    # [ceil(out/8), in/group] = [32, 2] -> 256 bytes per Linear.
    tiny = ModelShape(
        num_layers=1,
        num_heads=4,
        num_kv_heads=4,
        head_dim=64,
        hidden_size=256,
        intermediate_size=256,
        vocab_size=1000,
        max_position_embeddings=128,
    )
    sym = weight_bytes(tiny, scheme="W4A16")
    asym = weight_bytes(tiny, scheme="W4A16_ASYM")
    assert asym - sym == 7 * 32 * 2 * 4
    # 16-bit parts: embeddings + lm_head + 3 norms; each Linear: packed 256x32 int32,
    # scales 256x2 bf16, weight_shape 2 int32.
    assert sym == 2 * 1000 * 256 * 2 + 3 * 256 * 2 + 7 * (256 * 32 * 4 + 256 * 2 * 2 + 8)
    # ignore keeps a Linear 16-bit
    assert weight_bytes(tiny, scheme="W4A16", ignore=("lm_head", "down_proj")) - sym == (
        256 * 256 * 2 - (256 * 32 * 4 + 256 * 2 * 2 + 8)
    )


def test_tied_embeddings_counted_once(llama8b: ModelShape) -> None:
    tied = llama8b.model_copy(update={"tie_word_embeddings": True})
    embed = llama8b.vocab_size * llama8b.hidden_size
    assert llama8b.num_parameters() - tied.num_parameters() == embed
    assert weight_bytes(llama8b, scheme="bf16") - weight_bytes(tied, scheme="bf16") == 2 * embed
    # Quantized: the tied head is the (16-bit) embedding, stored once.
    assert weight_bytes(llama8b, scheme="W4A16") - weight_bytes(tied, scheme="W4A16") == 2 * embed


def test_activation_model_calibration(llama8b: ModelShape) -> None:
    # README: 0.84 GiB at 8192 (OpenAI server), 1.72 GiB at 16384 (LLM()).
    assert activation_peak_bytes(llama8b, max_num_batched_tokens=8192) / GiB == pytest.approx(0.84, abs=0.02)
    assert activation_peak_bytes(llama8b, max_num_batched_tokens=16384) / GiB == pytest.approx(1.72, abs=0.05)


@pytest.mark.parametrize("name", list(MEASURED_TOKENS))
def test_h200_tokens_gpu_mode_8192(llama8b: ModelShape, name: str) -> None:
    """gpu mode at max_num_batched_tokens 8192 (the OpenAI server's default) compared with
    the README's figures, which were taken with LLM() at 16384. The server's smaller
    activation peak leaves ~0.85 GiB more KV room, so the planner is expected to be about
    0.8 % above these figures; the brief's tolerance is 3 %."""
    table = plan_table(
        llama8b,
        device_memory_bytes=H200,
        gpu_memory_utilization=0.90,
        max_model_len=8192,
        max_num_batched_tokens=8192,
        enforce_eager=True,
    )
    tokens = table.rows[name].kv_cache_tokens
    assert tokens == pytest.approx(MEASURED_TOKENS[name], rel=0.03)
    assert tokens > MEASURED_TOKENS[name]  # more room than LLM() at 16384, as the README says


@pytest.mark.parametrize("name", list(MEASURED_TOKENS))
def test_h200_tokens_like_for_like_16384(llama8b: ModelShape, name: str) -> None:
    """Same entry point settings as the measurement (max_num_batched_tokens 16384)."""
    table = plan_table(
        llama8b,
        device_memory_bytes=H200,
        gpu_memory_utilization=0.90,
        max_model_len=8192,
        max_num_batched_tokens=16384,
        enforce_eager=True,
    )
    row = table.rows[name]
    assert row.kv_cache_tokens == pytest.approx(MEASURED_TOKENS[name], rel=0.005)
    assert row.max_concurrency == pytest.approx(MEASURED_TOKENS[name] / 8192, rel=0.005)
    assert row.kv_cache_tokens == row.num_blocks * row.block_size


def test_fp8_doubles_tokens_in_fixed_budget(llama8b: ModelShape) -> None:
    budget = 40 * GiB
    auto = plan_capacity(
        llama8b,
        scheme="W4A16",
        kv_cache_dtype="auto",
        device_memory_bytes=budget,
        gpu_memory_utilization=1.0,
        max_model_len=8192,
        mode="fixed_budget",
    )
    fp8 = plan_capacity(
        llama8b,
        scheme="W4A16",
        kv_cache_dtype="fp8",
        device_memory_bytes=budget,
        gpu_memory_utilization=1.0,
        max_model_len=8192,
        mode="fixed_budget",
    )
    # KV = budget - weights exactly, no activation/overhead terms.
    assert auto.kv_cache_memory_bytes == budget - weight_bytes(llama8b, scheme="W4A16")
    assert auto.activation_bytes == auto.overhead_bytes == 0
    assert fp8.kv_cache_memory_bytes == auto.kv_cache_memory_bytes
    # Double, up to the rounding of the last block.
    assert fp8.kv_cache_tokens - 2 * auto.kv_cache_tokens in (0, auto.block_size)


def test_too_small_budget_names_largest_max_model_len(llama8b: ModelShape) -> None:
    weights = weight_bytes(llama8b, scheme="bf16")
    budget = weights + 4096 * 131_072 + 1000  # room for exactly 4,096 tokens
    plan = plan_capacity(
        llama8b,
        scheme="bf16",
        kv_cache_dtype="auto",
        device_memory_bytes=budget,
        gpu_memory_utilization=1.0,
        max_model_len=8192,
        mode="fixed_budget",
    )
    assert not plan.fits
    assert plan.kv_cache_tokens == plan.largest_max_model_len == 4096
    assert plan.reason is not None and "4,096" in plan.reason and "max_model_len" in plan.reason
    assert plan.recommended_max_num_seqs == 0
    ok = plan_capacity(
        llama8b,
        scheme="bf16",
        kv_cache_dtype="auto",
        device_memory_bytes=budget,
        gpu_memory_utilization=1.0,
        max_model_len=4096,
        mode="fixed_budget",
    )
    assert ok.fits and ok.reason is None and ok.recommended_max_num_seqs == 1


def test_70b_bf16_does_not_fit_one_80gb(llama70b: ModelShape) -> None:
    table = plan_table(
        llama70b, device_memory_bytes=GPU_80GB, gpu_memory_utilization=0.90, max_model_len=8192
    )
    base = table.rows["base"]
    assert not base.fits and base.kv_cache_tokens == 0
    assert base.reason is not None and "largest max_model_len that fits: 0" in base.reason
    assert table.rows["w4a16"].fits and table.rows["w4a16-fp8kv"].fits
    assert table.gains["w4a16"].kv_tokens_ratio is None
    tp2 = plan_table(llama70b, device_memory_bytes=GPU_80GB, max_model_len=8192, tensor_parallel_size=2)
    assert tp2.rows["base"].fits
    assert tp2.rows["base"].weights_bytes == math.ceil(tp2.rows["base"].total_weights_bytes / 2)
    assert tp2.rows["base"].kv_bytes_per_token_per_gpu == tp2.rows["base"].kv_bytes_per_token // 2


# Llama-3-70B shape on nvidia-h200-x2 (issue 14's table): vLLM 0.26.0, load_format dummy, max_model_len
# 8192, gpu_memory_utilization 0.90 of 150,109,880,320 B, enforce_eager, max_num_batched_tokens 8192.
# (scheme, KV dtype, TP) -> measured KV tokens.
MEASURED_70B = {
    ("bf16", "auto", 2): 386_544,
    ("W4A16", "auto", 1): 285_440,
    ("W4A16", "fp8", 1): 570_672,
    ("W4A16", "fp8", 2): 1_392_896,
}


@pytest.mark.parametrize("scheme, kv, tp", list(MEASURED_70B))
def test_70b_on_h200s_within_0_1_percent(llama70b: ModelShape, scheme: str, kv: str, tp: int) -> None:
    plan = plan_capacity(
        llama70b,
        scheme=scheme,
        kv_cache_dtype=kv,
        device_memory_bytes=150_109_880_320,
        gpu_memory_utilization=0.90,
        max_model_len=8192,
        max_num_batched_tokens=8192,
        tensor_parallel_size=tp,
        enforce_eager=True,
    )
    measured = MEASURED_70B[scheme, kv, tp]
    assert abs(plan.kv_cache_tokens - measured) / measured <= 0.001, (plan.kv_cache_tokens, measured)


def test_70b_bf16_on_one_h200_is_refused_like_vllm(llama70b: ModelShape) -> None:
    """vLLM: "No available memory for the cache blocks" with KV at -7.54 GiB."""
    plan = plan_capacity(
        llama70b,
        scheme="bf16",
        kv_cache_dtype="auto",
        device_memory_bytes=150_109_880_320,
        gpu_memory_utilization=0.90,
        max_model_len=8192,
        max_num_batched_tokens=8192,
        enforce_eager=True,
    )
    # 0.04 GiB short of vLLM's figure: the bf16 70B's weights or eager peak, 0.03 % of the budget
    assert not plan.fits and plan.kv_cache_memory_bytes / GiB == pytest.approx(-7.54, abs=0.05)
    assert plan.reason is not None and "131.42 GiB/GPU" in plan.reason and "125.82 GiB budget" in plan.reason


def test_a_row_that_does_not_fit_says_at_which_tp_it_would(llama70b: ModelShape) -> None:
    table = plan_table(llama70b, device_memory_bytes=150_109_880_320, max_model_len=8192, model="Llama-3-70B")
    assert table.fits_at_tp == {"base": 2}  # 131.42 GiB of bf16 weights: two H200s, not one
    text = format_table(table)
    assert "- base does not fit at TP 1: weights 131.42 GiB/GPU" in text and "; fits at TP 2" in text
    tp2 = plan_table(
        llama70b, device_memory_bytes=150_109_880_320, max_model_len=8192, tensor_parallel_size=2
    )
    assert tp2.fits_at_tp == {} and all(r.fits for r in tp2.rows.values())
    tiny_gpu = plan_table(llama70b, device_memory_bytes=8 * GiB, max_model_len=8192)
    assert tiny_gpu.fits_at_tp["base"] is None and "fits at no TP up to 8" in format_table(tiny_gpu)


def test_recommended_max_num_seqs_and_gains(llama8b: ModelShape) -> None:
    table = plan_table(llama8b, device_memory_bytes=H200, max_model_len=8192, enforce_eager=True)
    # Requests of 8192 tokens that fit, and 90 % of that rounded down, by hand:
    #   base         899,456 tokens / 8192 = 109.80 -> 0.9 x 109.80 =  98.82 ->  98
    #   w4a16        978,496 tokens / 8192 = 119.45 -> 0.9 x 119.45 = 107.50 -> 107
    #   w4a16-fp8kv 1,956,496 tokens / 8192 = 238.83 -> 0.9 x 238.83 = 214.95 -> 214
    assert {
        name: (row.kv_cache_tokens, row.recommended_max_num_seqs) for name, row in table.rows.items()
    } == {"base": (899_456, 98), "w4a16": (978_496, 107), "w4a16-fp8kv": (1_956_496, 214)}
    assert RECOMMENDED_SEQS_FRACTION == 0.9
    # Weights by hand (hidden 4096, intermediate 14336, 32 layers, 8 KV heads of 128, vocab 128256):
    #   Linear params per layer: q,o 2 x 4096x4096 + k,v 2 x 1024x4096 + gate,up,down 3 x 14336x4096
    #     = 218,103,808; x 32 layers = 6,979,321,856
    #   the rest (16-bit): embeddings + LM head 2 x 128256x4096 = 1,050,673,152; norms 65 x 4096 = 266,240
    #   bf16: 8,030,261,248 params x 2 B = 16,060,522,496 B
    #   W4A16: Linear at 4 bits 3,489,660,928 + a 2 B scale per 128 inputs 109,051,904 + weight_shape
    #     224 Linears x 8 B = 1,792 + the rest at 2 B 2,101,878,784 = 5,700,593,408 B
    assert table.rows["base"].weights_bytes == 16_060_522_496
    assert table.rows["w4a16"].weights_bytes == 5_700_593_408
    assert table.freed_weight_bytes == 16_060_522_496 - 5_700_593_408 == 10_359_929_088
    assert table.freed_weight_bytes / GiB == pytest.approx(14.96 - 5.32, rel=0.02)
    w4, fp8 = table.gains["w4a16"], table.gains["w4a16-fp8kv"]
    assert w4.kv_tokens_ratio is not None and fp8.kv_tokens_ratio is not None
    assert 1.0 < w4.kv_tokens_ratio < fp8.kv_tokens_ratio
    assert fp8.kv_tokens_ratio == pytest.approx(
        2 * w4.kv_tokens_ratio, rel=5e-4
    )  # less the fp8 KV's 32 MiB load


def test_format_table(llama8b: ModelShape) -> None:
    text = format_table(
        plan_table(
            llama8b,
            device_memory_bytes=H200,
            max_model_len=8192,
            max_num_batched_tokens=16384,
            model="Llama-3-8B",
            enforce_eager=True,
        )
    )
    for needle in ("| base |", "| w4a16 |", "| w4a16-fp8kv |", "14.96", "892,544", "Freed by quantization"):
        assert needle in text


def test_plan_script_writes_json(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("plan_script", ROOT / "benchmarks" / "plan.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "plan.json"
    assert module.main(["--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert {d["model"] for d in data} == {"Llama-3-8B", "Llama-3-70B"}
    assert all(set(d["rows"]) == {"base", "w4a16", "w4a16-fp8kv"} for d in data)


# --------------------------------------------------------------------------------------------
# Mixtures of experts, Qwen2, CUDA graphs, and the configs the planner refuses (issue 25)
# --------------------------------------------------------------------------------------------

FIXTURES = ROOT / "tests" / "fixtures" / "configs"  # public configs' values, written by hand
PLANNABLE = ("qwen3-30b-a3b", "mixtral-8x7b", "qwen2-72b", "qwen1.5-moe-a2.7b")
H200_CUDA = 150_109_880_320  # what CUDA reports on the lent H200 (issue 25's rows were taken on it)
MiB = 2**20


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def h200_plan(shape: ModelShape, scheme: str, kv: str, **settings) -> CapacityPlan:
    """Issue 25's settings: one H200, max_model_len 8192, gpu_memory_utilization 0.90, max_num_batched_tokens
    8192, TP 1, CUDA graphs on unless enforce_eager is given."""
    return plan_capacity(
        shape,
        scheme=scheme,
        kv_cache_dtype=kv,
        device_memory_bytes=H200_CUDA,
        gpu_memory_utilization=0.90,
        max_model_len=8192,
        max_num_batched_tokens=8192,
        **settings,
    )


def transformers_parameter_count(config: dict) -> int:
    """What transformers' own model of this config holds, built on the meta device (no memory)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.AutoConfig.for_model(
        config["model_type"], **{k: v for k, v in config.items() if k != "model_type"}
    )
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", PLANNABLE)
def test_parameter_counts_are_transformers_own(name: str) -> None:
    """Every tensor counted once, experts, routers, shared experts, q/k norms and Qwen2's biases included."""
    config = fixture(name)
    assert ModelShape.from_config(config).num_parameters() == transformers_parameter_count(config)


def test_sparse_layers_follow_decoder_sparse_step_and_mlp_only_layers() -> None:
    """Layer i routes to experts when it is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0,
    as transformers builds it; the other layers get a dense MLP of intermediate_size."""
    small = {
        **fixture("qwen3-30b-a3b"),
        "num_hidden_layers": 6,
        "hidden_size": 64,
        "intermediate_size": 96,
        "moe_intermediate_size": 32,
        "head_dim": 16,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "vocab_size": 100,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
    }
    shape = ModelShape.from_config(small)
    assert (shape.num_moe_layers, shape.num_dense_layers) == (2, 4)  # layers 1 and 5 (3 is dense)
    assert shape.num_parameters() == transformers_parameter_count(small)
    dense_only = ModelShape.from_config({**small, "num_experts": 0})  # no experts: a dense Qwen3
    assert not dense_only.is_moe and dense_only.num_parameters() == dense_only.num_active_parameters()


def test_total_and_active_parameters() -> None:
    """The published totals and activated counts (embeddings and LM head included, as published)."""
    counts = {
        name: (round(s.num_parameters() / 1e9, 2), round(s.num_active_parameters() / 1e9, 2))
        for name in PLANNABLE
        for s in [ModelShape.from_config(fixture(name))]
    }
    assert counts == {
        "qwen3-30b-a3b": (30.53, 3.35),  # "30.5B, 3.3B activated"
        "mixtral-8x7b": (46.70, 12.88),  # "46.7B, 12.9B active"
        "qwen2-72b": (72.71, 72.71),  # dense
        "qwen1.5-moe-a2.7b": (14.32, 2.69),
    }  # "14.3B, 2.7B activated", a shared expert each layer
    qwen3 = ModelShape.from_config(fixture("qwen3-30b-a3b"))
    # By hand, per layer: attention 4096x2048 + 2 x 512x2048 + 2048x4096 = 18,874,368; router 128 x 2048;
    # norms 2 x 2048 + q/k norms 2 x 128; 8 of 128 experts of 3 x 768 x 2048. Plus 2 x 151936 x 2048 and
    # the final norm.
    per_layer = 18_874_368 + 128 * 2048 + 2 * 2048 + 2 * 128
    assert qwen3.num_active_parameters() == 48 * (per_layer + 8 * 3 * 768 * 2048) + 2 * 151_936 * 2048 + 2048


def test_expert_bytes_per_format_by_hand() -> None:
    """Qwen3-30B-A3B's 48 x 128 experts, each gate/up 768x2048 and down 2048x768 (group 128):
    W4A16: packed int32 out x in/8, a 16-bit scale per group, int32 weight_shape[2]; W8A8 and FP8: a byte
    per weight and a 4-byte scale per output channel; bf16: 2 bytes. The router stays 16-bit in every
    format."""
    shape = ModelShape.from_config(fixture("qwen3-30b-a3b"))
    gate_or_up = 768 * 256 * 4 + 768 * 16 * 2 + 8
    down = 2048 * 96 * 4 + 2048 * 6 * 2 + 8
    w4 = weight_breakdown(shape, scheme="W4A16")
    assert w4.routed_experts == 48 * 128 * (2 * gate_or_up + down) == 14_948_646_912
    assert weight_breakdown(shape, scheme="bf16").routed_experts == 48 * 128 * 3 * 768 * 2048 * 2
    for eight_bit in ("W8A8", "FP8_DYNAMIC"):
        parts = weight_breakdown(shape, scheme=eight_bit)
        assert parts.routed_experts == 48 * 128 * (2 * (768 * 2048 + 768 * 4) + 2048 * 768 + 2048 * 4)
    for scheme in ("bf16", "W4A16", "W8A8"):
        parts = weight_breakdown(shape, scheme=scheme)
        assert parts.router == 48 * 128 * 2048 * 2 and parts.shared_experts == 0 and parts.dense_mlp == 0
        assert parts.total == weight_bytes(shape, scheme=scheme)
    # ignore keeps experts 16-bit: all of them, or one Linear of every expert
    assert weight_breakdown(shape, scheme="W4A16", ignore=("lm_head", "experts")).routed_experts == (
        weight_breakdown(shape, scheme="bf16").routed_experts
    )
    assert weight_breakdown(shape, scheme="W4A16", ignore=("lm_head", "down_proj")).routed_experts == (
        48 * 128 * (2 * gate_or_up + 2048 * 768 * 2)
    )
    shared = ModelShape.from_config(fixture("qwen1.5-moe-a2.7b"))  # a shared expert of 5632 and its gate
    parts = weight_breakdown(shared, scheme="W4A16")
    gate_or_up, down = 5632 * 256 * 4 + 5632 * 16 * 2 + 8, 2048 * 704 * 4 + 2048 * 44 * 2 + 8
    assert parts.shared_experts == 24 * (2 * gate_or_up + down)
    assert parts.router == 24 * (60 + 1) * 2048 * 2


# Weights measured on one H200 (issue 25; vLLM 0.26, "Model loading took", dummy weights, TP 1):
# (fixture, scheme, KV dtype) -> GiB as vLLM prints it (2 decimals).
MEASURED_WEIGHTS_GIB = {
    ("qwen3-30b-a3b", "bf16", "auto"): 56.88,
    ("qwen3-30b-a3b", "W4A16", "auto"): 15.55,
    ("qwen3-30b-a3b", "W4A16", "fp8"): 15.59,
    ("qwen2-72b", "W4A16", "auto"): 38.53,
    ("qwen2-72b", "W4A16", "fp8"): 38.56,
}


@pytest.mark.parametrize("name, scheme, kv", list(MEASURED_WEIGHTS_GIB))
def test_weights_match_the_h200(name: str, scheme: str, kv: str) -> None:
    """Tolerances, and why:
    - 0.02 GiB (16-bit KV rows): vLLM prints 2 decimals (+-0.005), and the Llama-3 rows measured before
      (8B 5.32 against 5.31, 70B 36.80 against 36.79) show ~0.01 GiB more than the tensors, not modelled.
    - +0.05 GiB more for the fp8-KV rows: every shape measured so far loads 0.03-0.04 GiB more with an fp8 KV
      cache than the same weights with a 16-bit one (Llama-3-8B 5.83/5.86, Llama-3-70B 36.80/36.83, these
      15.55/15.59 and 38.53/38.56): vLLM's, not the model's.
    - Qwen2-72B, 0.06 GiB more: its int4 gate_up (231 MiB) and down (115.5 MiB) tensors leave 1 and 0.5 MiB of
      their 2 MiB-rounded allocator segments, 0.117 GiB the planner adds (allocator_rounding_bytes); about
      0.05 GiB stays unexplained (its 1-10 MiB scale tensors share 20 MiB segments, which is not modelled).
      Before issue 25 the planner was 0.17-0.20 GiB under; its parameter count is transformers' own
      (above)."""
    plan = h200_plan(ModelShape.from_config(fixture(name)), scheme, kv)
    tolerance = 0.02 + (0.05 if kv == "fp8" else 0) + (0.06 if name == "qwen2-72b" else 0)
    measured = MEASURED_WEIGHTS_GIB[name, scheme, kv]
    assert plan.weights_bytes / GiB == pytest.approx(measured, abs=tolerance)
    assert plan.weights_bytes / GiB <= measured + 0.005  # never above what vLLM counted


def test_qwen2_biases_vocabulary_and_allocator_rounding() -> None:
    qwen2 = ModelShape.from_config(fixture("qwen2-72b"))
    assert qwen2.qkv_bias and not qwen2.attention_bias  # q/k/v biased, o_proj not (vLLM and transformers)
    assert qwen2.bias_elements_per_layer() == 8192 + 1024 + 1024
    assert (qwen2.vocab_size, qwen2.tie_word_embeddings) == (152_064, False)
    parts = weight_breakdown(qwen2, scheme="W4A16")
    assert parts.embeddings == parts.lm_head == 152_064 * 8192 * 2  # both 16-bit, untied
    assert parts.norms_and_biases == (80 * (2 * 8192 + 10_240) + 8192) * 2
    # int4 gate_up 59136 x 8192/8 int32 = 231 MiB and down 8192 x 29568/8 int32 = 115.5 MiB per layer
    assert allocator_rounding_bytes(qwen2, scheme="W4A16") == 80 * (MiB + MiB // 2)
    assert allocator_rounding_bytes(qwen2, scheme="bf16") == 0  # 924 and 462 MiB: whole 2 MiB multiples
    for llama in ("llama-3-8b", "llama-3-70b"):  # nothing for Llama-3 at TP 1, as measured
        shape = ModelShape.from_config(CONFIGS / f"{llama}.json")
        assert all(allocator_rounding_bytes(shape, scheme=s) == 0 for s in ("bf16", "W4A16"))
    fixed = plan_capacity(
        qwen2,
        scheme="W4A16",
        kv_cache_dtype="fp8",
        device_memory_bytes=60 * GiB,
        gpu_memory_utilization=1.0,
        max_model_len=8192,
        mode="fixed_budget",
    )
    assert fixed.weights_bytes == fixed.total_weights_bytes  # CPU runs: the checkpoint's bytes, no allocator
    llama_style = qwen2.model_copy(update={"qkv_bias": False, "attention_bias": True})
    assert llama_style.bias_elements_per_layer() == 8192 + 1024 + 1024 + 8192  # attention_bias: o too


# Issue 25's KV tokens on one H200 in production settings (benchmarks/results/capacity/h200_shapes.json: vLLM
# 0.26.0,
# graphs on, max_num_seqs 256, max_num_batched_tokens 8192, dummy weights); the 8B figures repeat
# h200_schemes.json's to the token.
MEASURED_GRAPHS_ON = {
    ("llama-3-8b", "bf16", "auto"): 897_280,
    ("llama-3-8b", "W4A16", "auto"): 976_256,
    ("llama-3-8b", "W4A16", "fp8"): 1_952_016,
    ("llama-3-70b", "W4A16", "auto"): 283_728,
    ("llama-3-70b", "W4A16", "fp8"): 567_264,
}


def shape_of(name: str) -> ModelShape:
    path = CONFIGS / f"{name}.json" if name.startswith("llama") else FIXTURES / f"{name}.json"
    return ModelShape.from_config(path)


@pytest.mark.parametrize("name, scheme, kv", list(MEASURED_GRAPHS_ON))
def test_llama_graphs_on_within_0_1_percent(name: str, scheme: str, kv: str) -> None:
    """Production settings: no CUDA-graph estimate taken from the budget (vLLM 0.26 logged none), the compiled
    pass's peak (derived from the 4-layer variants, not fitted on these rows), vLLM's own non-torch figure and
    the fp8-KV load (+0.007 to +0.020 % today)."""
    plan = h200_plan(shape_of(name), scheme, kv)
    assert (plan.cudagraph_source, plan.cudagraph_bytes) == ("none", 0)
    measured = MEASURED_GRAPHS_ON[name, scheme, kv]
    assert abs(plan.kv_cache_tokens - measured) / measured <= 0.001, (plan.kv_cache_tokens, measured)


def test_graphs_on_is_a_compiled_activation_peak_and_a_pool_outside_the_budget(llama8b: ModelShape) -> None:
    """What vLLM 0.26 logged on the H200: graphs on raise the profiled activation peak (torch.compile; 8B 1.11
    against 0.84 GiB, 70B 2.21 against 1.69) to one vocabulary x hidden tensor and two batched-token x hidden
    ones, and take nothing else from the KV budget: the graph pool is captured after the KV cache. A vLLM that
    logs an estimate ("CUDA graph pool memory ... (estimated)") has it taken."""
    eager = h200_plan(llama8b, "W4A16", "fp8", enforce_eager=True)
    graphs = h200_plan(llama8b, "W4A16", "fp8")
    assert (eager.cudagraph_source, eager.cudagraph_pool_bytes) == ("off", 0)
    assert (
        graphs.activation_bytes
        == compiled_pass_peak_bytes(llama8b, max_num_batched_tokens=8192)
        == (128_256 * 4096 + 2 * 8192 * 4096) * 2
    )
    extra = graphs.activation_bytes - eager.activation_bytes
    assert graphs.activation_bytes / GiB == pytest.approx(1.11, abs=0.01)
    assert eager.kv_cache_memory_bytes - graphs.kv_cache_memory_bytes == extra
    assert graphs.cudagraph_pool_bytes == 32 * CUDAGRAPH_POOL_BYTES_PER_LAYER  # ~0.6 GiB, as measured
    assert not any("CUDA graphs" in n for n in graphs.notes)  # 14 GiB above the budget hold the pool
    llama70b = shape_of("llama-3-70b")
    assert h200_plan(llama70b, "W4A16", "fp8").activation_bytes / GiB == pytest.approx(2.21, abs=0.01)
    tight = plan_capacity(
        llama70b,
        scheme="W4A16",
        kv_cache_dtype="fp8",
        device_memory_bytes=H200,
        gpu_memory_utilization=0.995,
        max_model_len=8192,
    )
    assert any("graph pool" in n and "may not fit" in n for n in tight.notes), tight.notes
    given = h200_plan(llama8b, "W4A16", "fp8", cudagraph_memory_bytes=int(0.5 * GiB))
    assert (given.cudagraph_bytes, given.cudagraph_source) == (int(0.5 * GiB), "given")
    assert given.kv_cache_memory_bytes == graphs.kv_cache_memory_bytes - int(0.5 * GiB)
    assert any("as given" in n for n in given.notes)
    fixed = plan_capacity(
        llama8b,
        scheme="W4A16",
        kv_cache_dtype="fp8",
        device_memory_bytes=60 * GiB,
        gpu_memory_utilization=1.0,
        max_model_len=8192,
        mode="fixed_budget",
    )
    assert (fixed.cudagraph_bytes, fixed.cudagraph_source, fixed.activation_bytes) == (0, "off", 0)
    assert fixed.weights_bytes == fixed.total_weights_bytes  # no fp8-KV load term on a fixed budget (CPU)
    assert graphs.weights_bytes - h200_plan(llama8b, "W4A16", "auto").weights_bytes == FP8_KV_LOAD_BYTES


@pytest.mark.parametrize(
    "kv, eager, measured",
    [("auto", False, 276_880), ("fp8", False, 553_552), ("fp8", True, 558_256), ("auto", True, 279_232)],
)
def test_qwen2_72b_graphs_on_within_0_1_percent_eager_high_and_says_so(
    kv: str, eager: bool, measured: int
) -> None:
    """Qwen2-72B W4A16 on one H200 (issue 25). With graphs on, its compiled peak (2.57 GiB) is the compiled
    pass's term for its vocabulary (152,064), which Llama's calibration had missed (+0.42 % before): within
    0.1 % now (+0.064 %, the 0.05 GiB of weights above its tensors). Eager, its peak is 0.12 GiB above the
    model, not explained: 0.21 % high, and the eager plan says so."""
    plan = h200_plan(shape_of("qwen2-72b"), "W4A16", kv, enforce_eager=eager)
    err = (plan.kv_cache_tokens - measured) / measured
    assert 0 < err < (0.001 if not eager else 0.0025), err
    assert any(n.startswith("Qwen2, eager:") for n in plan.notes) == eager
    if not eager:
        assert plan.activation_bytes / GiB == pytest.approx(2.57, abs=0.005)


# vLLM's "peak activation" (GiB) of 4-layer variants of a shape on the H200 (W4A16, graphs on, 8,192 batched
# tokens; benchmarks/results/capacity/h200_activation_peak.json): (shape, config keys overridden) -> GiB.
MEASURED_VARIANT_PEAKS = [
    ("qwen2-72b", {}, 2.57),
    ("qwen2-72b", {"intermediate_size": 28672}, 2.57),
    ("qwen2-72b", {"vocab_size": 128256}, 2.21),
    ("llama-3-70b", {}, 2.21),
]


@pytest.mark.parametrize("name, overrides, peak", MEASURED_VARIANT_PEAKS)
def test_the_compiled_peak_follows_the_vocabulary_not_the_mlp(
    name: str, overrides: dict, peak: float
) -> None:
    """The variants that located Qwen2's 0.36 GiB: Llama's intermediate size leaves its peak as it is, Llama's
    vocabulary brings it to Llama's; the planner's compiled term follows both (and depth, 4 layers or 80, does
    not enter it)."""
    config = {
        **json.loads(
            (CONFIGS / f"{name}.json" if name.startswith("llama") else FIXTURES / f"{name}.json").read_text()
        ),
        **overrides,
        "num_hidden_layers": 4,
    }
    shape = ModelShape.from_config(config, source=name)
    act = activation_peak_bytes(shape, max_num_batched_tokens=8192, compiled=True)
    assert act / GiB == pytest.approx(peak, abs=0.006)
    assert act == activation_peak_bytes(
        shape.model_copy(update={"num_layers": 80}), max_num_batched_tokens=8192, compiled=True
    )


def test_mixtral_out_of_sample() -> None:
    """Mixtral-8x7B (4 layers, W4A16, graphs on) was booted to test the sparse compiled term calibrated on
    Qwen3-30B-A3B: vLLM logged 1.78 GiB, the planner has 1.825 (within 0.05 GiB). The same boot refuted a
    per-layer-only graph estimate (0.26 GiB logged against 0.04): the estimate has a fixed part, now
    calibrated on both MoE shapes, so it gives the boot's 0.26 GiB by construction."""
    shape = ModelShape.from_config(
        {**json.loads((FIXTURES / "mixtral-8x7b.json").read_text()), "num_hidden_layers": 4},
        source="mixtral-8x7b",
    )
    act = activation_peak_bytes(shape, max_num_batched_tokens=8192, compiled=True)
    assert abs(act / GiB - 1.78) < 0.05
    assert h200_plan(shape, "W4A16", "auto").cudagraph_bytes / GiB == pytest.approx(0.26, abs=0.005)


@pytest.mark.parametrize(
    "scheme, kv, measured, was",
    [
        ("bf16", "auto", 732_496, 1_299_504),
        ("W4A16", "auto", 1_183_088, 1_340_544),
        ("W4A16", "fp8", 2_365_536, 2_681_088),
    ],
)
def test_moe_is_planned_as_an_moe(scheme: str, kv: str, measured: int, was: int) -> None:
    """Qwen3-30B-A3B on one H200 (issue 25, graphs on). Planned as a dense model it was +13% to +77%. Now
    within 0.1%, but these rows calibrated the sparse layer's compiled extra
    (COMPILED_EXTRA_PER_ROUTED_HIDDEN) and, with Mixtral-8x7B, the V1 runner's graph estimate, so they do not
    test those; what they test is everything else (weights, experts, KV bytes, which runner takes an
    estimate)."""
    plan = h200_plan(shape_of("qwen3-30b-a3b"), scheme, kv)
    assert abs(plan.kv_cache_tokens - measured) / measured < 0.001, (plan.kv_cache_tokens, measured)
    assert plan.activation_bytes / GiB == pytest.approx(
        1.15, abs=0.005
    )  # vLLM's "peak activation", all three
    assert plan.cudagraph_source == "modelled"
    assert plan.cudagraph_bytes == CUDAGRAPH_ESTIMATE_FIXED_BYTES + 48 * CUDAGRAPH_ESTIMATE_BYTES_PER_LAYER
    assert plan.cudagraph_bytes / GiB == pytest.approx(0.56, abs=0.005)  # what vLLM logged for W4A16
    assert any("calibrated on Qwen3-30B-A3B" in n for n in plan.notes)
    assert abs(plan.kv_cache_tokens - measured) < abs(was - measured) / 10
    assert (plan.total_parameters, plan.active_parameters) == (30_532_122_624, 3_353_032_704)
    assert (
        plan.weights is not None and plan.weights.experts / plan.total_weights_bytes > 0.85
    )  # experts dominate


@pytest.mark.parametrize(
    "name, architecture, runner",
    [
        ("llama-3-70b", None, "v2"),
        ("qwen2-72b", None, "v2"),
        ("qwen3-30b-a3b", None, "v1"),
        ("mixtral-8x7b", None, "v1"),
        ("qwen3-30b-a3b", "Qwen2MoeForCausalLM", "v2"),
    ],
)
def test_the_cuda_graph_estimate_follows_vllms_model_runner(
    name: str, architecture: str | None, runner: str
) -> None:
    """vLLM 0.26 serves dense models with its V2 model runner, which takes no CUDA-graph estimate from the KV
    budget (the Llama-3 and Qwen2 boots logged none), and an MoE with the V1 runner unless its architecture is
    one V2 takes by default (Qwen2-MoE is); the V1 runner takes its profiled estimate (Qwen3-30B-A3B logged
    0.49-0.56 GiB, a 4-layer Mixtral-8x7B 0.26), which the planner models as a fixed part and one per
    layer."""
    shape = shape_of(name)
    if architecture:
        shape = shape.model_copy(update={"architecture": architecture})
    assert vllm_model_runner(shape) == runner
    plan = h200_plan(shape, "W4A16", "fp8")
    estimate = (
        CUDAGRAPH_ESTIMATE_FIXED_BYTES + shape.num_layers * CUDAGRAPH_ESTIMATE_BYTES_PER_LAYER
        if runner == "v1"
        else 0
    )
    assert (plan.cudagraph_bytes, plan.cudagraph_source) == (estimate, "modelled" if estimate else "none")
    assert any("V1 model runner" in n for n in plan.notes) == (runner == "v1")
    eager = h200_plan(shape, "W4A16", "fp8", enforce_eager=True)
    assert (eager.cudagraph_bytes, eager.cudagraph_source) == (0, "off")


def test_moe_activation_uses_the_fused_moe_workspaces() -> None:
    """Per token: topk x (max(I, H) + max(2I, H)) + H, plus three hidden-sized tensors (Qwen3-30B-A3B:
    8 x (2048 + 2048) + 2048 + 3 x 2048 elements of 2 bytes); a dense model keeps its MLP term."""
    qwen3 = shape_of("qwen3-30b-a3b")
    assert activation_peak_bytes(qwen3, max_num_batched_tokens=8192) == 8192 * 2 * (
        8 * 4096 + 2048 + 3 * 2048
    )
    mixtral = shape_of("mixtral-8x7b")  # I 14336 > H: 2 x (14336 + 28672) + 4096 + 3 x 4096
    assert activation_peak_bytes(mixtral, max_num_batched_tokens=1000) == 1000 * 2 * (2 * 43_008 + 4 * 4096)
    assert activation_peak_bytes(mixtral, max_num_batched_tokens=1000, tensor_parallel_size=2) == (
        1000 * 2 * (2 * (7168 + 14336) + 4 * 4096)
    )


def test_the_plan_table_prints_the_moe() -> None:
    text = format_table(
        plan_table(shape_of("qwen3-30b-a3b"), device_memory_bytes=H200_CUDA, model="Qwen3-30B-A3B")
    )
    for needle in (
        "Qwen3MoeForCausalLM, mixture of experts: 30.53 B parameters, 3.35 B active per token",
        "128 experts in 48 of 48 layers, 8 routed per token",
        "Expert weights (routed and shared, whole checkpoint): 54.00 GiB bf16, 13.92 GiB W4A16",
        "router gates 0.02 GiB, kept 16-bit",
        "| 0.56 est. + 0.94 pool |",
        "calibrated on Qwen3-30B-A3B",
    ):
        assert needle in text, text
    dense = format_table(
        plan_table(shape_of("llama-3-8b"), device_memory_bytes=H200_CUDA, enforce_eager=True)
    )
    assert (
        "LlamaForCausalLM, 8.03 B parameters, 8.03 B active per token (dense)." in dense
        and "| off |" in dense
    )
    assert "Expert weights" not in dense and "ESTIMATE" not in dense


def refusal(config: dict) -> RecipeError | RecipeErrors:
    with pytest.raises((RecipeError, RecipeErrors)) as info:
        ModelShape.from_config(config, source="model/config.json")
    return info.value


def without(config: dict, *keys: str) -> dict:
    return {k: v for k, v in config.items() if k not in keys}


LLAMA = json.loads((CONFIGS / "llama-3-8b.json").read_text())
REFUSED = {
    "multi-latent attention": (fixture("deepseek-v3"), "kv_lora_rank", 512, "multi-latent attention"),
    "sliding window (Mistral 7B v0.1)": (
        fixture("mistral-7b-v0.1"),
        "sliding_window",
        4096,
        "sliding window",
    ),
    "interleaved sliding window (Gemma 2)": (
        fixture("gemma-2-9b"),
        "sliding_window",
        4096,
        "Gemma2ForCausalLM",
    ),
    "use_sliding_window": (
        {**fixture("qwen2-72b"), "use_sliding_window": True, "max_window_layers": 28},
        "use_sliding_window",
        True,
        "max_window_layers (28)",
    ),
    "layer_types": (
        {**LLAMA, "layer_types": ["sliding_attention", "full_attention"] * 16},
        "layer_types",
        ["sliding_attention"],
        "sliding window",
    ),
    "unknown architecture": (
        {**LLAMA, "architectures": ["Phi3ForCausalLM"]},
        "architectures",
        ["Phi3ForCausalLM"],
        "no model of this architecture",
    ),
    "no architecture named": (
        without(LLAMA, "architectures", "model_type"),
        "architectures",
        None,
        "names no",
    ),
    "dense without intermediate_size": (
        without(LLAMA, "intermediate_size"),
        "intermediate_size",
        None,
        "is missing",
    ),
    "MoE without moe_intermediate_size": (
        without(fixture("qwen3-30b-a3b"), "moe_intermediate_size"),
        "moe_intermediate_size",
        None,
        "each routed expert",
    ),
    "Mixtral without intermediate_size": (
        without(fixture("mixtral-8x7b"), "intermediate_size"),
        "intermediate_size",
        None,
        "each routed expert",
    ),  # its experts' width
    "more experts per token than experts": (
        {**fixture("mixtral-8x7b"), "num_experts_per_tok": 9},
        "num_experts_per_tok",
        9,
        "exceeds the 8 experts",
    ),
    "a size that is text": ({**LLAMA, "hidden_size": "4096"}, "hidden_size", "4096", "whole number"),
    "decoder_sparse_step 0": (
        {**fixture("qwen3-30b-a3b"), "decoder_sparse_step": 0},
        "decoder_sparse_step",
        0,
        "whole number >= 1",
    ),
    "mlp_only_layers not a list": (
        {**fixture("qwen3-30b-a3b"), "mlp_only_layers": "0"},
        "mlp_only_layers",
        "0",
        "list of layer indices",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_config_it_cannot_model_is_refused_with_field_value_and_fix(case: str) -> None:
    config, field, value, needle = REFUSED[case]
    error = refusal(config)
    assert isinstance(error, RecipeError), error
    assert (error.source, error.field, error.value) == ("model/config.json", field, value)
    assert needle in str(error) and "Fix: " in str(error), str(error)


def test_several_missing_keys_are_reported_together_and_an_all_moe_config_needs_no_intermediate_size() -> (
    None
):
    error = refusal(without(LLAMA, "intermediate_size", "vocab_size"))
    assert isinstance(error, RecipeErrors)
    assert [e.field for e in error.errors] == ["vocab_size", "intermediate_size"]
    qwen3 = ModelShape.from_config(
        without(fixture("qwen3-30b-a3b"), "intermediate_size")
    )  # every layer sparse
    assert qwen3.num_dense_layers == 0 and qwen3 == ModelShape.from_config(
        fixture("qwen3-30b-a3b")
    ).model_copy(update={"intermediate_size": 0})
    disabled = ModelShape.from_config(fixture("qwen2-72b"))  # sliding_window 131072, use_sliding_window false
    assert disabled.architecture == "Qwen2ForCausalLM"
    by_type = ModelShape.from_config(without(fixture("mixtral-8x7b"), "architectures"))  # model_type names it
    assert by_type.architecture == "MixtralForCausalLM" and by_type.num_experts == 8


def test_group_size_is_checked_against_the_expert_width() -> None:
    """quantization.group_size must divide moe_intermediate_size (the routed experts' down_proj inputs) and
    shared_expert_intermediate_size, as it must divide intermediate_size."""
    recipe = load_recipe(
        ROOT / "recipes" / "tiny-qwen3-moe-awq.yaml",  # the routers' gates ignored
        {"quantization.ignore": ["lm_head", "re:.*mlp.gate$", "re:.*shared_expert_gate$"]},
    )
    check_model_config(recipe, fixture("qwen3-30b-a3b"), source="r.yaml")  # 768 = 6 x 128
    for key, width in (("moe_intermediate_size", 1000), ("shared_expert_intermediate_size", 5000)):
        with pytest.raises(RecipeError) as info:
            check_model_config(recipe, {**fixture("qwen3-30b-a3b"), key: width}, source="r.yaml")
        assert info.value.field == "quantization.group_size" and f"{key}={width}" in str(info.value)


# --------------------------------------------------------------------------------------------
# What a plan assumes and how it names its rows (issue 43)
# --------------------------------------------------------------------------------------------


def test_a_llama_config_without_kv_heads_is_planned_with_one_per_attention_head_and_says_so() -> None:
    """transformers' LlamaConfig (and so vLLM) takes num_attention_heads when num_key_value_heads is absent;
    the plan does the same, and every row's notes say it assumed so."""
    assert ModelShape.from_config(LLAMA).assumed == ()
    shape = ModelShape.from_config(without(LLAMA, "num_key_value_heads"))
    assert (shape.num_heads, shape.num_kv_heads) == (32, 32)
    assert kv_bytes_per_token(shape) == 4 * kv_bytes_per_token(ModelShape.from_config(LLAMA))
    table = plan_table(shape, device_memory_bytes=H200, max_model_len=8192, model="llama")
    note = (
        "config.json has no num_key_value_heads: planned with 32 KV heads, one per attention head, as "
        "transformers' LlamaConfig (and so vLLM) defaults it"
    )
    assert all(r.notes[0].startswith(note) for r in table.rows.values())
    assert format_table(table).count(f"- note: {note}") == 1


def test_the_kv_heads_assumed_for_a_missing_key_are_transformers_own() -> None:
    """Only Llama's config class defaults num_key_value_heads to the attention heads; the others default it
    to their default model's count, and vLLM reads the config through them."""
    transformers = pytest.importorskip("transformers")
    from quantize_serve.capacity.model_shape import ARCHITECTURES

    for name, arch in ARCHITECTURES.items():
        expected = transformers.AutoConfig.for_model(
            arch.model_type, num_attention_heads=64
        ).num_key_value_heads
        assert (arch.kv_heads_default or 64) == expected, name
    mistral = without({**fixture("mistral-7b-v0.1"), "sliding_window": None}, "num_key_value_heads")
    shape = ModelShape.from_config(mistral)
    assert shape.num_kv_heads == 8 and "the default of transformers' MistralConfig" in shape.assumed[0]


def test_the_production_row_is_labelled_by_its_kv_dtype(llama8b: ModelShape) -> None:
    """--kv-cache-dtype auto plans a 16-bit KV cache for the production row: the text calls it so (the
    JSON key stays the production boot's)."""
    auto = plan_table(llama8b, device_memory_bytes=H200, max_model_len=8192, fp8_kv_cache_dtype="auto")
    text = format_table(auto)
    assert "| w4a16-16bitkv |" in text and "w4a16-fp8kv" not in text
    assert (
        "- w4a16-16bitkv vs base:" in text and "- note: w4a16-16bitkv is the production configuration" in text
    )
    assert auto.rows["w4a16-fp8kv"].kv_bytes_per_token == auto.rows["w4a16"].kv_bytes_per_token
    for fp8 in ("fp8", "fp8_e5m2"):
        text = format_table(
            plan_table(llama8b, device_memory_bytes=H200, max_model_len=8192, fp8_kv_cache_dtype=fp8)
        )
        assert "| w4a16-fp8kv |" in text and "16bitkv" not in text


@pytest.mark.parametrize(
    "case",
    [
        "multi-latent attention",
        "sliding window (Mistral 7B v0.1)",
        "interleaved sliding window (Gemma 2)",
        "use_sliding_window",
        "layer_types",
        "unknown architecture",
    ],
)
def test_a_shape_the_planner_cannot_model_points_to_the_projects_measured_path_first(case: str) -> None:
    from quantize_serve.core.errors import UnplannableShapeError

    error = refusal(REFUSED[case][0])
    assert isinstance(error, UnplannableShapeError), error
    assert error.fix.startswith(
        "measure it instead: `quantize-serve plan RECIPE --measure` boots this shape in vLLM"
    ), error.fix
    assert error.fix.index("quantize-serve plan RECIPE --measure") < error.fix.index("vllm serve MODEL")
