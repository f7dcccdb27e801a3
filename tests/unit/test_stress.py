"""The stress gate's plan and verdict without a server (the real traffic: tests/engines/test_stress.py)."""

from __future__ import annotations

import pytest

from quantize_serve.gates.stress import judge, plan_traffic, went_wrong
from quantize_serve.recipe.load import load_recipe
from tests.conftest import ROOT
from tests.release_fixtures import stress_result

RECIPE = load_recipe(ROOT / "recipes" / "tiny-llama-awq.yaml")


MODEL = ROOT / "models" / "tiny-llama"


def test_plan_is_seeded_with_exact_lengths() -> None:
    """No boot: the plan the three tests below send (token ids of exact counts, the ramp, the mix)."""
    profile, serve = RECIPE.gates.stress, RECIPE.serve
    plan = plan_traffic(profile, serve, str(MODEL), seed=0)
    assert (
        plan
        == plan_traffic(profile, serve, str(MODEL), seed=0)
        != plan_traffic(profile, serve, str(MODEL), seed=1)
    )
    assert [c for c, _ in plan] == [1, 4, 8, 16]
    probes = [p for _, ps in plan for p in ps]
    kinds = [p.kind for p in probes]
    assert len(probes) == profile.num_requests + profile.overlong_prompts
    assert kinds.count("long") == round(profile.long_prompt_share * profile.num_requests)
    assert all(p.kind == "overlong" for p in probes if len(p.prompt) > serve.max_model_len)
    assert kinds.count("overlong") == profile.overlong_prompts and "overlong" in [p.kind for p in plan[-1][1]]
    for p in probes:
        if p.kind == "long":
            assert len(p.prompt) + p.max_tokens == serve.max_model_len - 4
        elif p.kind == "normal":
            assert len(p.prompt) in profile.prompt_tokens and p.max_tokens in profile.output_tokens


def test_the_bench_runs_only_after_traffic_that_went_as_planned() -> None:
    """Valid requests completed with their token count, over-long ones rejected with HTTP 400: anything
    else (or no answer recorded) has failed the test, and the bench is not run."""
    plan = plan_traffic(RECIPE.gates.stress, RECIPE.serve, str(MODEL), seed=0)
    probes = [p for _, ps in plan for p in ps]
    planned = {
        p.index: {"outcome": "rejected_overlong" if p.kind == "overlong" else "completed"} for p in probes
    }
    assert not went_wrong(plan, planned)
    valid, overlong = (next(p.index for p in probes if p.kind == kind) for kind in ("normal", "overlong"))
    for index, outcome in [(valid, "wrong_tokens"), (valid, "other_error"), (overlong, "5xx")]:
        assert went_wrong(plan, {**planned, index: {"outcome": outcome}}), (index, outcome)
    assert went_wrong(plan, {i: r for i, r in planned.items() if i != valid})  # never answered


def test_clean_result_passes() -> None:
    assert judge(stress_result(), RECIPE.gates.stress, traffic="done", death_reason="", bench_error="") == []


@pytest.mark.parametrize("peak", [0, None])
def test_sampler_that_saw_no_running_request_fails_the_check(peak) -> None:
    """A measurement that captured nothing (requests outran the sampler) is a failure, never a pass."""
    failures = judge(
        stress_result(peak_running=peak, peak_kv_cache_usage=0.0),
        RECIPE.gates.stress,
        traffic="done",
        death_reason="",
        bench_error="",
    )
    assert len(failures) == 1 and "saw no running request" in failures[0], failures
