"""The capacity stage's arithmetic and specs without a boot (tests/engines/test_capacity.py boots)."""

from __future__ import annotations

import json

import pytest

from quantize_serve.capacity.measure import published_serve_command
from quantize_serve.serving.spec import capacity_spec
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.server import ServerSpec
from quantize_serve.serving.vllm_log import remedy_for, root_cause
from tests.conftest import ROOT
from tests.release_fixtures import capacity_config


def test_remedies_match_what_vllm_says():
    assert "largest max_model_len that fits is 384" in remedy_for(
        "... Based on the available memory, the estimated maximum model length is 384. Try ..."
    )
    assert "raise serve.gpu_memory_utilization" in remedy_for("No available memory for the cache blocks.")
    assert "enforce_eager" in remedy_for("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate")


def test_the_cause_is_found_under_vllms_process_prefix():
    # vLLM 0.26 (CUDA) as the H200 logged a refused max_model_len: every line carries its process
    log = (
        "(APIServer pid=3179)            ^^^^^^^^^^^^\n"
        "(APIServer pid=3179) pydantic_core._pydantic_core.ValidationError: 1 validation error for "
        "ModelConfig\n"
        "(APIServer pid=3179)   Value error, User-specified max_model_len (2048) is greater than the derived "
        "max_model_len (max_position_embeddings=1024.0 or model_max_length=None in model's config.json). "
        "To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. "
        "[type=value_error]\n"
    )
    cause = root_cause(log)
    assert cause.startswith(
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig: "
        "User-specified max_model_len (2048) is greater than the derived"
    ), cause
    assert "at most 1024" in remedy_for(log)


def test_serve_command_is_what_runs(awq_recipe, base_model_dir):
    spec = capacity_spec(awq_recipe, Boot.PRODUCTION, base_model_dir)
    cmd = spec.serve_command()
    kv = awq_recipe.serve.kv_cache_dtype  # fp8; auto where this CPU serves no fp8 KV (tests/conftest.py)
    assert cmd.startswith("vllm serve ") and f"--kv-cache-dtype {kv}" in cmd and "--max-model-len 512" in cmd
    # The budget less the bf16 tiny Llama's weights, by hand: per layer q 128x128 + k 64x128 +
    # v 64x128 + o 128x128 + gate/up/down 3 x 384x128 = 196,608, plus 2 norms of 128 = 196,864;
    # 4 layers = 787,456; embeddings and LM head 2 x 1024x128 = 262,144; final norm 128;
    # 1,049,728 parameters x 2 B = 2,099,456 B. memory_budget 8 MiB = 8,388,608 B.
    assert spec.kv_cache_memory_bytes == 8_388_608 - 2_099_456 == 6_289_152


def test_boot_names_are_the_run_folder_and_report_names():
    assert [str(b) for b in Boot] == ["base", "w4a16", "w4a16-fp8kv"]  # log files, report.json, results
    assert json.dumps({Boot.PRODUCTION: Boot.BASE}) == '{"w4a16-fp8kv": "base"}'


def test_argv_and_command_derive_from_one_config(awq_recipe, base_model_dir):
    serve = awq_recipe.serve.model_copy(update={"extra_args": ["--seed=7", "--enable-prefix-caching"]})
    spec = ServerSpec(
        model_dir=str(base_model_dir),
        serve=serve,
        kv_cache_memory_bytes=4096,
        tokenizer_dir=str(base_model_dir),
    )
    config = spec.vllm_config()
    assert config["model"] == str(base_model_dir) and config["max-model-len"] == 512
    assert config["kv-cache-memory-bytes"] == 4096 and config["seed"] == 7
    assert config["enable-prefix-caching"] is True and "gpu-memory-utilization" not in config
    argv = spec.vllm_args()
    assert argv[:2] == ["--model", str(base_model_dir)] and argv[argv.index("--seed") + 1] == "7"
    assert spec.serve_command() == "vllm serve " + " ".join(argv[1:])


