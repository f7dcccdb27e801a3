"""Serving-profile search: the bracketing/bisection logic with an injected probe (no boots), the
serve-profile.yaml emission, and one end-to-end boot of vLLM from the emitted file (`--config`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from quantize_serve.capacity import planner
from quantize_serve.capacity.measure import plan_for
from quantize_serve.serving.spec import capacity_spec
from quantize_serve.core.errors import GateError
from quantize_serve.recipe.load import load_recipe, parse_recipe
from quantize_serve.recipe.model import ProfileSearch, ServeSection
from quantize_serve.serve_profile import output as po
from quantize_serve.serve_profile import probe as profile_probe
from quantize_serve.serve_profile import search as ps
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.server import ServerSpec
from tests.conftest import ROOT

RECIPE = load_recipe(ROOT / "recipes" / "tiny-llama-awq.yaml")


MODEL = ROOT / "models" / "tiny-llama"


def threshold_probe(limit: int, calls: list[ServeSection], *, spec_for=None):
    """Passes iff max_num_seqs <= limit (a KV cache that holds `limit` requests of the profile)."""

    def probe(serve: ServeSection) -> ps.SearchPoint:
        calls.append(serve)
        n, ok = serve.max_num_seqs, serve.max_num_seqs <= limit
        return ps.SearchPoint(
            max_num_seqs=n,
            max_num_batched_tokens=serve.max_num_batched_tokens,
            max_model_len=serve.max_model_len,
            passed=ok,
            why=[]
            if ok
            else [f"{n - limit} preemption(s) (vllm:num_preemptions_total), over max_preemptions=0"],
            peak_kv_cache_usage=min(1.0, n / max(limit, 1)),
            preemptions=0 if ok else n - limit,
            output_throughput=100.0 * min(n, limit),
            spec=spec_for(serve) if spec_for else None,
        )

    return probe


def run(
    limit: int,
    *,
    start: int,
    lo: int = 4,
    hi: int | None = 32,
    step: int = 4,
    max_boots: int = 6,
    serve: ServeSection = RECIPE.serve,
    max_concurrency: float = 10.25,
):
    calls: list[ServeSection] = []
    search = ProfileSearch(min_num_seqs=lo, max_num_seqs=hi, step=step, max_boots=max_boots)
    result = ps.search_profile(
        threshold_probe(limit, calls),
        serve,
        search,
        planner_recommended=start,
        planner_max_concurrency=max_concurrency,
    )
    return result, [c.max_num_seqs for c in calls]


def test_starts_at_planner_grows_then_bisects_to_within_one_step():
    # The benchmark's shape: the planner (full-length requests) says 9, the profile's shorter
    # requests fit 13. Grid 4, 8, ..., 32 would take 8 boots; the search takes 4.
    result, tried = run(13, start=9)
    assert tried == [9, 18, 13, 15]
    assert result.found.max_num_seqs == 13 and result.boots == 4 == len(result.points)
    assert result.planner_start == 9 and "bracketed: 13 passes, 15 fails" in result.stop_reason
    assert [p.passed for p in result.points] == [True, False, True, False]
    assert result.points[1].why and "preemption" in result.points[1].why[0]


def test_shrinks_when_the_planner_start_fails():
    result, tried = run(3, start=9, lo=1)
    assert tried == [9, 4, 2]
    assert result.found.max_num_seqs == 2 and result.stop_reason.startswith("bracketed")


@pytest.mark.parametrize("start", [1, 4, 9, 17, 32])
def test_found_is_within_one_step_of_the_limit_for_every_limit(start):
    for limit in range(0, 40):
        result, tried = run(limit, start=start, lo=1, hi=32, max_boots=20)
        assert len(tried) == len(set(tried)), f"a value was probed twice: {tried}"
        assert all(1 <= n <= 32 for n in tried)
        if limit < 1:
            assert result.found is None and "lower end 1 failed" in result.stop_reason
        elif limit >= 32:
            assert result.found.max_num_seqs == 32 and "above the searched range" in result.stop_reason
        else:
            assert limit - 4 < result.found.max_num_seqs <= limit, (limit, tried)
            assert result.found.passed
        assert len(tried) <= 9  # ~log2(32) bracket + log2(32 / step) bisection


def test_never_exceeds_max_boots_and_keeps_the_best_pass():
    result, tried = run(13, start=9, max_boots=2)
    assert tried == [9, 18] and result.boots == 2
    assert result.found.max_num_seqs == 9
    assert result.stop_reason == "max_boots=2 spent with bracket [9, 18] (step 4)"


def test_range_defaults_to_the_planners_max_concurrency():
    result, tried = run(13, start=9, hi=None, max_concurrency=10.25)
    assert result.max_num_seqs == 10 and max(tried) == 10
    assert result.found.max_num_seqs == 10 and "above the searched range" in result.stop_reason


def test_candidates_keep_the_recipe_and_raise_batched_tokens_to_max_num_seqs():
    serve = RECIPE.serve  # max_num_batched_tokens 2048
    assert ps.candidate_serve(serve, max_num_seqs=12).max_num_batched_tokens == 2048
    assert ps.candidate_serve(serve, max_num_seqs=3000).max_num_batched_tokens == 3000
    unset = ServeSection.model_validate({**serve.model_dump(), "max_num_batched_tokens": None})
    # the one place a recipe's unset value becomes vLLM's default: the planner, the search, the compile ahead
    assert (serve.batched_tokens, unset.batched_tokens) == (2048, 8192)
    assert planner.DEFAULT_MAX_NUM_BATCHED_TOKENS == 8192
    c = ps.candidate_serve(unset, max_num_seqs=12, max_model_len=1024)
    assert (c.max_num_batched_tokens, c.max_model_len) == (planner.DEFAULT_MAX_NUM_BATCHED_TOKENS, 1024)
    assert c.model_dump(
        exclude={"max_num_seqs", "max_num_batched_tokens", "max_model_len"}
    ) == unset.model_dump(exclude={"max_num_seqs", "max_num_batched_tokens", "max_model_len"})
    candidate = ps.candidate_serve(serve, max_num_seqs=64)
    profile = profile_probe.search_stress_profile(RECIPE.gates.stress, candidate)
    assert (profile.concurrency, profile.num_requests) == (64, 64)  # the peak step really runs 64


def test_max_model_len_search_at_the_found_concurrency():
    calls: list[ServeSection] = []
    budget_tokens = 13 * 700  # 13 sequences at most; at 13, requests of up to 700 tokens fit

    def probe(serve: ServeSection) -> ps.SearchPoint:
        calls.append(serve)
        ok = serve.max_num_seqs <= 13 and serve.max_num_seqs * serve.max_model_len <= budget_tokens
        return ps.SearchPoint(
            max_num_seqs=serve.max_num_seqs,
            max_num_batched_tokens=serve.max_num_batched_tokens,
            max_model_len=serve.max_model_len,
            passed=ok,
            why=[] if ok else ["preempted"],
        )

    search = ProfileSearch(min_num_seqs=4, max_num_seqs=32, step=4, max_boots=6, max_model_len_search=True)
    result = ps.search_profile(
        probe,
        RECIPE.serve,
        search,
        planner_recommended=9,
        planner_max_concurrency=10,
        max_model_len_range=(512, 1024),
        max_model_len_step=128,
    )
    seqs = [p for p in result.points if p.dimension == "max_num_seqs"]
    lens = [p for p in result.points if p.dimension == "max_model_len"]
    assert [p.max_num_seqs for p in seqs] == [9, 18, 13, 15]
    assert all(p.max_num_seqs == 13 for p in lens)
    assert [p.max_model_len for p in lens] == [1024, 768, 640]  # 512 is known to pass: no boot
    assert result.found.max_num_seqs == 13 and result.found.max_model_len == 640
    assert result.found.dimension == "max_model_len"
    assert result.boots == 7
    assert result.max_model_len_stop_reason == "bracketed: 640 passes, 768 fails (within step 128)"


def test_search_serve_profile_starts_at_the_planners_recommendation(tmp_path):
    calls: list[ServeSection] = []
    recipe = parse_recipe(
        {
            **RECIPE.model_dump(mode="json", exclude={"base_dir"}),
            "serve": {
                **RECIPE.serve.model_dump(mode="json"),
                "search": {"min_num_seqs": 4, "max_num_seqs": 64, "step": 4},
            },
        },
        base_dir=ROOT / "recipes",
    )
    plan = plan_for(recipe, json.loads((MODEL / "config.json").read_text()), Boot.PRODUCTION, block_size=128)
    result = ps.search_serve_profile(recipe, MODEL, probe=threshold_probe(40, calls), log=lambda _: None)
    assert result.planner_recommended == plan.recommended_max_num_seqs > 0
    assert calls[0].max_num_seqs == result.planner_start == min(64, plan.recommended_max_num_seqs)
    assert 36 < result.found.max_num_seqs <= 40
    off = parse_recipe(
        {
            **recipe.model_dump(mode="json", exclude={"base_dir"}),
            "serve": {**recipe.serve.model_dump(mode="json"), "search": {"enabled": False}},
        }
    )
    with pytest.raises(GateError, match="enabled is false"):
        ps.search_serve_profile(off, MODEL, probe=threshold_probe(40, calls))


def test_recipe_search_section_is_strict():
    base = RECIPE.model_dump(mode="json", exclude={"base_dir"})
    assert RECIPE.serve.search is None  # off unless asked for
    ok = parse_recipe({**base, "serve": {**base["serve"], "search": {"step": 2, "max_num_seqs": 48}}})
    assert ok.serve.search == ProfileSearch(step=2, max_num_seqs=48)
    assert (ok.serve.search.max_boots, ok.serve.search.min_num_seqs, ok.serve.search.enabled) == (6, 1, True)
    with pytest.raises(ValueError, match="serve.search.stpe"):
        parse_recipe({**base, "serve": {**base["serve"], "search": {"stpe": 2}}})
    with pytest.raises(ValueError, match="below serve.search.min_num_seqs"):
        parse_recipe({**base, "serve": {**base["serve"], "search": {"min_num_seqs": 8, "max_num_seqs": 4}}})


def vllm_config_args(mapping: dict) -> list[str]:
    """What vLLM 0.32's FlexibleArgumentParser.load_config_file makes of a config mapping."""
    out: list[str] = []
    for key, value in mapping.items():
        if isinstance(value, bool):
            out += [f"--{key}"] if value else []
        elif isinstance(value, list):
            out += [f"--{key}", *map(str, value)]
        elif isinstance(value, dict):
            out += [f"--{key}", json.dumps(value)]
        else:
            out += [f"--{key}", str(value)]
    return out


