"""Every live driver runs on each host the project supports (an x86 CPU with AVX-512, one with AVX2 only, an
NVIDIA GPU host) or refuses in one line (issue 73, item 5): a GPU driver started without a GPU, or whose CPU
mode this CPU cannot serve, says so on one line of stderr and exits 2 before any heavy work
(benchmarks/harness.py require_gpu); a driver that serves a model on a CPU takes the demo's choice or refuses
(serving_choice, servable). No boot and no model here: the hosts are given (tests/conftest.py)."""

from __future__ import annotations

import re

import pytest

from benchmarks import harness
from quantize_serve.serving import gpu
from tests.conftest import ROOT, as_cpu_host

AVX512 = frozenset({"avx2", "avx512f", "avx512bw", "avx512dq", "avx512vl"})
# Besides the scenarios' drivers and `make bench`'s: the live drivers run by hand
BY_HAND = (
    "gate_statistics.py",
    "flip_rates.py",
    "pipeline_vs_manual.py",
    "reliability.py",
    "validate_cli.py",
)
HOST_CHECKS = ("require_gpu(", "serving_choice(", "servable(", "refuse(")


def live_drivers() -> list[str]:
    scenarios = [
        m[1]
        for path in sorted((ROOT / "benchmarks/scenarios").glob("*.yaml"))
        if (m := re.search(r"^driver:\s*benchmarks/(\S+\.py)", path.read_text(), re.M))
    ]
    bench = re.search(r"for b in ([\w ]+); do \$\(PY\) benchmarks/\$\$b\.py", (ROOT / "Makefile").read_text())
    assert bench, "make bench's driver loop moved: read its drivers here"
    return sorted({*scenarios, *(f"{b}.py" for b in bench[1].split()), *BY_HAND})


def refusal(capsys, run) -> str:
    with pytest.raises(SystemExit) as refused:
        run()
    err = capsys.readouterr().err
    assert refused.value.code == 2, refused.value.code
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_every_live_driver_checks_its_host_or_runs_on_any():
    drivers = live_drivers()
    assert {"h200.py", "capacity.py", "gates.py", "shape_capacity.py", "flip_rates.py"} <= set(drivers)
    unchecked = [
        d
        for d in drivers
        if d not in harness.ANY_HOST
        and not any(c in (ROOT / "benchmarks" / d).read_text() for c in HOST_CHECKS)
    ]
    assert not unchecked, (
        f"call harness.require_gpu or serving_choice, or name it in harness.ANY_HOST: {unchecked}"
    )
    assert set(harness.ANY_HOST) <= set(drivers), "ANY_HOST names a driver that is no live driver"
    hosts = (ROOT / "benchmarks/results/README.md").read_text()
    assert all(f"`{d}" in hosts for d in drivers), (
        "benchmarks/results/README.md: which hosts each driver runs on"
    )


@pytest.mark.parametrize(
    "driver, on_cpu",
    [("h200.py run", "--rehearse runs it on this CPU"), ("quantize_speed.py --gpu", None)],
)
def test_a_gpu_driver_without_a_gpu_is_refused_in_one_line(driver, on_cpu, monkeypatch, capsys):
    as_cpu_host(monkeypatch, AVX512)
    err = refusal(capsys, lambda: harness.require_gpu(driver, on_cpu))
    assert err.startswith(f"{driver}: no NVIDIA GPU seen (NVML finds none")
    assert "run it on a GPU host (scripts/gpu/README.md)" in err
    assert (f", or: {on_cpu}" in err) if on_cpu else (", or:" not in err)


def test_a_gpu_host_passes_and_its_cpu_mode_is_checked_against_this_cpu(avx2_host, monkeypatch, capsys):
    err = refusal(capsys, lambda: harness.require_gpu("shape_capacity.py", "--rehearse", rehearsing=True))
    assert err.startswith(
        "shape_capacity.py: its CPU mode serves W4A16 weights with a fp8 KV cache, and this CPU"
    )
    harness.require_gpu(
        "h200_schemes.py", rehearsing=True, serves=("W8A8", "auto")
    )  # the AVX2 build serves it
    harness.require_gpu("gpu_smoke.py", rehearsing=True, serves=None)  # --dry-run serves nothing
    monkeypatch.setattr(gpu, "usable_memory_bytes", lambda index=0: 80 * 2**30)
    harness.require_gpu("activation_peak.py")
    harness.require_gpu("activation_peak.py", rehearsing=True)  # vLLM serves on the GPU there


def test_a_driver_that_serves_takes_the_demos_choice_on_an_avx2_cpu(avx2_host):
    recipe = ROOT / "recipes/tiny-llama-awq.yaml"
    overrides, why = harness.serving_choice("capacity.py", recipe, as_demo=True)
    assert overrides["quantization.scheme"] == "W8A8" and overrides["serve.kv_cache_dtype"] == "auto"
    assert why and "no AVX-512" in why


def test_recipes_compared_as_written_are_refused_on_an_avx2_cpu(avx2_host, capsys):
    recipe = ROOT / "recipes/tiny-llama-formats.yaml"
    err = refusal(capsys, lambda: harness.serving_choice("schemes.py", recipe, as_demo=False))
    assert err.startswith(
        "schemes.py: this host cannot serve recipes/tiny-llama-formats.yaml: this CPU has no AVX"
    )
    assert err.rstrip().endswith(harness.AVX512_FIX)


def test_an_avx512_cpu_serves_the_recipes_as_written(monkeypatch):
    as_cpu_host(monkeypatch, AVX512)
    assert harness.serving_choice("gates.py", ROOT / "recipes/tiny-llama-gptq.yaml", as_demo=False) == (
        {},
        None,
    )


def test_flip_rates_keeps_the_candidates_this_cpu_serves(avx2_host, capsys):
    offered = {"awq-w4a16-g64": "W4A16_ASYM", "int8-w8a8": "W8A8", "base-rerun": None}
    kept, left = harness.servable("flip_rates.py", offered, "auto")
    assert kept == ["int8-w8a8", "base-rerun"] and left.startswith(
        "flip_rates.py: left out awq-w4a16-g64: this CPU"
    )
    err = refusal(capsys, lambda: harness.servable("flip_rates.py", {"awq-w4a16-g64": "W4A16_ASYM"}, "fp8"))
    assert err.startswith("flip_rates.py: this host serves none of awq-w4a16-g64: this CPU has no AVX-512")
