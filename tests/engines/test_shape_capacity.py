"""Capacity of a model shape before its weights are downloaded: REAL vLLM boots with
``--load-format dummy`` (config.json and tokenizer only), from the command line
(``quantize-serve plan RECIPE --measure``) and as the flow's ``serve.preflight: measure``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantize_serve.serving.spec import capacity_spec, checkpoint_tensor_bytes
from quantize_serve.cli import main
from quantize_serve.serving.boot import Boot
from tests.conftest import ROOT, vllm_processes_of

TINY = ROOT / "models" / "tiny-llama"


RECIPE = ROOT / "recipes" / "tiny-llama-awq.yaml"


@pytest.mark.w4a16_serving
@pytest.mark.fp8_kv_serving
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
    assert (
        rows["w4a16-fp8kv"]["measured"]["kv_cache_tokens"]
        >= 2 * rows["w4a16"]["measured"]["kv_cache_tokens"] - 128
    )
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
