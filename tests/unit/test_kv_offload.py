"""Issue 69: a host-memory tier for vLLM's prefix cache (serve.kv_offload). The field and its refusals before
any heavy work, the flags and serve-profile.yaml it produces, vLLM 0.26's block arithmetic for the tier's
tokens, and the planner's row. No vLLM boot: vLLM's CPU backend cannot offload."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from quantize_serve.capacity.host_tier import (
    HOST_TIER_PURPOSE,
    HostMemory,
    HostTierSizing,
    host_tier_tokens,
    mla_bytes_per_token_per_rank,
    plan_host_tier,
    tokens_in,
)
from quantize_serve.capacity.plan_table import PlanTable, format_table, plan_table
from quantize_serve.capacity.planner import GPU_MEMORY_BYTES, ModelShape
from quantize_serve.core.errors import RecipeError, RecipeErrors
from quantize_serve.core.settings import get_settings
from quantize_serve.recipe.load import load_recipe
from quantize_serve.recipe.model import KVOffloadSection, ServeSection
from quantize_serve.serve_profile.output import write_profile
from quantize_serve.serving import gpu
from quantize_serve.serving.server import ServerSpec
from quantize_serve.validate import preflight
from quantize_serve.validate.preflight import (
    check_host_tier,
    check_kv_offload,
    check_recipe,
    check_serving_host,
    for_this_host,
    validate_recipe,
)
from tests.conftest import ROOT
from tests.unit.malformed_recipes import recipe_data

GiB = 2**30
TINY = ROOT / "recipes" / "tiny-llama-awq.yaml"
H100 = 84_468_416_512  # usable bytes of an H100 80GB
LLAMA_3_8B = ModelShape.from_config(ROOT / "benchmarks" / "configs" / "llama-3-8b.json")
# Qwen2.5-7B's attention (28 layers, 4 KV heads of 128): TP 8 is more ranks than KV heads
FOUR_KV_HEADS = ModelShape(
    architecture="Qwen2ForCausalLM",
    num_layers=28,
    num_heads=28,
    num_kv_heads=4,
    head_dim=128,
    hidden_size=3584,
    intermediate_size=18944,
    vocab_size=152064,
    max_position_embeddings=32768,
)
BIG_HOST = HostMemory(available_bytes=200 * GiB, total_bytes=256 * GiB)


def tier(**fields) -> dict:
    return {"serve.kv_offload": fields}


@pytest.fixture
def on_gpu(monkeypatch):
    """A GPU host with 200 GiB of host memory available, no PYTORCH_CUDA_ALLOC_CONF."""
    monkeypatch.setattr(gpu, "usable_memory_bytes", lambda index=0: H100)
    monkeypatch.setattr(HostMemory, "read", classmethod(lambda cls: BIG_HOST))
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)


def refusal(check, *args, **kwargs) -> RecipeError:
    with pytest.raises(RecipeError) as info:
        check(*args, **kwargs)
    return info.value


# ---- the field ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, words",
    [
        ({}, "set exactly one of serve.kv_offload.size_gib"),
        ({"size_gib": 8, "host_memory_share": 0.2}, "set exactly one of serve.kv_offload.size_gib"),
        ({"backend": "lmcache", "size_gib": 8}, "vLLM ignores --kv-offloading-size for it"),
        ({"host_memory_share": 0.9}, "less than or equal to 0.8"),
        ({"size_gib": 0}, "greater than 0"),
    ],
)
def test_the_field_wants_one_size_and_none_for_lmcache(fields, words):
    with pytest.raises((RecipeError, RecipeErrors)) as info:
        load_recipe(TINY, tier(**fields))
    assert words in str(info.value) and "kv_offload" in str(info.value)


def test_the_field_sized_or_lmcache_loads():
    assert load_recipe(TINY, tier(size_gib=8)).serve.kv_offload.size_bytes == 8 * GiB
    assert load_recipe(TINY, tier(host_memory_share=0.25)).serve.kv_offload.size_bytes is None
    assert load_recipe(TINY, tier(backend="lmcache")).serve.kv_offload.vllm_config() == {
        "kv-offloading-backend": "lmcache"
    }
    assert load_recipe(TINY).serve.kv_offload is None


@pytest.mark.parametrize("flag", ["--kv-offloading-size", "--kv_offloading_backend=native"])
def test_extra_args_cannot_set_the_tier(flag):
    with pytest.raises((RecipeError, RecipeErrors)) as info:
        load_recipe(TINY, {"serve.extra_args": [flag, "8"] if "=" not in flag else [flag]})
    assert "is set by its own serve.* field" in str(info.value)


# ---- the flags and serve-profile.yaml -------------------------------------------------------------------


def spec(kv_offload: KVOffloadSection | None) -> ServerSpec:
    return ServerSpec(model_dir="/models/m", serve=ServeSection(max_model_len=4096), kv_offload=kv_offload)


def test_the_argv_carries_the_tier():
    args = spec(KVOffloadSection(size_gib=8)).vllm_args()
    at = args.index("--kv-offloading-backend")
    assert args[at : at + 4] == ["--kv-offloading-backend", "native", "--kv-offloading-size", "8.0"]
    lmcache = spec(KVOffloadSection(backend="lmcache")).vllm_args()
    assert "--kv-offloading-backend" in lmcache and "--kv-offloading-size" not in lmcache
    assert not any(a.startswith("--kv-offloading") for a in spec(None).vllm_args())


def test_serve_profile_yaml_carries_the_tier(tmp_path: Path):
    path, command = write_profile(
        spec(KVOffloadSection(size_gib=8)), tmp_path / "serve-profile.yaml", model="org/m", header=["h"]
    )
    text = path.read_text()
    assert "# Use: vllm serve --config serve-profile.yaml" in text
    mapping = yaml.safe_load(text)
    assert mapping["kv-offloading-backend"] == "native" and mapping["kv-offloading-size"] == 8.0
    assert mapping["model"] == "org/m"
    assert "--kv-offloading-backend native --kv-offloading-size 8.0" in command


# ---- vLLM 0.26's block arithmetic -----------------------------------------------------------------------


def test_llama_3_8b_host_tokens_by_hand():
    """2 x 32 layers x 8 KV heads x 128 x 1 B = 64 KiB a token in fp8: a 16-token block is 1 MiB, 10 GiB hold
    10,240 blocks = 163,840 tokens; 16-bit, half. TP 2: 4 heads a rank, 2 ranks a chunk: the same."""
    assert host_tier_tokens(10 * GiB, LLAMA_3_8B, "fp8", 1) == 163_840
    assert host_tier_tokens(10 * GiB, LLAMA_3_8B, "auto", 1) == 81_920
    for tp in (2, 4, 8):
        assert host_tier_tokens(10 * GiB, LLAMA_3_8B, "fp8", tp) == 163_840
        assert host_tier_tokens(10 * GiB, LLAMA_3_8B, "fp8_e5m2", tp) == 163_840
    # whole blocks: 12.3 GiB = 12,595.2 MiB -> 12,595 blocks
    assert host_tier_tokens(int(12.3 * GiB), LLAMA_3_8B, "fp8", 1) == 12_595 * 16


def test_more_ranks_than_kv_heads_store_copies():
    """4 KV heads at TP 8: each rank holds one head (replicated), so a token takes 8 heads' bytes over the
    ranks, twice its 4: 2 x 28 x 1 x 128 x 2 B = 14,336 B a rank, a chunk 8 x 16 x 14,336 = 1,835,008 B;
    10 GiB // that = 5,851 chunks = 93,616 tokens, against 11,702 x 16 = 187,232 at TP 1 (917,504 B
    chunks)."""
    assert host_tier_tokens(10 * GiB, FOUR_KV_HEADS, "auto", 1) == 187_232
    assert host_tier_tokens(10 * GiB, FOUR_KV_HEADS, "auto", 4) == 187_232
    assert host_tier_tokens(10 * GiB, FOUR_KV_HEADS, "auto", 8) == 93_616


def test_mla_latent_is_replicated_on_every_rank():
    """DeepSeek-V3's latent (61 layers x (512 + 64) x 1 B in fp8 = 35,136 B a token), on each of 8 ranks:
    a chunk 8 x 16 x 35,136 = 4,497,408 B, 10 GiB // that = 2,387 chunks = 38,192 tokens."""
    per_rank = mla_bytes_per_token_per_rank(61, 512, 64, 1)
    assert per_rank == 35_136
    assert tokens_in(10 * GiB, bytes_per_token_per_rank=per_rank, world_size=8) == 38_192
    assert (
        tokens_in(10 * GiB, bytes_per_token_per_rank=per_rank, world_size=1) == 19_099 * 16
    )  # 562,176 B chunks: 8 times the tokens