def found_point(serve: ServeSection, *, kv_bytes: int | None = 2_700_000) -> ps.SearchPoint:
    spec = ServerSpec(model_dir=str(MODEL), serve=serve, kv_cache_memory_bytes=kv_bytes)
    return ps.SearchPoint(
        max_num_seqs=serve.max_num_seqs,
        max_num_batched_tokens=serve.max_num_batched_tokens,
        max_model_len=serve.max_model_len,
        passed=True,
        preemptions=0,
        peak_kv_cache_usage=0.93,
        output_throughput=812.0,
        spec=spec,
    )


def test_serve_profile_yaml_is_the_boot_command_as_a_config_file(tmp_path):
    serve = ps.candidate_serve(RECIPE.serve, max_num_seqs=12)
    point = found_point(serve)
    path, command = po.write_serve_profile(point, tmp_path / "serve-profile.yaml")
    mapping = yaml.safe_load(path.read_text())
    assert mapping["max-num-seqs"] == 12 and mapping["max-num-batched-tokens"] == 2048
    assert mapping["max-model-len"] == 512 and mapping["kv-cache-dtype"] == "fp8"
    assert mapping["kv-cache-memory-bytes"] == 2_700_000 and mapping["enforce-eager"] is True
    assert mapping["model"] == str(MODEL) and "gpu-memory-utilization" not in mapping
    assert all("_" not in k and not k.startswith("-") for k in mapping)
    # vLLM's loader gives back exactly the flags the stress test booted with
    assert vllm_config_args(mapping) == point.spec.vllm_args()
    assert command == point.spec.serve_command()
    text = path.read_text()
    assert f"# Same as: {command}" in text and "# Use: vllm serve --config serve-profile.yaml" in text


