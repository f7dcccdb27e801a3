"""A CPU whose vLLM cannot serve a recipe's quantized boots: the flow stops at validation, before
any heavy work (the host checks: tests/unit/test_cpu_support.py)."""

from __future__ import annotations

from tests.conftest import ROOT

RECIPE = ROOT / "recipes" / "tiny-llama-awq.yaml"


def test_the_flow_stops_at_validation_on_such_a_cpu(avx2_host, tmp_path, monkeypatch):
    from flows.pipeline import quantize_serve
    from quantize_serve.core.settings import get_settings

    monkeypatch.setenv("QS_WORK_DIR", str(tmp_path / "work"))
    get_settings.cache_clear()
    try:
        state = quantize_serve(str(RECIPE), return_state=True)
    finally:
        get_settings.cache_clear()
    assert state.is_failed() and "no AVX-512" in (state.message or ""), state.message
    assert not (tmp_path / "work" / "checkpoints").exists()  # stopped before quantizing