def test_the_tier_beyond_the_gpu_and_its_warning():
    big = plan_host_tier(
        KVOffloadSection(size_gib=64),
        LLAMA_3_8B,
        kv_cache_dtype="fp8",
        tensor_parallel_size=2,
        gpu_tokens=500_000,
    )
    assert (big.tokens, big.distinct_tokens_beyond_gpu, big.warning) == (1_048_576, 548_576, None)
    assert big.pinned_bytes == 64 * GiB and big.pinned_bytes_per_rank == 32 * GiB
    assert big.bytes_per_token == 65_536 and big.note == HOST_TIER_PURPOSE
    small = plan_host_tier(
        KVOffloadSection(size_gib=8),
        LLAMA_3_8B,
        kv_cache_dtype="fp8",
        tensor_parallel_size=1,
        gpu_tokens=500_000,
    )
    assert small.distinct_tokens_beyond_gpu == 0
    # 500,000 tokens x 64 KiB = 30.52 GiB of the GPU's: the tier must be larger to keep anything more
    assert small.warning == (
        "the tier holds copies of what the GPU holds; size it above 30.6 GiB to keep prefixes the GPU evicted"
    )
    with pytest.raises(ValueError):
        plan_host_tier(
            KVOffloadSection(host_memory_share=0.2),
            LLAMA_3_8B,
            kv_cache_dtype="fp8",
            tensor_parallel_size=1,
            gpu_tokens=1,
        )


