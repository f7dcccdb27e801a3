"""benchmarks/pipeline_vs_manual.py on each kind of host: it runs what the host serves, as the demo chooses
(scripts/demo.py), or refuses in one line. No boot here: the host's flags are given (tests/conftest.py)."""

from __future__ import annotations

import importlib.util

import pytest

from quantize_serve.recipe.load import load_recipe
from quantize_serve.serving import host
from tests.conftest import ROOT


def driver():
    spec = importlib.util.spec_from_file_location(
        "pipeline_vs_manual", ROOT / "benchmarks/pipeline_vs_manual.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_avx2_cpu_runs_both_paths_as_int8_w8a8_with_a_16_bit_kv_cache(avx2_host):
    bench = driver()
    overrides, why = bench.host_choice()
    assert overrides["quantization.scheme"] == "W8A8" and overrides["serve.kv_cache_dtype"] == "auto"
    assert why and "no AVX-512" in why
    recipe = load_recipe(bench.RECIPE, overrides)
    assert host.cpu_serving_gap(recipe.quantization.scheme, recipe.serve.kv_cache_dtype) is None
    data = bench.with_overrides({"serve": {"kv_cache_dtype": "fp8"}, "name": "x"}, overrides)
    assert data["serve"]["kv_cache_dtype"] == "auto" and data["quantization"]["scheme"] == "W8A8"


def test_a_host_that_serves_not_even_that_is_refused_in_one_line(avx2_host, monkeypatch, capsys):
    bench = driver()
    monkeypatch.setattr(
        host, "cpu_serving_gap", lambda scheme, kv, flags=None, machine=None: "no kernel here"
    )
    with pytest.raises(SystemExit) as refused:
        bench.host_choice()
    err = capsys.readouterr().err
    assert refused.value.code == 2 and err.count("\n") == 1
    recipe = "recipes/tiny-llama-awq.yaml"
    assert err.startswith(
        f"pipeline_vs_manual.py: this host cannot serve {recipe} as the demo runs it: no kernel"
    )
