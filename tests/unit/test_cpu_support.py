"""A CPU whose vLLM cannot serve W4A16 or an fp8 KV cache (x86 without AVX-512): an explicit recipe
that asks for them stops at validation with the reason, before anything is quantized or booted; the
demo and the test suite switch to what it serves (INT8 W8A8 with a 16-bit KV cache), and the
capacity table shows the fp8-KV row as not available. Runs on every machine: the CPU's flags are
given, not read (``avx2_host``, tests/conftest.py)."""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest

from quantize_serve.capacity.measure import CapacityConfig, summarize_capacity
from quantize_serve.cli import main
from quantize_serve.core.errors import RecipeError
from quantize_serve.recipe.load import load_recipe
from quantize_serve.serving import host as cpu_support
from quantize_serve.serving.host import (
    AVX2_OVERRIDES,
    cpu_flags,
    cpu_serving_gap,
    servable_overrides,
)
from quantize_serve.validate.preflight import check_serving_host, production_kv_dtype
from scripts import demo
from tests.conftest import AVX2_ONLY, ROOT
from tests.release_fixtures import capacity_config

RECIPE = ROOT / "recipes" / "tiny-llama-awq.yaml"


AVX512 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512dq", "avx512vl"}


def test_flags_are_read_from_cpuinfo():
    text = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 fma\nbugs\t\t: sysret_ss_attrs\n"
    assert cpu_flags(text) == {"fpu", "avx2", "fma"}
    assert cpu_flags("no flags line") == frozenset()


@pytest.mark.parametrize(
    "flags, machine, servable",
    [
        (AVX512, "x86_64", True),
        (AVX2_ONLY | {"amx_tile"}, "x86_64", True),
        (AVX2_ONLY, "x86_64", False),
        (AVX2_ONLY | {"avx512f"}, "x86_64", False),  # vLLM's check wants f, bw, dq and vl
        (frozenset({"fp", "asimd"}), "aarch64", True),  # not ours to judge
    ],
)
def test_which_cpus_serve_the_quantized_boots(flags, machine, servable):
    gap = cpu_serving_gap("W4A16", "fp8", flags, machine=machine)
    assert (gap is None) is servable
    if gap:
        assert "no AVX-512" in gap and "W4A16" in gap and "fp8 KV" in gap


@pytest.mark.parametrize(
    "scheme, kv, needs",
    [
        ("W8A8", "auto", None),
        ("FP8_DYNAMIC", "auto", None),
        (None, "auto", None),  # what the AVX2 build serves
        ("W4A16", "auto", "W4A16 checkpoints"),
        ("W4A16_ASYM", None, "W4A16_ASYM checkpoints"),
        ("W8A8", "fp8", "fp8 KV caches"),
        (None, "fp8_e4m3", "fp8 KV caches"),
        ("W4A16", "fp8", "W4A16 checkpoints and fp8 KV caches"),
    ],
)
def test_an_avx2_cpu_serves_int8_and_fp8_weights_with_a_16_bit_kv_cache(scheme, kv, needs):
    gap = cpu_serving_gap(scheme, kv, AVX2_ONLY, machine="x86_64")
    assert gap is None if needs is None else f"serves {needs} only with its AVX-512 kernels" in gap
    assert cpu_serving_gap(scheme, kv, AVX512, machine="x86_64") is None


def test_the_suite_and_the_demo_switch_to_w8a8_with_16_bit_kv_only_on_such_a_cpu(avx2_host, monkeypatch):
    """What tests/conftest.py's session fixtures quantize and serve (SERVING_OVERRIDES): the shipped
    recipe on a CPU that serves it, INT8 W8A8 (SmoothQuant + GPTQ) with a 16-bit KV cache on one that
    does not; that recipe validates there."""
    overrides, why = servable_overrides()
    assert overrides == AVX2_OVERRIDES and "no AVX-512" in why
    recipe = load_recipe(RECIPE, overrides)
    q = recipe.quantization
    assert (q.method, q.scheme, q.kv_cache_scales, recipe.serve.kv_cache_dtype) == (
        "smoothquant-gptq",
        "W8A8",
        False,
        "auto",
    )
    check_serving_host(recipe, source="recipe.yaml")  # passes: the AVX2 build serves it
    monkeypatch.setattr(cpu_support, "cpu_flags", lambda cpuinfo=None: AVX512)
    assert servable_overrides() == ({}, None)