# ---- the planner's table --------------------------------------------------------------------------------


def table(kv_offload=None, device=GPU_MEMORY_BYTES["h200"], **kwargs) -> PlanTable:
    return plan_table(LLAMA_3_8B, device_memory_bytes=device, model="llama", kv_offload=kv_offload, **kwargs)


def test_the_planner_row_beside_production():
    plain, with_tier = table(), table(KVOffloadSection(size_gib=8))
    text = format_table(with_tier)
    production = with_tier.rows["w4a16-fp8kv"]
    assert with_tier.host_tier.gpu_tokens == production.kv_cache_tokens == 1_952_240
    lines = text.splitlines()
    row = lines.index(next(line for line in lines if line.startswith("| w4a16-fp8kv |")))
    assert lines[row + 1] == (
        "| w4a16-fp8kv + host tier (native) | - | - | - | - | 8.00 host | 65,536 | 131,072 | - | - "
        "| prefix reuse |"
    )
    assert (
        "- host tier of w4a16-fp8kv (serve.kv_offload, native): 8 GiB of pinned host memory, 131,072 tokens "
        "by vLLM's block arithmetic, 0 of them beyond the GPU's 1,952,240 (write-through: it also holds "
        f"copies of the GPU's blocks); {HOST_TIER_PURPOSE}"
    ) in lines
    assert (
        "- warning: host tier: the tier holds copies of what the GPU holds; size it above 119.2 GiB" in text
    )
    # without the tier: the table and its JSON as before
    assert "host tier" not in format_table(plain) and "host_tier" not in plain.model_dump_json()
    assert [line for line in lines if "host tier" not in line] == format_table(plain).splitlines()
    assert PlanTable.model_validate_json(with_tier.model_dump_json()) == with_tier


