"""The soak gate on the real vLLM CPU server (the trend fit and the verdict: tests/unit/test_soak.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from quantize_serve.gates.soak import (
    MIB,
    run_soak_test,
)
from quantize_serve.recipe.gates import MIN_SOAK_SAMPLES, SoakGate
from tests.conftest import ROOT, vllm_processes_of

MODEL = ROOT / "models" / "tiny-llama"


E2E_GATE = SoakGate(
    duration_s=20,
    warmup_s=5,
    sample_interval_s=1,
    concurrency=4,
    prompt_tokens=[16, 64],
    output_tokens=[16, 32],
    max_memory_growth_mib_per_min=50,
    max_preemptions_after_warmup=0,
    request_timeout_s=60,
)


LEAK_MIB_PER_S = 5  # 300 MiB/min, six times E2E_GATE's threshold


# Loaded by every Python started with this folder on PYTHONPATH; leaks only in the API-server process.
LEAK_SITECUSTOMIZE = textwrap.dedent("""\
    import os, sys, threading, time

    _rate = float(os.environ.get("QS_TEST_LEAK_MIB_PER_S") or 0)
    if _rate > 0 and "vllm.entrypoints.openai.api_server" in getattr(sys, "orig_argv", []):
        _held = []

        def _leak():
            start = time.monotonic()
            while True:  # paced by the clock: the MiB due by now, whatever the machine's speed
                while len(_held) < int(_rate * (time.monotonic() - start)):
                    _held.append(b"\\xa5" * 2**20)  # written bytes, so the pages count in RSS
                time.sleep(0.1)

        threading.Thread(target=_leak, name="qs-test-leak", daemon=True).start()
""")


def show(result) -> str:
    f, t = result.figures, result.traffic
    return (
        f"RSS slope={f.rss_slope_mib_per_min} MiB/min over {f.fit_window_s}s "
        f"({f.rss_after_warmup_bytes}->{f.rss_last_bytes}), samples={f.samples}/{f.samples_after_warmup}, "
        f"completed={t.completed}/{t.completed_after_warmup} failed={t.failed} peak "
        f"KV={f.peak_kv_cache_usage} preemptions={f.preemptions}/{f.preemptions_after_warmup} "
        f"measured={result.measured_s}s failures={result.failures}"
    )


def check_outputs(result, out: Path) -> None:
    lines = (out / "soak-samples.jsonl").read_text().splitlines()
    assert len(lines) == result.figures.samples >= E2E_GATE.duration_s / E2E_GATE.sample_interval_s / 2
    assert (out / "soak.png").stat().st_size > 10_000 and result.chart_path == str(out / "soak.png")
    assert (out / "soak_result.json").is_file()


@pytest.mark.timeout(420)  # includes the shared fixtures: a cold cache quantizes the checkpoint first
def test_soak_passes_on_the_production_boot(
    awq_fp8_server, awq_recipe, awq_checkpoint, tmp_path: Path
) -> None:
    server, _ = awq_fp8_server
    result = run_soak_test(
        server,
        E2E_GATE,
        awq_recipe.serve,
        stress=awq_recipe.gates.stress,
        tokenizer_dir=awq_checkpoint.checkpoint_dir,
        output_dir=tmp_path / "soak",
    )
    print(show(result))
    assert result.passed, result.failures
    f = result.figures
    assert f.samples_after_warmup >= MIN_SOAK_SAMPLES and abs(f.rss_slope_mib_per_min) < 50
    assert f.gpu_slope_mib_per_min is None and f.peak_gpu_memory_bytes is None  # CPU: no NVML
    assert f.peak_rss_bytes and f.peak_rss_bytes > 100 * MIB
    assert f.peak_kv_cache_usage and f.peak_kv_cache_usage > 0 and f.preemptions_after_warmup == 0
    assert result.traffic.completed_after_warmup > 0 and result.traffic.failed == 0
    assert E2E_GATE.duration_s <= result.measured_s < E2E_GATE.duration_s + 5
    check_outputs(result, tmp_path / "soak")


@pytest.mark.timeout(240)
def test_soak_fails_on_a_real_leak(awq_recipe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from quantize_serve.serving.spec import capacity_spec
    from quantize_serve.serving.boot import Boot
    from quantize_serve.serving.server import vllm_server

    site = tmp_path / "leak-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(LEAK_SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", str(site))  # serving_env() copies os.environ into this boot only
    monkeypatch.setenv("QS_TEST_LEAK_MIB_PER_S", str(LEAK_MIB_PER_S))
    log_path = tmp_path / "vllm-leak.log"
    with vllm_server(capacity_spec(awq_recipe, Boot.BASE, MODEL), log_path=log_path) as server:
        result = run_soak_test(
            server, E2E_GATE, awq_recipe.serve, tokenizer_dir=str(MODEL), output_dir=tmp_path / "soak"
        )
    print(show(result))
    assert not result.passed and not result.server_died
    slope = result.figures.rss_slope_mib_per_min
    assert slope is not None and slope > LEAK_MIB_PER_S * 60 / 2, slope  # most of the injected 300 MiB/min
    assert len(result.failures) == 1, result.failures
    assert f"grew {slope:.1f} MiB/min" in result.failures[0]
    assert "max_memory_growth_mib_per_min=50" in result.failures[0]
    assert result.traffic.failed == 0 and result.traffic.completed_after_warmup > 0  # the server still works
    check_outputs(result, tmp_path / "soak")
    assert not vllm_processes_of(str(log_path)), "the leaking boot left processes behind"
