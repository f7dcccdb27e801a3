"""Capacity of a model shape before its weights are downloaded: REAL vLLM boots with
``--load-format dummy`` (config.json and tokenizer only), from the command line
(``quantize-serve plan RECIPE --measure``) and as the flow's ``serve.preflight: measure``.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from huggingface_hub import HfApi
from huggingface_hub import constants as hf_constants

from localhub.server import start_local_hub
from quantize_serve.serving.boot import Boot
from quantize_serve.capacity.measure import capacity_spec, checkpoint_tensor_bytes
from quantize_serve.cli import main
from quantize_serve.core.settings import get_settings
from quantize_serve.capacity.shape import quantization_config
from tests.conftest import ROOT, use_local_hub_client, vllm_processes_of

TINY = ROOT / "models" / "tiny-llama"
RECIPE = ROOT / "recipes" / "tiny-llama-awq.yaml"
WRITE = "hf_WriteTokenForShapeCapacityTests0123456"


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


@pytest.mark.e2e
@pytest.mark.quantized_serving
@pytest.mark.timeout(420)
def test_plan_measure_boots_the_shape_without_weights(awq_recipe, awq_checkpoint, tmp_path, capsys):
    out = tmp_path / "plan"
    assert main(["plan", str(RECIPE), "--measure", "--out", str(out), "--json"]) == 0
    assert '"rows"' in capsys.readouterr().out  # --json prints the result
    result = json.loads((out / "shape-capacity.json").read_text())
    rows = {r["name"]: r for r in result["rows"]}
    assert list(rows) == [str(b) for b in Boot] and not any(r["refused"] for r in rows.values())
    budget = int(awq_recipe.serve.memory_budget)
    for boot in Boot:
        row, measured = rows[boot], rows[boot]["measured"]
        # vLLM's own figures, by independent arithmetic: tiny Llama KV per token = 2 (K, V) x 4 layers
        # x 64 (2 KV heads x 32) x 2 B (bf16) = 1,024 B, half with fp8; blocks of 128 tokens (CPU).
        per_token = 1024 if boot.sixteen_bit_kv else 512
        kv_bytes = budget - row["planned"]["weights_bytes"]
        assert measured["kv_cache_memory_bytes"] == kv_bytes
        assert measured["kv_cache_tokens"] == kv_bytes // (128 * per_token) * 128
        assert row["error_pct"] == 0.0
        # The same capacity the real checkpoint gets, to within one block: only the weight bytes differ
        # (the planner's arithmetic here, the checkpoint's tensors there).
        real = Path(TINY if boot is Boot.BASE else awq_checkpoint.checkpoint_dir)
        real_kv = capacity_spec(awq_recipe, boot, real).kv_cache_memory_bytes
        assert abs(real_kv - kv_bytes) < 128 * per_token, (boot, real_kv, kv_bytes)
    assert rows["w4a16-fp8kv"]["measured"]["kv_cache_tokens"] >= 2 * rows["w4a16"]["measured"]["kv_cache_tokens"] - 128
    # Both shape folders hold no weights; the quantized one carries the compressed-tensors config.
    for folder in ("shape-base", "shape-w4a16"):
        assert checkpoint_tensor_bytes(out / folder) == 0 and (out / folder / "tokenizer.json").is_file()
    assert "quantization_config" in json.loads((out / "shape-w4a16" / "config.json").read_text())
    logs = {p.name: p.read_text() for p in out.glob("vllm-shape-*.log")}
    assert len(logs) == 3 and all("--load-format dummy" in t for t in logs.values())
    md = (out / "shape-capacity.md").read_text()
    assert "Weights are random" in md and "w4a16-fp8kv" in md
    assert (out / "shape-capacity.png").stat().st_size > 1000
    assert not [p for log in out.glob("vllm-shape-*.log") for p in vllm_processes_of(str(log))]


def test_measure_needs_a_recipe_and_no_gpu_preset(capsys):
    assert main(["plan", "--model", str(TINY), "--measure"]) == 2
    err = capsys.readouterr().err
    assert "needs a RECIPE" in err and "quantize-serve plan RECIPE --measure" in err
    assert main(["plan", str(RECIPE), "--measure", "--gpu", "h200"]) == 2
    assert "--gpu only applies to a prediction" in capsys.readouterr().err


@pytest.fixture
def hub_base(tmp_path, monkeypatch):
    """The tiny Llama as a private repo on a local hub; this test's client, work cache and token."""
    with start_local_hub(tmp_path / "hub", tokens=(WRITE,)) as hub:
        use_local_hub_client(monkeypatch, hub.endpoint, tmp_path / "hf-cache")
        repo = f"org/tiny-llama-{uuid.uuid4().hex[:8]}"
        api = HfApi(endpoint=hub.endpoint, token=WRITE)
        api.create_repo(repo, private=True)
        api.upload_folder(folder_path=TINY, repo_id=repo)
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setenv("QS_SHAPE_TEST_TOKEN", WRITE)
        monkeypatch.setenv("QS_WORK_DIR", str(tmp_path / "work"))
        monkeypatch.setenv("QS_RUNS_DIR", str(tmp_path / "runs"))
        get_settings.cache_clear()
        yield repo
        get_settings.cache_clear()


@pytest.mark.e2e
@pytest.mark.flow
@pytest.mark.timeout(420)
def test_preflight_stops_the_flow_before_the_weights_are_downloaded(hub_base, tmp_path, monkeypatch):
    """serve.preflight: measure with a budget the production configuration cannot use: the run fails
    with vLLM's reason, having fetched config and tokenizer only, quantized nothing, left no vLLM.
    Every boot is refused before it serves a request, so this runs on any CPU: the host check that
    would stop the run earlier on a CPU without AVX-512 is the one thing set aside (its own tests:
    tests/test_cpu_support.py), and there vLLM refuses the fp8 boot for that reason instead."""
    from flows.pipeline import quantize_serve
    from quantize_serve.serving import host as cpu_support

    monkeypatch.setattr(cpu_support, "quantized_serving_gap", lambda *a, **k: None)
    overrides = {"model.id": hub_base, "hub.token_env": "QS_SHAPE_TEST_TOKEN", "serve.preflight": "measure",
                 "serve.memory_budget": "1MiB"}
    state = quantize_serve(str(RECIPE), overrides, return_state=True)
    assert state.is_failed()
    message = state.message or ""
    assert "production configuration (w4a16-fp8kv, TP 1) does not fit" in message, message
    assert "Nothing was downloaded or quantized" in message
    work = tmp_path / "work"
    fetched = sorted(p.name for p in (work / "hub").rglob("*") if p.is_file() and "snapshots" in p.parts)
    assert "config.json" in fetched and "tokenizer.json" in fetched
    assert not [name for name in fetched if name.endswith(".safetensors")]
    assert not (work / "checkpoints").exists() or not any((work / "checkpoints").iterdir())
    runs = list((tmp_path / "runs").rglob("shape-capacity.md"))
    table = runs[0].read_text()  # production booted first; refused, so nothing else was booted
    assert "| w4a16-fp8kv (" in table and "refused by vLLM" in table
    assert table.count("not booted: production was refused first") == 2
    logs = list((tmp_path / "runs").rglob("vllm-shape-*.log"))
    assert [p.name for p in logs] == ["vllm-shape-w4a16-fp8kv.log"]
    assert not vllm_processes_of(str(logs[0]))
