"""`serve.preflight: measure` in the flow, from a Hub base model: the shape's capacity measured
with dummy weights before the weights are downloaded."""

from __future__ import annotations

import uuid

import pytest
from huggingface_hub import HfApi
from huggingface_hub import constants as hf_constants

from quantize_serve.core.settings import get_settings
from tests.conftest import ROOT, local_hub_server, use_local_hub_client, vllm_processes_of

TINY = ROOT / "models" / "tiny-llama"


RECIPE = ROOT / "recipes" / "tiny-llama-awq.yaml"


WRITE = "hf_WriteTokenForShapeCapacityTests0123456"


@pytest.fixture
def hub_base(tmp_path, monkeypatch):
    """The tiny Llama as a private repo on a local hub; this test's client, work cache and token."""
    with local_hub_server(tmp_path, tokens=(WRITE,)) as hub:
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


@pytest.mark.timeout(420)
def test_preflight_stops_the_flow_before_the_weights_are_downloaded(hub_base, tmp_path, monkeypatch):
    """serve.preflight: measure with a budget the production configuration cannot use: the run fails
    with vLLM's reason, having fetched config and tokenizer only, quantized nothing, left no vLLM.
    Every boot is refused before it serves a request, so this runs on any CPU: the host check that
    would stop the run earlier on a CPU without AVX-512 is the one thing set aside (its own tests:
    tests/unit/test_cpu_support.py), and there vLLM refuses the fp8 boot for that reason instead."""
    from flows.pipeline import quantize_serve
    from quantize_serve.serving import host as cpu_support

    monkeypatch.setattr(cpu_support, "cpu_serving_gap", lambda *a, **k: None)
    overrides = {
        "model.id": hub_base,
        "hub.token_env": "QS_SHAPE_TEST_TOKEN",
        "serve.preflight": "measure",
        "serve.memory_budget": "1MiB",
    }
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
