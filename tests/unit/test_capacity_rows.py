"""Issue 72: one meaning for serve.memory_budget (the CPU host's budget, not applied on a GPU host); every
capacity row says what it is (measured with what its boot held, derived from what, reused from which run);
boots and their logs are named by what ran (scheme, KV dtype). No boot: a GPU host is its memory figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantize_serve.capacity.measure import (
    CapacityConfig,
    CapacityReport,
    at_utilization,
    boot_log_name,
    measure_capacity,
    with_sixteen_bit_kv,
)
from quantize_serve.serving.spec import capacity_spec
from quantize_serve.recipe.load import load_recipe
from quantize_serve.serving import gpu
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.host import AVX2_OVERRIDES
from quantize_serve.serving.server import ServerSpec
from quantize_serve.validate.preflight import for_this_host, validate_recipe
from tests.conftest import ROOT
from tests.release_fixtures import capacity_config

SMOLLM2 = ROOT / "recipes" / "smollm2-135m-awq.yaml"
TINY = ROOT / "recipes" / "tiny-llama-awq.yaml"
H100 = 84_468_416_512  # usable bytes of an H100 80GB (its 78.66 GiB free, as the host)
GPU_LOG = (
    "(EngineCore pid=7) INFO 12-09 10:00:01 [gpu_worker.py:560] Available KV cache memory: 0.75 GiB\n"
    "(EngineCore pid=7) INFO 12-09 10:00:01 [kv_cache_utils.py:2177] GPU KV cache size: 34,912 tokens\n"
    "(EngineCore pid=7) INFO 12-09 10:00:01 [kv_cache_utils.py:2181] Maximum concurrency for 2,048 tokens "
    "per request: 17.05x\n"
)


# ---- serve.memory_budget: the CPU host's budget -------------------------------------------------------


def test_on_a_gpu_host_the_cpu_budget_is_not_applied_and_says_so():
    recipe = load_recipe(SMOLLM2)
    assert int(recipe.serve.memory_budget) == 2**30
    on_gpu, not_applied = for_this_host(recipe, H100)
    assert on_gpu.serve.memory_budget is None
    assert on_gpu.model_copy(update={"serve": recipe.serve}) == recipe  # nothing else changes
    assert list(not_applied) == ["serve.memory_budget"]
    why = not_applied["serve.memory_budget"]
    assert "1.0 GiB is the CPU host's budget" in why and "78.67 GiB" in why
    assert "serve.gpu_memory_utilization (0.90)" in why
    # so no boot gets --kv-cache-memory-bytes: vLLM sizes the KV cache from gpu_memory_utilization
    spec = capacity_spec(on_gpu, Boot.PRODUCTION, ROOT / "models" / "tiny-llama")
    assert spec.kv_cache_memory_bytes is None and "--kv-cache-memory-bytes" not in spec.serve_command()
    assert "--gpu-memory-utilization 0.9" in spec.serve_command()


def test_on_a_cpu_host_the_budget_applies_and_a_gpu_recipe_is_left_alone():
    recipe = load_recipe(SMOLLM2)
    assert for_this_host(recipe, None) == (recipe, {})
    no_budget = load_recipe(SMOLLM2, {"serve.memory_budget": None})
    assert for_this_host(no_budget, H100) == (no_budget, {})
    spec = capacity_spec(recipe, Boot.BASE, ROOT / "models" / "tiny-llama")
    assert spec.kv_cache_memory_bytes is not None and spec.kv_cache_memory_bytes < 2**30


def test_the_run_validates_the_recipe_for_its_host(monkeypatch):
    """validate_recipe (the run's validate stage) applies for_this_host: on a GPU host the run's recipe has
    no budget, its identity is the recipe as written, and the stage's line says what was not applied."""
    from tasks.progress import key_figure

    monkeypatch.setattr(gpu, "usable_memory_bytes", lambda index=0: None)
    on_cpu = validate_recipe(TINY)
    monkeypatch.setattr(gpu, "usable_memory_bytes", lambda index=0: H100)
    on_gpu = validate_recipe(TINY)
    assert on_cpu.recipe.serve.memory_budget is not None and not on_cpu.not_applied
    assert on_cpu.host_note() is None and "not applied" not in key_figure(on_cpu)[1]
    assert on_gpu.recipe.serve.memory_budget is None and on_gpu.recipe_sha256 == on_cpu.recipe_sha256
    assert on_gpu.host_note().startswith("serve.memory_budget not applied: 8.0 MiB is the CPU host's budget")
    assert key_figure(on_gpu)[1].endswith(on_gpu.host_note())


def test_plan_on_a_gpu_host_plans_the_gpu_and_says_the_budget_is_not_applied(capsys, monkeypatch):
    from quantize_serve.capacity import plan_table
    from quantize_serve.cli import main

    monkeypatch.setattr(gpu, "usable_memory_bytes", lambda index=0: H100)
    assert main(["plan", str(TINY), "--json"]) == 0
    out = capsys.readouterr()
    row = plan_table.PlanTable.model_validate_json(out.out).rows["w4a16-fp8kv"]
    assert row.mode == "gpu" and row.gpu_memory_utilization == 0.90
    assert out.err.startswith("serve.memory_budget not applied: 8.0 MiB is the CPU host's budget")


# ---- every row says what it is ------------------------------------------------------------------------


class FakeServer:
    """What measure_capacity reads of a running server: /metrics and its log."""

    def __init__(self, log_path: Path, tokens: int, blocks: int) -> None:
        self.log_path, self.boot_seconds = str(log_path), 30.0
        self.metrics = (
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="16",cache_dtype="auto",num_gpu_blocks="{blocks}",'
            f'kv_cache_size_tokens="{tokens}",kv_cache_max_concurrency="17.05",'
            'kv_cache_memory_bytes="None"} 1.0\n'
        )

    def get(self, path: str) -> str:
        assert path == "/metrics"
        return self.metrics


def gpu_recipe():
    return for_this_host(load_recipe(SMOLLM2), H100)[0]


def measured_base(tmp_path: Path, utilization: float) -> CapacityConfig:
    recipe = gpu_recipe()
    log = tmp_path / boot_log_name(recipe, Boot.BASE)
    log.write_text(GPU_LOG + "INFO Model loading took 0.26 GiB and 1.2 seconds\n")
    spec = ServerSpec(
        model_dir=str(ROOT / "models" / "tiny-llama"),
        serve=recipe.serve.model_copy(update={"gpu_memory_utilization": utilization}),
        kv_cache_dtype="auto",
    )
    return measure_capacity(FakeServer(log, 34_912, 2_182), spec, name=Boot.BASE)


def test_a_measured_row_shows_what_its_boot_held_as_vllm_logged_it(tmp_path):
    row = measured_base(tmp_path, 0.90)
    assert row.source == "measured" and row.kv_cache_tokens == 34_912
    assert row.held.kv_cache_tokens == 34_912 and row.held.gpu_memory_utilization == 0.90
    said = "GPU KV cache size: 34,912 tokens; Maximum concurrency for 2,048 tokens per request: 17.05x"
    assert row.held.vllm_said == said and row.held.log == "vllm-base.log"
    held = f'34,912 tokens at gpu_memory_utilization 0.90 (vLLM: "{said}")'
    assert row.provenance() == f"measured: its boot held {held}"
    assert row.figure().endswith(f'at 2048 tokens: measured (vLLM: "{said}")')
    assert json.loads(row.model_dump_json())["source"] == "measured"
    assert CapacityConfig.model_validate_json(row.model_dump_json()) == row  # report.json reads back


def test_the_base_beside_calibration_is_labelled_derived_from_its_boot(tmp_path):
    """The issue's GPU row: the base served at 0.49 beside calibration held 34,912 tokens; its row at the
    recipe's 0.90 is derived, and every place it shows says from what."""
    recipe, config = gpu_recipe(), json.loads((ROOT / "models/tiny-llama/config.json").read_text())
    boot = measured_base(tmp_path, 0.49)
    row = at_utilization(boot, recipe, config, served_at=0.49, usable_bytes=H100)
    assert row.source == "derived" and row.kv_cache_tokens > boot.kv_cache_tokens
    assert row.held == boot.held  # what the boot held stays with the row
    first = "derived at gpu_memory_utilization 0.90 from its boot at 0.49, which held 34,912 tokens"
    assert row.derived.startswith(first) and 'vLLM: "GPU KV cache size: 34,912 tokens' in row.derived
    assert row.figure().endswith(f": {first}")
    report = CapacityReport(
        method="m", budget_bytes=None, configs=[row], freed_weight_bytes=0, fp8_token_ratio=1,
        gain_quantized=1, gain_fp8=1, planner=[], scheme="W4A16_ASYM",
    )  # fmt: skip
    text = report.markdown()
    assert f"| {row.kv_cache_tokens:,} | " in text and " derived |" in text and f"- base: {first}" in text
    # under a fixed budget (a CPU host) the utilization sizes nothing: the row stays as measured
    cpu = load_recipe(SMOLLM2)
    assert at_utilization(boot, cpu, config, served_at=0.49, usable_bytes=H100) == boot


def test_row_b_derived_from_the_production_boot_names_what_that_boot_held(tmp_path):
    recipe, config = gpu_recipe(), json.loads((ROOT / "models/tiny-llama/config.json").read_text())
    production = measured_base(tmp_path, 0.90).model_copy(
        update={"name": Boot.PRODUCTION, "kv_cache_dtype": "fp8_e4m3", "kv_cache_memory_bytes": 800_000_000}
    )
    row = with_sixteen_bit_kv(production, recipe, config, kv_cache_dtype="bfloat16", usable_bytes=H100)
    assert row.source == "derived" and row.held == production.held
    assert row.derived.startswith(
        "derived from the production boot, which held 34,912 fp8_e4m3 tokens (vLLM: "
    )
    sixteen = production.model_copy(update={"kv_cache_dtype": "auto"})
    same = with_sixteen_bit_kv(sixteen, recipe, config, kv_cache_dtype="auto", usable_bytes=H100)
    assert same.source == "derived" and same.derived.startswith(
        "the production boot's figures, which held 34,912"
    )


def test_a_reused_row_names_its_run_and_what_it_was_there(tmp_path, monkeypatch):
    from quantize_serve.report.base_reference import MeasuredRow, format_key
    from quantize_serve.report.steps import reused_sixteen_bit_kv
    from tests.release_fixtures import placeholder_reference

    validated = validate_recipe(TINY)
    row = measured_base(tmp_path, 0.90).model_copy(update={"name": Boot.QUANTIZED_16BIT_KV})
    reference = placeholder_reference("k", "run-0").model_copy(
        update={"sixteen_bit_kv": {format_key(validated.recipe): MeasuredRow(run_id="run-7", capacity=row)}}
    )
    reused = reused_sixteen_bit_kv(validated.recipe, reference).capacity
    assert reused.source == "reused" and reused.reused_from == "run-7"
    assert reused.provenance().startswith("reused from run run-7: measured: its boot held 34,912 tokens")
    said = "GPU KV cache size: 34,912 tokens; Maximum concurrency for 2,048 tokens per request: 17.05x"
    assert reused.figure().endswith(f': reused from run run-7, measured (vLLM: "{said}")')


# ---- names follow what ran ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, names",
    [
        ({}, ("vllm-base.log", "vllm-w4a16.log", "vllm-w4a16-fp8kv.log")),
        (AVX2_OVERRIDES, ("vllm-base.log", "vllm-w8a8.log", "vllm-w8a8-16bitkv.log")),
        ({"quantization.scheme": "FP8_DYNAMIC", "quantization.method": "rtn"},
         ("vllm-base.log", "vllm-fp8_dynamic.log", "vllm-fp8_dynamic-fp8kv.log")),
        # auto with calibrated KV scales: vLLM serves fp8, and the name says so
        ({"serve.kv_cache_dtype": "auto"}, ("vllm-base.log", "vllm-w4a16.log", "vllm-w4a16-fp8kv.log")),
    ],
)  # fmt: skip
def test_boot_logs_are_named_by_the_runs_scheme_and_kv_dtype(overrides, names, tmp_path):
    from quantize_serve.validate.preflight import ValidatedRecipe
    from tasks.boot import boot_log

    recipe = load_recipe(TINY, overrides)
    assert tuple(boot_log_name(recipe, b) for b in Boot) == names
    validated = ValidatedRecipe(recipe=recipe, source="t", recipe_sha256="0", calibration_fingerprint="0")
    assert [boot_log(validated, tmp_path, b).name for b in Boot] == list(names)
    assert boot_log_name(recipe, Boot.PRODUCTION, kind="shape") == names[2].replace("vllm-", "vllm-shape-")


def test_the_capacity_table_names_a_16_bit_kv_production_row_by_what_it_served():
    rows = [capacity_config(name=b, kv_cache_dtype="auto") for b in Boot]
    report = CapacityReport(
        method="m", budget_bytes=None, configs=rows, freed_weight_bytes=0, fp8_token_ratio=1,
        gain_quantized=1, gain_fp8=1, planner=[], scheme="W8A8", kv_cache_dtype="auto",
        host_note="serve.memory_budget not applied: why",
    )  # fmt: skip
    text = report.markdown()
    assert "| w8a8-16bitkv | auto |" in text and "| w8a8 | auto |" in text and "fp8kv" not in text
    assert "serve.memory_budget not applied: why." in text
    assert report.label(Boot.PRODUCTION) == "w8a8-16bitkv"