def test_serve_profile_gpu_mode_extra_args_and_model_override(tmp_path):
    serve = ServeSection(
        max_model_len=8192,
        max_num_seqs=96,
        max_num_batched_tokens=8192,
        kv_cache_dtype="fp8",
        gpu_memory_utilization=0.9,
        extra_args=["--enable-prefix-caching", "--seed=7", "--allowed-origins", "a", "b"],
    )
    point = found_point(serve, kv_bytes=None)
    path, command = po.write_serve_profile(point, tmp_path / "p.yaml", model="org/tiny-llama-awq-w4a16")
    mapping = yaml.safe_load(path.read_text())
    assert mapping["gpu-memory-utilization"] == 0.9 and "kv-cache-memory-bytes" not in mapping
    assert mapping["enable-prefix-caching"] is True and mapping["seed"] == 7
    assert mapping["allowed-origins"] == ["a", "b"] and mapping["model"] == "org/tiny-llama-awq-w4a16"
    assert command.startswith(
        "vllm serve org/tiny-llama-awq-w4a16 --served-model-name model --max-model-len 8192"
    )
    assert "--seed 7" in command and command.endswith("--allowed-origins a b")
    with pytest.raises(GateError, match="no ServerSpec"):
        po.write_serve_profile(point.model_copy(update={"spec": None}), tmp_path / "x.yaml")