@pytest.mark.parametrize(
    "overrides, refused",
    [
        ({}, "W4A16_ASYM checkpoints and fp8 KV caches"),  # the shipped recipe, as it is
        ({"serve.kv_cache_dtype": "auto", "quantization.kv_cache_scales": False}, "W4A16_ASYM checkpoints"),
        ({"quantization.method": "smoothquant-gptq", "quantization.scheme": "W8A8"}, "fp8 KV caches"),
        # auto with calibrated KV scales in the checkpoint: vLLM resolves it to fp8
        (
            {
                "quantization.method": "rtn",
                "quantization.scheme": "FP8_DYNAMIC",
                "serve.kv_cache_dtype": "auto",
            },
            "fp8 KV caches",
        ),
    ],
)
def test_an_explicit_recipe_this_cpu_cannot_serve_is_refused_with_the_reason(avx2_host, overrides, refused):
    recipe = load_recipe(RECIPE, overrides)
    with pytest.raises(RecipeError) as info:
        check_serving_host(recipe, source="recipe.yaml")
    message = str(info.value)
    assert f"serves {refused} only with its AVX-512 kernels" in message
    assert "run on a GPU host" in message and "smoothquant-gptq" in message and "W8A8" in message


def test_candidates_are_checked_one_by_one(avx2_host):
    servable = {
        "quantization.kv_cache_scales": False,
        "serve.kv_cache_dtype": "auto",
        "quantization.method": None,
        "quantization.scheme": "W8A8",
        "quantization.candidates": [
            {"name": "int8", "method": "smoothquant-gptq"},
            {"name": "fp8", "method": "rtn", "scheme": "FP8_DYNAMIC"},
        ],
    }
    check_serving_host(load_recipe(RECIPE, servable), source="r.yaml")
    with_4bit = {
        **servable,
        "quantization.candidates": [
            {"name": "int8", "method": "smoothquant-gptq"},
            {"name": "awq", "method": "awq", "scheme": "W4A16"},
        ],
    }
    with pytest.raises(RecipeError, match="W4A16 checkpoints only with its AVX-512 kernels"):
        check_serving_host(load_recipe(RECIPE, with_4bit), source="r.yaml")
    hub = {**servable, "quantization.candidates": [{"name": "hub", "checkpoint": "org/some-awq"}]}
    with pytest.raises(RecipeError, match="its scheme is read only once it is downloaded"):
        check_serving_host(load_recipe(RECIPE, hub), source="r.yaml")


def test_production_kv_dtype_is_fp8_for_auto_with_calibrated_scales():
    assert production_kv_dtype(load_recipe(RECIPE)) == "fp8"
    assert production_kv_dtype(load_recipe(RECIPE, {"serve.kv_cache_dtype": "auto"})) == "fp8"
    assert production_kv_dtype(load_recipe(RECIPE, AVX2_OVERRIDES)) == "auto"


def test_run_on_such_a_cpu_stops_before_prefect(avx2_host, capsys):
    assert main(["run", str(RECIPE)]) == 2
    err = capsys.readouterr().err
    assert "serve" in err and "no AVX-512" in err and "run on a GPU host" in err


def test_plan_measure_on_such_a_cpu_is_refused_up_front(avx2_host, capsys):
    assert main(["plan", str(RECIPE), "--measure"]) == 2
    assert "no AVX-512" in capsys.readouterr().err


class FakeStack:
    """scripts.local_stack's stack, recording the deployment run instead of starting servers."""

    api_url, hub_endpoint = "http://127.0.0.1:1/api", "http://127.0.0.1:2"
    runs: list = []

    def run_deployment(self, name, *, echo=None, params=None):
        self.runs.append((name, params))
        return 0, "", "run-id"


@contextmanager
def fake_stack(home, *, hub_token):
    yield FakeStack()