def test_a_tier_larger_than_the_gpu_cache_at_tp_2():
    text = format_table(table(KVOffloadSection(size_gib=256), device=24 * GiB, tensor_parallel_size=2))
    tier = table(KVOffloadSection(size_gib=256), device=24 * GiB, tensor_parallel_size=2).host_tier
    assert tier.tokens == 4_194_304 and tier.distinct_tokens_beyond_gpu == tier.tokens - tier.gpu_tokens > 0
    assert "256 GiB of pinned host memory, 128.00 GiB per rank, 4,194,304 tokens" in text
    assert "warning" not in text


@pytest.mark.parametrize(
    "kv_offload, kwargs, words",
    [
        (KVOffloadSection(backend="lmcache"), {}, "sized by LMCache's own configuration"),
        (KVOffloadSection(host_memory_share=0.3), {}, "host_memory_share 0.3 is resolved to GiB"),
        (KVOffloadSection(size_gib=8), {"mode": "fixed_budget"}, "vLLM's CPU backend cannot offload"),
    ],
)
def test_a_tier_the_planner_does_not_size_says_why(kv_offload, kwargs, words):
    planned = table(kv_offload, **kwargs)
    assert planned.host_tier is None and words in planned.host_tier_unplanned
    assert f"- host tier: {planned.host_tier_unplanned}" in format_table(planned)


def test_plan_of_a_recipe_with_a_tier(tmp_path: Path, capsys, monkeypatch):
    from quantize_serve.cli import main

    path = write_recipe(tmp_path, size_gib=8)
    monkeypatch.setattr(gpu, "usable_memory_bytes", lambda index=0: None)  # planned for an H200 (--gpu)
    assert main(["plan", str(path), "--gpu", "h200"]) == 0
    out = capsys.readouterr().out
    assert "| w4a16-fp8kv + host tier (native) |" in out and HOST_TIER_PURPOSE in out


def write_recipe(folder: Path, **kv_offload) -> Path:
    data = recipe_data(folder)
    data["serve"]["kv_offload"] = kv_offload
    path = folder / "kv-offload.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ---- host_memory_share: resolved on the GPU host --------------------------------------------------------


def test_a_share_becomes_gib_on_a_gpu_host(on_gpu):
    recipe = load_recipe(TINY, tier(host_memory_share=0.25))
    applied, not_applied = for_this_host(recipe, H100)
    assert applied.serve.kv_offload.size_gib == 50.0 and applied.serve.kv_offload.host_memory_share is None
    assert "serve.memory_budget" in not_applied and "kv_offload" not in " ".join(not_applied)
    validated = validate_recipe(TINY, tier(host_memory_share=0.25))
    assert validated.recipe.serve.kv_offload.size_gib == 50.0
    assert validated.host_tier_sizing == HostTierSizing(
        host_memory_share=0.25, size_gib=50.0, available_bytes=200 * GiB, total_bytes=256 * GiB
    )
    assert validated.host_tier_note() == (
        "serve.kv_offload.size_gib 50.0 GiB: host_memory_share 0.25 of the 200.0 GiB this host had available "
        "when the run validated (256.0 GiB total)"
    )
    assert validate_recipe(TINY, tier(size_gib=8)).host_tier_sizing is None


def test_a_share_rounds_down_to_a_tenth_of_a_gib():
    memory = HostMemory(available_bytes=int(61.37 * GiB), total_bytes=64 * GiB)
    assert memory.share_gib(0.5) == 30.6 and memory.share_gib(0.001) == 0.1


def test_a_cpu_host_resolves_nothing(monkeypatch):
    monkeypatch.setattr(gpu, "usable_memory_bytes", lambda index=0: None)
    recipe = load_recipe(TINY, tier(host_memory_share=0.5))
    assert for_this_host(recipe, None) == (recipe, {})
    assert validate_recipe(TINY, tier(host_memory_share=0.5)).host_tier_sizing is None