def test_found_serve_feeds_the_stress_gate():
    result, _ = run(13, start=9)
    serve = ps.found_serve(RECIPE.serve, result)
    assert (serve.max_num_seqs, serve.max_num_batched_tokens, serve.max_model_len) == (13, 2048, 512)
    assert serve.kv_cache_dtype == RECIPE.serve.kv_cache_dtype
    assert serve.memory_budget == RECIPE.serve.memory_budget
    args = ServerSpec(model_dir=str(MODEL), serve=serve).vllm_args()
    assert args[args.index("--max-num-seqs") + 1] == "13"
    nothing, _ = run(0, start=9, lo=1)
    with pytest.raises(GateError, match="found no passing max_num_seqs"):
        ps.found_serve(RECIPE.serve, nothing)


def test_plot_search_writes_a_png(tmp_path):
    result, _ = run(13, start=9)
    probe = threshold_probe(13, [])
    grid = [probe(ps.candidate_serve(RECIPE.serve, max_num_seqs=n)) for n in range(4, 33, 4)]
    path = po.plot_search(result, tmp_path / "search.png", grid=grid)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    assert "| 2 | 18 | 512 | fail |" in result.markdown()


def test_task_writes_profile_and_chart(tmp_path, monkeypatch):
    from quantize_serve.serve_profile.output import PROFILE_FILE
    from tasks.serve_profile import PLOT_FILE, search_serve_profile

    def spec_for(serve):
        return capacity_spec(RECIPE.model_copy(update={"serve": serve}), Boot.PRODUCTION, MODEL)

    monkeypatch.setattr(
        profile_probe, "vllm_probe", lambda *a, **k: threshold_probe(13, [], spec_for=spec_for)
    )
    recipe = RECIPE.model_copy(
        update={
            "serve": RECIPE.serve.model_copy(
                update={"search": ProfileSearch(min_num_seqs=4, max_num_seqs=32)}
            )
        }
    )
    result = search_serve_profile.fn(recipe, str(MODEL), output_dir=tmp_path)
    n = result.found.max_num_seqs
    assert 9 < n <= 13  # the planner's start (25 on the recipe's 8 MiB budget) fails: shrink, then bisect
    assert result.profile_path == str(tmp_path / PROFILE_FILE)
    assert result.plot_path == str(tmp_path / PLOT_FILE)
    assert yaml.safe_load(Path(result.profile_path).read_text())["max-num-seqs"] == n
    assert result.serve_command.startswith("vllm serve ") and f"--max-num-seqs {n} " in result.serve_command


def test_task_starts_a_gpu_search_at_the_planners_recommendation_for_this_gpu(tmp_path, monkeypatch):
    """On a GPU the flow's search starts where the planner puts this GPU (it started at the range's
    low end when the task left the device's memory out: "KV 0 tokens", seen on the H200)."""
    from quantize_serve.serving import gpu
    from tasks.serve_profile import search_serve_profile

    calls: list[ServeSection] = []
    monkeypatch.setattr(profile_probe, "vllm_probe", lambda *a, **k: threshold_probe(100, calls))
    monkeypatch.setattr(gpu, "usable_memory_bytes", lambda index=0: 150109880320)  # the lent H200
    serve = RECIPE.serve.model_copy(
        update={
            "memory_budget": None,
            "search": ProfileSearch(min_num_seqs=16, max_num_seqs=256, step=64, max_boots=2),
        }
    )
    result = search_serve_profile.fn(
        RECIPE.model_copy(update={"serve": serve}), str(MODEL), output_dir=tmp_path
    )
    assert result.planner_recommended > 256 and calls[0].max_num_seqs == result.planner_start == 256