def test_published_command_names_the_repo_not_the_machine(awq_recipe, tmp_path):
    ckpt = tmp_path / "checkpoints" / "awq-0123abcd"  # an absolute path on this machine
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text((ROOT / "models/tiny-llama/config.json").read_text())
    command = published_serve_command(awq_recipe, ckpt)
    hub = awq_recipe.hub  # at the release ref: what the gates passed, never the head of main
    assert command.startswith(
        f"vllm serve {hub.repo_id} --revision {hub.release_ref} --served-model-name model "
    )
    assert (
        f"--kv-cache-dtype {awq_recipe.serve.kv_cache_dtype}" in command and "--max-model-len 512" in command
    )
    assert str(tmp_path) not in command and " /" not in command
    no_hub = awq_recipe.model_copy(update={"hub": None})
    command = published_serve_command(no_hub, ckpt)
    assert (
        command.startswith("vllm serve awq-0123abcd ") and " /" not in command and "--revision" not in command
    )


H200 = 150109880320  # what CUDA sees of the lent H200


LLAMA = {
    size: json.loads((ROOT / f"benchmarks/configs/llama-3-{size}.json").read_text()) for size in ("8b", "70b")
}


def test_a_base_too_large_for_the_recipes_gpus_boots_at_the_smallest_tp_that_fits_or_stops():
    """Issue 14's table: the 70B bf16 base needs 131.4 GiB per GPU, more than 0.90 x 139.8 GiB, at TP 1;
    the W4A16 release fits one H200, its base needs two. CPU runs keep the recipe's TP."""
    from quantize_serve.capacity.measure import base_boot
    from quantize_serve.core.errors import GateError
    from quantize_serve.recipe.load import load_recipe

    recipe = load_recipe(ROOT / "recipes/llama3-8b-instruct-awq.yaml")
    assert base_boot(recipe, LLAMA["8b"], device_memory_bytes=H200, gpu_count=1).tensor_parallel_size == 1
    two = base_boot(recipe, LLAMA["70b"], device_memory_bytes=H200, gpu_count=2)
    assert two.tensor_parallel_size == 2
    assert "the bf16 base does not fit at TP 1: weights 131.42 GiB/GPU" in two.reason
    assert "exceed the 125.82 GiB budget" in two.reason and "measured at TP 2" in two.reason
    with pytest.raises(
        GateError, match=r"it fits at TP 2, and this host has 1 GPU\(s\).*Nothing was quantized"
    ):
        base_boot(recipe, LLAMA["70b"], device_memory_bytes=H200, gpu_count=1)
    cpu = load_recipe(ROOT / "recipes/tiny-llama-awq.yaml")
    assert base_boot(cpu, LLAMA["70b"], device_memory_bytes=H200, gpu_count=1).tensor_parallel_size == 1


def test_the_base_boot_at_another_tp_is_labelled_in_the_capacity_table(awq_recipe, base_model_dir):
    from quantize_serve.capacity.measure import CapacityReport

    spec = capacity_spec(awq_recipe, Boot.BASE, base_model_dir, tensor_parallel_size=2)
    assert spec.vllm_config()["tensor-parallel-size"] == 2 and awq_recipe.serve.tensor_parallel_size == 1
    rows = [
        capacity_config(name=b, tensor_parallel_size=tp, kv_cache_dtype="auto")
        for b, tp in zip(Boot, (2, 1, 1))
    ]
    report = CapacityReport(
        method="m",
        budget_bytes=None,
        base_boot="the bf16 base does not fit at TP 1: ...",
        configs=rows,
        freed_weight_bytes=0,
        fp8_token_ratio=1,
        gain_quantized=1,
        gain_fp8=1,
        planner=[],
    )
    text = report.markdown()
    assert "| base (TP 2) | auto |" in text and "| w4a16 | auto |" in text
    assert "Base boot: the bf16 base does not fit at TP 1" in text