def test_the_demo_says_in_one_line_that_it_switches_to_w8a8_and_runs_it(avx2_host, monkeypatch, capsys):
    monkeypatch.setattr(demo, "local_stack", fake_stack)
    monkeypatch.setattr(demo, "latest_report", lambda name: None)
    FakeStack.runs = []
    assert demo.main() == 0
    out = capsys.readouterr().out.splitlines()
    switch = [line for line in out if "W8A8" in line]
    assert len(switch) == 1 and switch[0] == out[0] and switch[0].startswith("demo: this CPU has no AVX-512")
    assert "16-bit KV cache" in switch[0]
    ((name, params),) = FakeStack.runs
    overrides = json.loads(params["overrides"])  # what `prefect deployment run --param` carries to the flow
    assert name == "tiny-awq" and overrides == {**AVX2_OVERRIDES, **demo.W8A8_NAMES}
    recipe = load_recipe(RECIPE, overrides)
    assert recipe.name == "tiny-llama-w8a8" and recipe.hub.repo_id == "quantize-serve/tiny-llama-w8a8"


def test_the_demo_runs_the_recipe_as_it_is_where_the_cpu_serves_it(avx2_host, monkeypatch, capsys):
    monkeypatch.setattr(cpu_support, "cpu_flags", lambda cpuinfo=None: AVX512)
    monkeypatch.setattr(demo, "local_stack", fake_stack)
    monkeypatch.setattr(demo, "latest_report", lambda name: None)
    FakeStack.runs = []
    assert demo.demo_overrides() == ({}, None)
    assert demo.main() == 0
    assert FakeStack.runs == [("tiny-awq", None)] and "W8A8" not in capsys.readouterr().out


def capacity_row(name: str, kv: str, weights: int, tokens: int) -> CapacityConfig:
    return capacity_config(
        name=name,
        kv_cache_dtype=kv,
        weights_bytes=weights,
        kv_cache_memory_bytes=8_388_608 - weights,
        kv_cache_tokens=tokens,
        block_size=128,
    )


def test_the_capacity_table_shows_fp8_kv_as_not_available_on_such_a_cpu(avx2_host):
    """The W8A8 run's three boots: base, 16-bit KV, and the production boot, which served a 16-bit KV
    cache too. The table keeps two measured rows and says why the fp8-KV one is not there."""
    recipe = load_recipe(RECIPE, AVX2_OVERRIDES)
    base_config = json.loads((ROOT / "models" / "tiny-llama" / "config.json").read_text())
    configs = [
        capacity_row("base", "auto", 2_099_456, 6016),
        capacity_row("w4a16", "auto", 1_300_000, 6784),
        capacity_row("w4a16-fp8kv", "auto", 1_300_000, 6784),
    ]
    why = cpu_support.serving_host_gap(None, "fp8")
    report = summarize_capacity(recipe, configs, base_config, fp8_kv_unavailable=why)
    assert [c.name for c in report.configs] == ["base", "w4a16"] and [p.name for p in report.planner] == [
        "base",
        "w4a16",
    ]
    assert report.fp8_token_ratio is None and report.gain_fp8 is None and report.fp8_kv_unavailable == why
    md = report.markdown()
    assert (
        "| w8a8-fp8kv | fp8 | - | - | not available on this CPU: this CPU has no AVX-512 (avx512bw, "
        "avx512dq, avx512f, avx512vl missing): vLLM's CPU backend serves fp8 KV caches only with its "
        "AVX-512 kernels"
    ) in md
    assert (
        "| w8a8 | auto |" in md and "w8a8 x1.13, fp8 KV not available on this CPU" in md
    )  # rows named by scheme
    # measured in fp8 after all (a CPU that has it): the reason is not shown
    fp8 = configs[:2] + [capacity_row("w4a16-fp8kv", "fp8", 1_300_000, 13696)]
    measured = summarize_capacity(load_recipe(RECIPE), fp8, base_config, fp8_kv_unavailable=why)
    assert (
        len(measured.configs) == 3
        and measured.fp8_kv_unavailable is None
        and "not available" not in measured.markdown()
    )