# ---- refusals before any heavy work ---------------------------------------------------------------------


def test_vllms_cpu_backend_is_refused(monkeypatch):
    """`run` and the run's validate task (check_serving_host) refuse the tier on a CPU host, first."""
    monkeypatch.setattr(gpu, "usable_memory_bytes", lambda index=0: None)
    error = refusal(check_serving_host, load_recipe(TINY, tier(size_gib=1)), source="r.yaml")
    assert error.field == "serve.kv_offload"
    assert "vLLM's CPU backend cannot offload (vLLM: 'CPU Offloading is currently only supported on" in str(
        error
    )
    assert "Fix: remove serve.kv_offload for a CPU host, or run on a GPU host" in str(error)
    check_host_tier(load_recipe(TINY), source="r.yaml")  # nothing changes without the tier


def test_validate_on_a_cpu_host_leaves_the_host_to_the_run(tmp_path: Path, monkeypatch):
    """`quantize-serve validate` works on any machine: without a GPU here the tier's host checks are listed as
    not checked; on a GPU host they run."""
    path = write_recipe(tmp_path, size_gib=8)
    monkeypatch.setattr(gpu, "usable_memory_bytes", lambda index=0: None)
    check = check_recipe(path)
    assert any(n.startswith("serve.kv_offload: no GPU here") for n in check.not_checked)
    assert "serve.kv_offload: the recipe" in check.checked


def test_validate_on_a_gpu_host_checks_the_tier(tmp_path: Path, monkeypatch, on_gpu):
    monkeypatch.setattr(preflight, "check_quantize_host", lambda recipe, source: None)  # torch without CUDA
    assert (
        "serve.kv_offload: the recipe, and this GPU host holds the tier"
        in check_recipe(write_recipe(tmp_path, size_gib=8)).checked
    )
    with pytest.raises(RecipeError) as info:
        check_recipe(write_recipe(tmp_path, size_gib=190))
    assert info.value.field == "serve.kv_offload.size_gib"


def test_a_tier_larger_than_the_host_can_pin(on_gpu):
    """200 GiB available of 256: the margin is 25.6 GiB (10 % of the total, above 8 GiB), so 174.4 GiB fit."""
    recipe = load_recipe(TINY, tier(size_gib=190))
    error = refusal(check_host_tier, recipe, source="r.yaml")
    assert (error.field, error.value) == ("serve.kv_offload.size_gib", 190.0)
    assert (
        "this host has 200.0 GiB available (256.0 GiB total); the tier pins all of it at vLLM's start, and "
        "25.6 GiB must stay free"
    ) in str(error)
    assert "Fix: size_gib <= 174.4, or host_memory_share" in str(error)
    check_host_tier(load_recipe(TINY, tier(size_gib=174)), source="r.yaml")  # fits
    small = HostMemory(available_bytes=20 * GiB, total_bytes=32 * GiB)  # margin 8 GiB: 12 GiB fit
    error = refusal(
        check_host_tier, load_recipe(TINY, tier(host_memory_share=0.8)), source="r", host_memory=small
    )
    assert (error.field, error.value) == ("serve.kv_offload.host_memory_share", 0.8)
    assert "16.0 GiB here: this host has 20.0 GiB available (32.0 GiB total)" in str(error)
    assert "Fix: host_memory_share <= 0.60, or size_gib <= 12.0" in str(error)
    none_free = HostMemory(available_bytes=6 * GiB, total_bytes=32 * GiB)
    error = refusal(check_host_tier, load_recipe(TINY, tier(size_gib=1)), source="r", host_memory=none_free)
    assert "Fix: free host memory, run on a host with more, or remove serve.kv_offload" in str(error)