@pytest.mark.parametrize(
    "scheme, labels",
    [
        (None, ("base", "w4a16", "w4a16-fp8kv")),
        ("W4A16", ("base", "w4a16", "w4a16-fp8kv")),
        ("W4A16_ASYM", ("base", "w4a16", "w4a16-fp8kv")),
        ("W8A8", ("base", "w8a8", "w8a8-fp8kv")),
        ("FP8_DYNAMIC", ("base", "fp8_dynamic", "fp8_dynamic-fp8kv")),
    ],
)
def test_a_boot_is_named_for_people_by_the_candidates_scheme(scheme, labels):
    """The values stay what results carry; the table, the chart and the boot log name an INT8 or FP8
    candidate's rows by its scheme (an AVX2 CPU's demo releases W8A8: its rows read "w8a8", not "w4a16")."""
    assert tuple(b.label(scheme) for b in Boot) == labels
    assert [b.value for b in Boot] == ["base", "w4a16", "w4a16-fp8kv"]


def test_the_capacity_table_names_a_w8a8_candidates_rows_by_its_scheme():
    from quantize_serve.capacity.measure import CapacityReport

    rows = [capacity_config(name=b, kv_cache_dtype="auto") for b in (Boot.BASE, Boot.QUANTIZED_16BIT_KV)]
    report = CapacityReport(
        method="m",
        budget_bytes=None,
        configs=rows,
        freed_weight_bytes=0,
        fp8_token_ratio=None,
        gain_quantized=1,
        gain_fp8=None,
        planner=[],
        fp8_kv_unavailable="no AVX-512",
        scheme="W8A8",
    )
    text = report.markdown()
    assert "| w8a8 | auto |" in text and "| w8a8-fp8kv | fp8 | - | - | not available" in text
    assert "Capacity over base: w8a8 x1.00" in text and "the 16-bit KV cache of the w8a8 row" in text
    assert "w4a16" not in text
    assert (
        CapacityReport.model_validate_json(report.model_dump_json()).configs[1].name
        is Boot.QUANTIZED_16BIT_KV
    )


def test_cache_info_is_read_with_prometheus_parser():
    from quantize_serve.capacity.measure import read_cache_info

    text = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="128",cache_dtype="fp8",note="a \\"quoted\\" }",'
        'num_gpu_blocks="41"} 1.0\n'
    )
    info = read_cache_info(text)
    assert info["num_gpu_blocks"] == "41" and info["cache_dtype"] == "fp8" and info["note"] == 'a "quoted" }'


def test_a_base_served_at_a_lower_utilization_stands_at_the_recipes_by_vllms_sizing(base_model_dir):
    """The base scored beside calibration at 0.56 of an H200: its row at the recipe's 0.90 is the blocks
    vLLM gives 0.34 x usable memory more (2 MiB a block of Llama-3-8B's bf16 KV), and the capacity table
    says how the row was had. 56,080 blocks is what the 8B's base measured at 0.90 on the H200
    (benchmarks/results/capacity/h200_llama3.json: 897,280 KV tokens)."""
    from quantize_serve.capacity.measure import CapacityConfig, CapacityReport, at_utilization
    from quantize_serve.recipe.load import load_recipe

    recipe = load_recipe(ROOT / "recipes/llama3-8b-instruct-awq.yaml")
    assert recipe.serve.gpu_memory_utilization == 0.90
    served = CapacityConfig(
        name=Boot.BASE,
        kv_cache_dtype="auto",
        weights_bytes=16_060_522_496,
        kv_cache_memory_bytes=66_571_000_000,
        kv_cache_tokens=31_744 * 16,
        num_blocks=31_744,
        block_size=16,
        max_model_len=8192,
        max_concurrency=62.0,
        boot_seconds=120,
    )
    row = at_utilization(served, recipe, LLAMA["8b"], served_at=0.56, usable_bytes=H200)
    delta = 135_098_892_288 - 84_061_532_980  # ceil(usable x 0.90) - ceil(usable x 0.56)
    assert row.kv_cache_memory_bytes == served.kv_cache_memory_bytes + delta
    assert row.num_blocks == 31_744 + delta // (131_072 * 16) == 56_080
    assert (row.kv_cache_tokens, row.max_concurrency) == (897_280, 109.53)
    assert row.derived.startswith(
        "derived at gpu_memory_utilization 0.90 from its boot at 0.56, which held 507,904 tokens"
    )
    assert "31,744 blocks" in row.derived and "+24,336 blocks" in row.derived
    assert row.source == "derived" and row.held.kv_cache_tokens == 507_904
    assert at_utilization(served, recipe, LLAMA["8b"], served_at=0.90, usable_bytes=H200).num_blocks == 31_744
    spec = capacity_spec(recipe, Boot.BASE, base_model_dir, gpu_memory_utilization=0.56)
    assert spec.vllm_config()["gpu-memory-utilization"] == 0.56
    report = CapacityReport(
        method="m",
        budget_bytes=None,
        configs=[row],
        freed_weight_bytes=0,
        fp8_token_ratio=1,
        gain_quantized=1,
        gain_fp8=1,
        planner=[],
    )
    assert "- base: derived at gpu_memory_utilization 0.90 from its boot at 0.56" in report.markdown()


