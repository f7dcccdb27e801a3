"""Soak gate: the trend fit and the verdict on synthetic series, the recipe section, the decision
row; then the real vLLM CPU server: a short soak on the production boot passes, and the same soak
against a server with a real injected leak (a thread in the API-server process that holds more
memory every second) fails with the measured slope.

The e2e verdicts do not depend on machine speed: the leak is paced by the clock (MiB per second),
and its rate (5 MiB/s = 300 MiB/min) is six times the threshold (50 MiB/min), which a server
without a leak stays far below.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

from quantize_serve.core.errors import RecipeErrors
from quantize_serve.gates.decision import decide, soak_row
from quantize_serve.gates.soak import (
    MIB,
    SoakResult,
    SoakTraffic,
    fit_slope,
    judge_soak,
    soak_chart,
    soak_figures,
)
from quantize_serve.recipe.gates import MIN_SOAK_SAMPLES, SoakGate
from quantize_serve.recipe.load import parse_recipe
from tests.conftest import ROOT

GATE = SoakGate(duration_s=60, warmup_s=10, sample_interval_s=1, max_memory_growth_mib_per_min=50)


OK_TRAFFIC = SoakTraffic(completed=100, completed_after_warmup=80)


def series(
    mib_per_min: float,
    *,
    seconds: int = 60,
    every: float = 1.0,
    noise_mib: float = 2.0,
    preemptions: Callable | None = None,
    gpu_mib_per_min: float | None = None,
    seed: int = 0,
) -> list[dict]:
    """Samples as the soak writes them: 1 GiB of RSS growing at mib_per_min, with noise."""
    rng = random.Random(seed)
    out = []
    for i in range(int(seconds / every) + 1):
        t = i * every
        s = {
            "t": t,
            "rss_bytes": int((1024 + mib_per_min * t / 60 + rng.uniform(-noise_mib, noise_mib)) * MIB),
            "gpu_memory_bytes": None,
            "vllm:kv_cache_usage_perc": 0.4,
            "vllm:num_preemptions_total": float(preemptions(t) if preemptions else 0),
        }
        if gpu_mib_per_min is not None:
            s["gpu_memory_bytes"] = int((70_000 + gpu_mib_per_min * t / 60) * MIB)
        out.append(s)
    return out


def test_fit_slope_is_least_squares_in_mib_per_minute() -> None:
    t = [0, 30, 60, 90]
    assert fit_slope(t, [100 * MIB, 110 * MIB, 120 * MIB, 130 * MIB]) == pytest.approx(20.0)
    noisy = [(500 + 3 * x / 60 + (1 if i % 2 else -1)) * MIB for i, x in enumerate(range(0, 600, 10))]
    expected = np.polyfit(np.arange(0, 600, 10) / 60, np.asarray(noisy) / MIB, 1)[0]
    assert fit_slope(list(range(0, 600, 10)), noisy) == pytest.approx(expected)
    assert fit_slope([0, 10, 20], [None, 5 * MIB, None]) is None  # one point is no line
    assert fit_slope([5, 5], [MIB, 2 * MIB]) is None  # one instant is no line
    assert fit_slope([0, 10, 20], [MIB, None, 3 * MIB]) == pytest.approx(6.0)  # a missed reading is skipped


def test_flat_series_passes() -> None:
    figures = soak_figures(series(0.0), GATE.warmup_s)
    assert figures.samples == 61 and figures.samples_after_warmup == 51
    assert abs(figures.rss_slope_mib_per_min) < 5 and figures.gpu_slope_mib_per_min is None
    assert figures.preemptions_after_warmup == 0 and figures.peak_kv_cache_usage == 0.4
    assert judge_soak(figures, OK_TRAFFIC, GATE) == []


def test_leaking_series_fails_with_the_slope() -> None:
    figures = soak_figures(series(200.0), GATE.warmup_s)
    assert figures.rss_slope_mib_per_min == pytest.approx(200, abs=5)
    failures = judge_soak(figures, OK_TRAFFIC, GATE)
    assert len(failures) == 1, failures
    assert "RSS" in failures[0] and f"{figures.rss_slope_mib_per_min:.1f} MiB/min" in failures[0]
    assert "max_memory_growth_mib_per_min=50" in failures[0]


def test_growth_only_during_warmup_passes() -> None:
    """Pools and caches filling at the start are not a leak: the fit starts after warm-up."""
    samples = series(0.0)
    for s in samples:
        s["rss_bytes"] += int(min(s["t"], GATE.warmup_s) * 20 * MIB)  # +200 MiB in the first 10 s, then flat
    figures = soak_figures(samples, GATE.warmup_s)
    assert abs(figures.rss_slope_mib_per_min) < 5
    assert judge_soak(figures, OK_TRAFFIC, GATE) == []
    assert (
        fit_slope([s["t"] for s in samples], [s["rss_bytes"] for s in samples]) > 50
    )  # what a naive fit says


def test_gpu_memory_growth_fails() -> None:
    figures = soak_figures(series(0.0, gpu_mib_per_min=120.0), GATE.warmup_s)
    failures = judge_soak(figures, OK_TRAFFIC, GATE)
    assert len(failures) == 1 and "GPU memory (NVML) grew 120.0 MiB/min" in failures[0], failures


@pytest.mark.parametrize("samples", [[], series(0.0, seconds=12)], ids=["nothing", "two-after-warmup"])
def test_too_few_samples_after_warmup_fails(samples: list[dict]) -> None:
    figures = soak_figures(samples, GATE.warmup_s)
    assert figures.samples_after_warmup < MIN_SOAK_SAMPLES
    failures = judge_soak(figures, OK_TRAFFIC, GATE)
    assert any(
        f"captured {figures.samples_after_warmup} memory sample(s)" in f and "not a pass" in f
        for f in failures
    ), failures


def test_preemptions_climbing_after_warmup_fail() -> None:
    climbing = soak_figures(series(0.0, preemptions=lambda t: t // 5), GATE.warmup_s)  # one every 5 s
    assert climbing.preemptions_after_warmup == 10 and climbing.preemptions == 12
    failures = judge_soak(climbing, OK_TRAFFIC, GATE)
    assert len(failures) == 1 and "10 preemption(s) after warm-up" in failures[0], failures
    assert (
        judge_soak(climbing, OK_TRAFFIC, GATE.model_copy(update={"max_preemptions_after_warmup": 10})) == []
    )
    settled = soak_figures(series(0.0, preemptions=lambda t: min(t, 8)), GATE.warmup_s)  # only during warm-up
    assert settled.preemptions == 8 and settled.preemptions_after_warmup == 0
    assert judge_soak(settled, OK_TRAFFIC, GATE) == []
    unread = series(0.0)
    for s in unread:
        del s["vllm:num_preemptions_total"]
    assert any("never read" in f for f in judge_soak(soak_figures(unread, GATE.warmup_s), OK_TRAFFIC, GATE))


def test_failed_requests_idle_server_and_death_fail() -> None:
    figures = soak_figures(series(0.0), GATE.warmup_s)
    bad = SoakTraffic(
        completed=50, completed_after_warmup=40, errors_5xx=3, timeouts=1, error_samples=["HTTP 500: boom"]
    )
    failures = judge_soak(figures, bad, GATE)
    assert any("3 request(s) got a server error (5xx) (first: HTTP 500: boom)" in f for f in failures)
    assert any("1 request(s) got no answer" in f for f in failures)
    assert any("idle server" in f for f in judge_soak(figures, SoakTraffic(), GATE))
    died = judge_soak(figures, OK_TRAFFIC, GATE, server_died=True, death_reason="/health failed 3 times")
    assert died == ["the server died during the soak test: /health failed 3 times"]


def _recipe_with(soak: dict | None):
    data = yaml.safe_load((ROOT / "recipes" / "tiny-llama-awq.yaml").read_text())
    if soak is not None:
        data["gates"]["soak"] = soak
    return parse_recipe(data, source="recipes/x.yaml", base_dir=ROOT / "recipes")


def test_soak_is_off_unless_set() -> None:
    for path in sorted((ROOT / "recipes").glob("tiny-*.yaml")):
        assert "soak" not in yaml.safe_load(path.read_text())["gates"], path
    assert _recipe_with(None).gates.soak is None
    gate = _recipe_with({"duration_s": 1800}).gates.soak
    assert gate and gate.duration_s == 1800 and gate.warmup_s == 300 and gate.prompt_tokens is None


@pytest.mark.parametrize(
    ("soak", "field", "words"),
    [
        ({"duration_s": 5}, "gates.soak.duration_s", "between 10 and 86400"),
        ({"sample_interval_s": 0.01}, "gates.soak.sample_interval_s", "measures the sampler"),
        ({"max_memory_growth_mib_per_min": 0}, "gates.soak.max_memory_growth_mib_per_min", "allocator noise"),
        ({"max_preemptions_after_warmup": -1}, "gates.soak.max_preemptions_after_warmup", "between 0"),
        ({"concurrency": 0}, "gates.soak.concurrency", "between 1 and 4096"),
        (
            {"duration_s": 60, "warmup_s": 60},
            "gates.soak",
            "warmup_s (60) is not below gates.soak.duration_s (60)",
        ),
        (
            {"duration_s": 60, "warmup_s": 30, "sample_interval_s": 10},
            "gates.soak",
            "gives 3 sample(s) after warm-up",
        ),
        ({"duraton_s": 60}, "gates.soak.duraton_s", "= 60"),  # a misspelled key is never ignored
    ],
)
def test_soak_section_errors_name_field_value_and_fix(soak: dict, field: str, words: str) -> None:
    with pytest.raises(RecipeErrors) as info:
        _recipe_with(soak)
    errors = [e for e in info.value.errors if e.field == field]
    assert errors, str(info.value)
    text = str(errors[0])
    assert text.startswith(f"recipes/x.yaml: {field} = ") and words in text and "Fix:" in text, text


def test_passing_soak_row_summary_and_chart(tmp_path: Path) -> None:
    samples = series(1.0)
    figures = soak_figures(samples, GATE.warmup_s)
    result = SoakResult(
        duration_s=60,
        measured_s=60.0,
        warmup_s=10,
        sample_interval_s=1,
        concurrency=4,
        prompt_tokens=[16],
        output_tokens=[8],
        max_memory_growth_mib_per_min=50,
        max_preemptions_after_warmup=0,
        figures=figures,
        traffic=OK_TRAFFIC,
        server_died=False,
        failures=judge_soak(figures, OK_TRAFFIC, GATE),
        samples_path="soak-samples.jsonl",
        chart_path=None,
        output_dir=str(tmp_path),
    )
    row = soak_row(result)
    assert (
        row.passed and "100 requests over 60 s at concurrency 4" in row.reason and "(limit 50)" in row.reason
    )
    assert result.summary()["rss_slope_mib_per_min"] == figures.rss_slope_mib_per_min
    assert soak_chart(samples, result, tmp_path / "soak.png").stat().st_size > 10_000
    assert decide([], None, result).checks[-1] == row  # a result given is always a row


def test_decision_has_a_soak_row_only_when_set() -> None:
    assert [r.check for r in decide([], None).checks] == ["accuracy", "stress"]
    rows = decide([], None, None, soak_required=True).checks
    assert rows[-1].check == "soak" and not rows[-1].passed and "did not run" in rows[-1].reason
    row = soak_row(RuntimeError("the server at x is not healthy before the soak test"))
    assert not row.passed and row.reason.startswith("could not run: RuntimeError: the server")