def test_expandable_segments_are_refused(on_gpu, monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.6,expandable_segments:True")
    recipe = load_recipe(TINY, tier(size_gib=8))
    error = refusal(check_host_tier, recipe, source="r.yaml")
    assert "expandable_segments:True" in str(error) and "Fix: unset PYTORCH_CUDA_ALLOC_CONF" in str(error)
    # vLLM's cumem allocator keeps the KV cache out of expandable segments: vLLM accepts it, so do we
    check_host_tier(
        load_recipe(TINY, {**tier(size_gib=8), "serve.extra_args": ["--enable-cumem-allocator"]}),
        source="r.yaml",
    )
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    check_host_tier(recipe, source="r.yaml")


def test_lmcache_needs_its_package_in_the_serving_environment(on_gpu, monkeypatch, tmp_path: Path):
    monkeypatch.setenv("QS_SERVING_PYTHON", sys.executable)
    get_settings.cache_clear()
    try:
        recipe = load_recipe(TINY, tier(backend="lmcache"))
        error = refusal(check_host_tier, recipe, source="r.yaml")
        assert (error.field, error.value) == ("serve.kv_offload.backend", "lmcache")
        assert f"({sys.executable}) has no lmcache package" in str(error) and "or use backend native" in str(
            error
        )
        (tmp_path / "lmcache").mkdir()
        (tmp_path / "lmcache" / "__init__.py").write_text("")
        monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the serving Python finds one now
        check_host_tier(recipe, source="r.yaml")
    finally:
        get_settings.cache_clear()


def test_models_and_flags_vllm_does_not_offload():
    recipe = load_recipe(TINY, {**tier(size_gib=8), "serve.extra_args": ["--enable-return-routed-experts"]})
    error = refusal(check_kv_offload, recipe, None, source="r.yaml")
    assert (error.field, error.value) == ("serve.extra_args", "--enable-return-routed-experts")
    assert "incompatible with KV connectors" in str(error)
    recipe = load_recipe(TINY, tier(size_gib=8))
    for config in ({"is_encoder_decoder": True}, {"text_config": {"is_encoder_decoder": True}}):
        error = refusal(check_kv_offload, recipe, config, source="r.yaml")
        assert "Encoder-decoder models are not currently supported with KV connectors" in str(error)
    check_kv_offload(recipe, {"kv_lora_rank": 512}, source="r.yaml")  # MLA: vLLM 0.26 offloads it
    plain = load_recipe(TINY, {"serve.extra_args": ["--enable-return-routed-experts"]})
    check_kv_offload(plain, {"is_encoder_decoder": True}, source="r.yaml")  # no tier: nothing to refuse


def test_the_runs_validate_stage_refuses_the_flag_before_anything_heavy():
    with pytest.raises(RecipeError) as info:
        validate_recipe(TINY, {**tier(size_gib=8), "serve.extra_args": ["--enable-return-routed-experts"]})
    assert info.value.field == "serve.extra_args"


def test_host_memory_is_read_within_a_cgroups_limit(monkeypatch):
    from types import SimpleNamespace

    from quantize_serve.capacity import host_tier

    machine = SimpleNamespace(available=120 * 2**30, total=128 * 2**30)
    monkeypatch.setattr(host_tier.psutil, "virtual_memory", lambda: machine)
    monkeypatch.setattr(host_tier, "cgroup_memory", lambda: None)
    assert host_tier.HostMemory.read() == host_tier.HostMemory(
        available_bytes=120 * 2**30, total_bytes=128 * 2**30
    )
    # a container limited to 64 GiB with 4 GiB in use: its limit less its use, and its margin from the limit
    monkeypatch.setattr(host_tier, "cgroup_memory", lambda: (64 * 2**30, 4 * 2**30))
    memory = host_tier.HostMemory.read()
    assert (memory.available_bytes, memory.total_bytes, memory.cgroup_limit_bytes) == (
        60 * 2**30,
        64 * 2**30,
        64 * 2**30,
    )
    assert memory.room_bytes == 52 * 2**30  # less the 8 GiB floor of the margin (10% of 64 GiB is below it)
    # a limit above the machine's memory changes nothing
    monkeypatch.setattr(host_tier, "cgroup_memory", lambda: (256 * 2**30, 4 * 2**30))
    assert host_tier.HostMemory.read().cgroup_limit_bytes is None