def test_the_sixteen_bit_kv_row_is_derived_from_the_production_boot_by_vllms_sizing():
    """Row (b) not booted (serve.sixteen_bit_kv_row: derive): the production boot's KV cache bytes over a
    16-bit block's. The H200's two boots of one 8B W4A16 checkpoint (benchmarks/results/capacity/h200.json):
    fp8 KV
    got 128,086,662,184 bytes (122,155 blocks), 16-bit KV 128,118,874,439 (61,093 blocks, 977,488
    tokens); derived from the first, 61,076 blocks: 272 tokens (0.03%) short of the boot."""
    from quantize_serve.capacity.measure import CapacityConfig, with_sixteen_bit_kv
    from quantize_serve.recipe.load import load_recipe

    recipe = load_recipe(ROOT / "recipes/llama3-8b-instruct-awq.yaml")
    fp8 = CapacityConfig(
        name=Boot.PRODUCTION,
        kv_cache_dtype="fp8",
        weights_bytes=5_862_630_359,
        kv_cache_memory_bytes=128_086_662_184,
        kv_cache_tokens=1_954_480,
        num_blocks=122_155,
        block_size=16,
        max_model_len=8192,
        max_concurrency=238.58,
        boot_seconds=49.0,
    )
    row = with_sixteen_bit_kv(fp8, recipe, LLAMA["8b"], kv_cache_dtype="bfloat16", usable_bytes=H200)
    assert (row.name, row.kv_cache_dtype, row.kv_cache_memory_bytes) == (
        Boot.QUANTIZED_16BIT_KV,
        "bfloat16",
        fp8.kv_cache_memory_bytes,
    )
    assert (row.num_blocks, row.kv_cache_tokens, row.max_concurrency) == (61_076, 977_216, 119.29)
    assert 977_488 - row.kv_cache_tokens == 272
    assert row.boot_seconds == 0 and row.derived.startswith(
        "derived from the production boot, which held 1,954,480 fp8 tokens; not booted: that boot's "
        "119.29 GiB"
    )
    # a production boot that served a 16-bit KV cache (a CPU without fp8 KV) is row (b) itself
    sixteen = fp8.model_copy(
        update={"kv_cache_dtype": "auto", "kv_cache_tokens": 977_488, "num_blocks": 61_093}
    )
    same = with_sixteen_bit_kv(sixteen, recipe, LLAMA["8b"], kv_cache_dtype="auto", usable_bytes=H200)
    assert (same.name, same.kv_cache_tokens, same.num_blocks) == (Boot.QUANTIZED_16BIT_KV, 977_488, 61_093)
