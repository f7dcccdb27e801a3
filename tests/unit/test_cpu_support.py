"""A CPU vLLM cannot serve the quantized boots on (x86 without AVX-512): the run stops at validation
with the reason, before anything is quantized or booted. Runs on every machine: the CPU's flags are
given, not read."""


from __future__ import annotations

import pytest

from quantize_serve.cli import main
from quantize_serve.serving import gpu
from quantize_serve.serving import host as cpu_support
from quantize_serve.serving.host import cpu_flags, quantized_serving_gap
from tests.conftest import ROOT

RECIPE = ROOT / "recipes" / "tiny-llama-awq.yaml"


AVX2_ONLY = frozenset("fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma bmi2".split())


AVX512 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512dq", "avx512vl"}


def test_flags_are_read_from_cpuinfo():
    text = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 fma\nbugs\t\t: sysret_ss_attrs\n"
    assert cpu_flags(text) == {"fpu", "avx2", "fma"}
    assert cpu_flags("no flags line") == frozenset()


@pytest.mark.parametrize("flags, machine, servable", [
    (AVX512, "x86_64", True),
    (AVX2_ONLY | {"amx_tile"}, "x86_64", True),
    (AVX2_ONLY, "x86_64", False),
    (AVX2_ONLY | {"avx512f"}, "x86_64", False),  # vLLM's check wants f, bw, dq and vl
    (frozenset({"fp", "asimd"}), "aarch64", True),  # not ours to judge
])
def test_which_cpus_serve_the_quantized_boots(flags, machine, servable):
    gap = quantized_serving_gap(flags, machine=machine)
    assert (gap is None) is servable
    if gap:
        assert "no AVX-512" in gap and "W4A16" in gap and "fp8 KV" in gap


@pytest.fixture
def avx2_host(monkeypatch):
    """This machine as an AVX2-only x86 CPU host (no GPU)."""
    monkeypatch.setattr(cpu_support, "cpu_flags", lambda cpuinfo=None: AVX2_ONLY)
    monkeypatch.setattr(cpu_support.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(gpu, "usable_memory_bytes", lambda index=0: None)


def test_run_on_such_a_cpu_stops_before_prefect(avx2_host, capsys):
    assert main(["run", str(RECIPE)]) == 2
    err = capsys.readouterr().err
    assert "serve" in err and "no AVX-512" in err and "run on a GPU host" in err


def test_plan_measure_on_such_a_cpu_is_refused_up_front(avx2_host, capsys):
    assert main(["plan", str(RECIPE), "--measure"]) == 2
    assert "no AVX-512" in capsys.readouterr().err
