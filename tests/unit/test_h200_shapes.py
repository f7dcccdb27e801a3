"""benchmarks/h200_shapes.py without a boot: which rows it measures (filters, --resume), the fit decision
that keeps a bf16 70B off the GPU, the planner's error beside a measured row (also given a CUDA-graph
estimate, where vLLM logs one), --replan, what it reads from a boot's log, and the JSON it assembles row by
row. Figures are issue 25's H200 boots (vLLM 0.26, one H200, dummy weights)."""

from __future__ import annotations

import pytest

from benchmarks import evidence
from benchmarks import h200_shapes as hs
from benchmarks.harness import merge_row
from quantize_serve.capacity.planner import kv_error_pct
from quantize_serve.capacity.measure import CapacityConfig
from quantize_serve.capacity.shape import ShapeRow
from benchmarks.evidence import kernel_report
from quantize_serve.serving import vllm_log
from quantize_serve.serving.boot import Boot
from tests.release_fixtures import capacity_config

H200 = 150_109_880_320  # what CUDA reports on an H200 (bytes)
GIB = 1024**3

# Qwen2-72B W4A16 with graphs on, as vLLM 0.26.0 logged it on the H200 (the row's vllm_lines in
# benchmarks/results/capacity/h200_shapes.json; the "Actual usage" line in vLLM's format, gpu_worker.py, from
# the
# figures parsed out of it). No "Estimated CUDA graph memory" line: vLLM took no graph estimate from the
# budget.
LOG_72B = """\
(EngineCore pid=5328) INFO 12-02 15:56:24 [compressed_tensors_wNa16.py:137] Using MacheteLinearKernel for \
CompressedTensorsWNA16
(EngineCore pid=5328) INFO 12-02 15:56:30 [model_runner.py:305] Model loading took 38.53 GiB and \
5.609690 seconds
(EngineCore pid=5328) INFO 12-02 15:57:26 [gpu_worker.py:560] Available KV cache memory: 84.5 GiB
(EngineCore pid=5328) INFO 12-02 15:57:26 [kv_cache_utils.py:2177] GPU KV cache size: 276,880 tokens
Capturing CUDA graphs (PIECEWISE):  53%|█████▎    | 27/51 [00:01<00:01, 23.68it/s]
(EngineCore pid=5328) INFO [gpu_worker.py:842] Free memory on device (...) on startup. Desired GPU memory \
utilization is (0.9, 125.82 GiB). Actual usage is 38.53 GiB for weight, 2.57 GiB for peak activation, \
0.22 GiB for non-torch memory, and 1.54 GiB for CUDAGraph memory. Current kv cache memory in use is 84.5 GiB.
"""
# The lines of a boot whose graph estimate vLLM takes from the budget (its V1 model runner's, gpu_worker.py's
# format).
POOL_LINES = (
    "INFO [gpu_model_runner.py:6738] Estimated CUDA graph memory: 0.72 GiB total\n"
    "INFO [gpu_worker.py:794] CUDA graph pool memory: 1.57 GiB (actual), 0.72 GiB (estimated), "
    "difference: 0.85 GiB (54.1%).\n"
)
MOE_MARLIN = (
    "INFO Using MacheteLinearKernel for CompressedTensorsWNA16\n"
    "INFO Using CompressedTensorsWNA16MarlinMoEMethod\n"
)
MOE_TRITON = (
    "INFO Using MacheteLinearKernel for CompressedTensorsWNA16\nINFO Using CompressedTensorsWNA16MoEMethod\n"
)


def measured(boot: Boot, tokens: int, weights_gib: float, dtype: str) -> CapacityConfig:
    return capacity_config(
        name=boot,
        kv_cache_dtype=dtype,
        weights_bytes=int(weights_gib * GIB),
        kv_cache_memory_bytes=int(83.85 * GIB),
        kv_cache_tokens=tokens,
        max_model_len=8192,
        max_concurrency=round(tokens / 8192, 2),
        boot_seconds=120.0,
    )


def test_the_table_has_twelve_rows_and_the_filters_pick_from_it():
    rows = hs.select_rows(hs.MODELS)
    assert len(rows) == 12 and rows[:3] == [("Llama-3-8B", b) for b in Boot]
    assert [hs.row_id(*r) for r in rows][-1] == "Qwen3-30B-A3B/w4a16-fp8kv"
    assert hs.select_rows(
        hs.MODELS, models="Qwen2-72B,Llama-3-70B"
    ) == [  # the table's order, not the argument's
        (m, b) for m in ("Llama-3-70B", "Qwen2-72B") for b in Boot
    ]
    assert hs.select_rows(hs.MODELS, rows="bf16") == [(m, Boot.BASE) for m in hs.MODELS]
    assert hs.select_rows(hs.MODELS, models="Llama-3-8B", rows="w4a16-fp8kv,Qwen2-72B/w4a16") == [
        ("Llama-3-8B", Boot.PRODUCTION)
    ]  # a row of a model not asked for stays out
    assert hs.select_rows(hs.MODELS, rows="Qwen2-72B/w4a16,base") == [
        ("Llama-3-8B", Boot.BASE),
        ("Llama-3-70B", Boot.BASE),
        ("Qwen2-72B", Boot.BASE),
        ("Qwen2-72B", Boot.QUANTIZED_16BIT_KV),
        ("Qwen3-30B-A3B", Boot.BASE),
    ]
    for bad in ({"models": "Llama-4"}, {"rows": "int8"}, {"rows": "Mixtral/base"}):
        with pytest.raises(SystemExit, match="unknown"):
            hs.select_rows(hs.MODELS, **bad)


def test_resume_skips_what_is_recorded_and_tries_refused_or_failed_rows_again():
    selected = hs.select_rows(hs.MODELS, models="Llama-3-70B")
    recorded = [
        {"id": "Llama-3-70B/base", "status": "does-not-fit"},
        {"id": "Llama-3-70B/w4a16", "status": "error"},
        {"id": "Llama-3-70B/w4a16-fp8kv", "status": "measured"},
    ]
    assert hs.pending_rows(selected, recorded, resume=True) == [("Llama-3-70B", Boot.QUANTIZED_16BIT_KV)]
    assert hs.pending_rows(selected, recorded, resume=False) == selected
    recorded[1]["status"] = "refused"
    assert hs.pending_rows(selected, recorded, resume=True) == [("Llama-3-70B", Boot.QUANTIZED_16BIT_KV)]


@pytest.mark.parametrize(
    "model, fits, weights",
    [
        ("Llama-3-8B", True, None),
        ("Qwen3-30B-A3B", True, None),
        ("Llama-3-70B", False, "131.42"),
        ("Qwen2-72B", False, "135.43"),
    ],
)
def test_a_bf16_base_boots_only_where_the_planner_fits_it_on_one_h200(tmp_path, model, fits, weights):
    *_, plan = hs.plan_row(model, Boot.BASE, work=tmp_path, rehearse=False, device=H200)
    why = hs.fit_decision(plan, Boot.BASE)
    assert (why is None) is fits
    if not fits:
        assert (
            why.startswith(f"does not fit, planner says {weights} GiB weights (")
            and "125.82 GiB budget" in why
        )
    for boot in (
        Boot.QUANTIZED_16BIT_KV,
        Boot.PRODUCTION,
    ):  # every quantized row boots: vLLM has the last word
        *_, plan = hs.plan_row(model, boot, work=tmp_path, rehearse=False, device=H200)
        assert plan.fits and hs.fit_decision(plan, boot) is None
        assert hs.fit_decision(plan.model_copy(update={"fits": False}), boot) is None
    recipe, _, folder, plan = hs.plan_row(model, Boot.PRODUCTION, work=tmp_path, rehearse=False, device=H200)
    serve = recipe.serve  # production mode, as issue 25 asks
    assert (
        serve.enforce_eager,
        serve.max_model_len,
        serve.gpu_memory_utilization,
        serve.max_num_seqs,
        serve.max_num_batched_tokens,
        serve.tensor_parallel_size,
        serve.memory_budget,
    ) == (False, 8192, 0.90, 256, 8192, 1, None)
    # vLLM's V1 model runner (the MoE's) takes a CUDA-graph estimate from the budget; the V2 runner takes none
    assert recipe.quantization.scheme == "W4A16" and plan.cudagraph_source == (
        "modelled" if model == "Qwen3-30B-A3B" else "none"
    )
    assert ("re:.*mlp.gate$" in recipe.quantization.ignore) is (
        model == "Qwen3-30B-A3B"
    )  # the routers stay 16-bit
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()


def test_the_rehearsal_fits_the_tiny_dense_base_and_not_the_tiny_moe_base(tmp_path):
    *_, dense = hs.plan_row("tiny-llama", Boot.BASE, work=tmp_path, rehearse=True, device=None)
    *_, moe = hs.plan_row("tiny-qwen3-moe", Boot.BASE, work=tmp_path, rehearse=True, device=None)
    assert hs.fit_decision(dense, Boot.BASE) is None
    assert hs.fit_decision(moe, Boot.BASE).startswith("does not fit, planner says 3.89 MiB weights")
    *_, moe_w4 = hs.plan_row("tiny-qwen3-moe", Boot.PRODUCTION, work=tmp_path, rehearse=True, device=None)
    assert moe_w4.fits and moe_w4.mode == "fixed_budget"


def test_what_a_boot_log_says_about_memory_and_kernels():
    memory = vllm_log.memory_figures(LOG_72B)
    assert memory == {
        "cuda_graph_pool_actual_gib": None,
        "cuda_graph_pool_estimated_gib": None,
        "cuda_graph_estimate_gib": None,
        "actual_usage_gib": {
            "weights": 38.53,
            "peak_activation": 2.57,
            "non_torch": 0.22,
            "cuda_graphs": 1.54,
        },
    }
    assert evidence.graph_estimate_bytes(memory) is None
    pool = vllm_log.memory_figures(POOL_LINES)
    assert (pool["cuda_graph_pool_actual_gib"], pool["cuda_graph_pool_estimated_gib"]) == (1.57, 0.72)
    assert evidence.graph_estimate_bytes(pool) == int(0.72 * GIB)
    assert vllm_log.memory_figures("")["actual_usage_gib"]["cuda_graphs"] is None
    lines = evidence.evidence_lines(LOG_72B)
    assert not any("it/s]" in line for line in lines)  # the capture progress bars crowded out the figures
    assert any("Actual usage" in line for line in lines) and len(lines) == 5
    k = kernel_report(LOG_72B, "W4A16", "cuda-fp8")
    assert (k["kernels"], k["kernel_check"]) == (["MacheteLinearKernel"], "passed")
    marlin = kernel_report(MOE_MARLIN, "W4A16", "cuda-fp8")
    assert (
        marlin["moe_methods"] == ["CompressedTensorsWNA16MarlinMoEMethod"]
        and marlin["kernel_check"] == "passed"
    )
    triton = kernel_report(MOE_TRITON, "W4A16", "cuda-fp8")
    assert (
        "a fallback" in triton["kernel_check"]
        and "CompressedTensorsWNA16MarlinMoEMethod" in triton["kernel_check"]
    )
    bf16 = kernel_report(
        "INFO Using TRITON Unquantized MoE backend out of potential backends: ['TRITON']\n"
        "INFO Using TritonExperts\n",
        "bf16",
        "cuda-fp8",
    )
    assert (bf16["moe_backends"], bf16["experts"], bf16["kernel_check"]) == (
        ["TRITON Unquantized"],
        ["TritonExperts"],
        None,
    )
    assert kernel_report("INFO Using 'MARLIN' WNA16 MoE backend.\n", "W4A16", "cuda-fp8")["moe_backends"] == [
        "MARLIN WNA16"
    ]


def test_a_measured_row_carries_both_plans_and_their_error(tmp_path):
    """Qwen2-72B W4A16 with graphs on (issue 25: 276,880 tokens, 38.53 GiB): the planner's row, and the plan
    given vLLM's own CUDA-graph estimate where its log has one (the real boot's had none)."""
    from quantize_serve.capacity.measure import plan_for

    recipe, config, _, plan = hs.plan_row(
        "Qwen2-72B", Boot.QUANTIZED_16BIT_KV, work=tmp_path, rehearse=False, device=H200
    )
    assert plan.cudagraph_source == "none" and plan.cudagraph_bytes == 0
    given = plan_for(
        recipe,
        config,
        Boot.QUANTIZED_16BIT_KV,
        block_size=16,
        device_memory_bytes=H200,
        cudagraph_memory_bytes=evidence.graph_estimate_bytes(vllm_log.memory_figures(POOL_LINES)),
    )
    assert given.cudagraph_source == "given" and given.cudagraph_bytes == int(0.72 * GIB)
    m = measured(Boot.QUANTIZED_16BIT_KV, 276_880, 38.53, "auto")
    err = kv_error_pct(plan.kv_cache_tokens, m.kv_cache_tokens)
    assert err == round(100 * (plan.kv_cache_tokens - 276_880) / 276_880, 3) and 0 < err < 1
    row = ShapeRow(
        name=Boot.QUANTIZED_16BIT_KV,
        kv_cache_dtype="auto",
        tensor_parallel_size=1,
        measured=m,
        planned=plan,
        error_pct=err,
    )
    out = hs.assemble_row(
        "Qwen2-72B",
        row,
        scheme="W4A16",
        log_text=LOG_72B + POOL_LINES,
        platform="cuda-fp8",
        given=given,
        seconds=131.0,
        estimated_s=175,
        log_file="vllm-shape-w4a16.log",
    )
    assert (out["id"], out["status"], out["scheme"], out["reason"]) == (
        "Qwen2-72B/w4a16",
        "measured",
        "W4A16",
        None,
    )
    assert out["measured"]["kv_tokens"] == 276_880 and out["measured"]["weights_gib"] == 38.53
    p = out["planner"]
    assert (p["kv_tokens"], p["error_pct"], p["cuda_graph_source"]) == (plan.kv_cache_tokens, err, "none")
    assert p["cuda_graph_gib"] == 0 and p["within_target"] is (abs(err) <= 0.1)
    g = out["planner_given_vllm_graph_estimate"]
    assert g["cuda_graph_source"] == "given" and g["error_pct"] == kv_error_pct(
        given.kv_cache_tokens, 276_880
    )
    assert out["vllm_memory"]["cuda_graph_pool_actual_gib"] == 1.57
    assert out["kernels"]["kernels"] == ["MacheteLinearKernel"] and out["kernels"]["kernel_check"] == "passed"
    assert hs.plan_figures(plan, 276_880, 0.05)["within_target"] is True  # measure_shape's error, when given
    assert hs.plan_figures(plan, 276_880, -0.2)["within_target"] is False


def test_replan_gives_recorded_rows_todays_planner(tmp_path):
    """--replan after a planner change: the measured figures stay, the planner's (and a does-not-fit row's
    reason, which quotes the plan) are today's."""
    from quantize_serve.capacity.measure import plan_for

    *_, plan = hs.plan_row("Qwen2-72B", Boot.QUANTIZED_16BIT_KV, work=tmp_path, rehearse=False, device=H200)
    old = {
        "id": "Qwen2-72B/w4a16",
        "model": "Qwen2-72B",
        "config": "w4a16",
        "status": "measured",
        "measured": {"kv_tokens": 276_880, "block_size": 16},
        "planner": {"kv_tokens": 277_360, "error_pct": 0.173},
    }
    no_fit = {
        "id": "Llama-3-70B/base",
        "model": "Llama-3-70B",
        "config": "base",
        "status": "does-not-fit",
        "reason": "does not fit, planner says ... CUDA graphs 0.72 GiB ...",
        "planner": {"fits": False},
    }
    error = {"id": "Qwen2-72B/w4a16-fp8kv", "status": "error", "reason": "boom"}
    moe = {
        "id": "Qwen3-30B-A3B/w4a16",
        "model": "Qwen3-30B-A3B",
        "config": "w4a16",
        "status": "measured",
        "measured": {"kv_tokens": 1_183_088, "block_size": 16},
        "planner": {"kv_tokens": 1},
        "vllm_memory": {"cuda_graph_pool_estimated_gib": 0.56},
        "planner_given_vllm_graph_estimate": {"kv_tokens": 1},
    }
    new, fit, err_row, moe_new = hs.replan([old, no_fit, error, moe], work=tmp_path, device=H200)
    assert new["measured"] == old["measured"] and new["planner"]["kv_tokens"] == plan.kv_cache_tokens
    assert new["planner"]["error_pct"] == kv_error_pct(plan.kv_cache_tokens, 276_880)
    assert "CUDA graphs 0.72" not in fit["reason"] and fit["reason"].startswith(
        "does not fit, planner says 131.42"
    )
    assert err_row is error
    recipe, config, _, moe_plan = hs.plan_row(
        "Qwen3-30B-A3B", Boot.QUANTIZED_16BIT_KV, work=tmp_path, rehearse=False, device=H200
    )
    given = plan_for(
        recipe,
        config,
        Boot.QUANTIZED_16BIT_KV,
        block_size=16,
        device_memory_bytes=H200,
        cudagraph_memory_bytes=int(0.56 * GIB),
    )
    assert moe_new["planner"]["kv_tokens"] == moe_plan.kv_cache_tokens  # the V1 runner's modelled estimate
    assert moe_new["planner_given_vllm_graph_estimate"]["kv_tokens"] == given.kv_cache_tokens
    assert moe_new["planner_given_vllm_graph_estimate"]["cuda_graph_source"] == "given"


def test_rows_that_did_not_boot_say_why(tmp_path):
    *_, plan = hs.plan_row("Llama-3-70B", Boot.BASE, work=tmp_path, rehearse=False, device=H200)
    why = hs.fit_decision(plan, Boot.BASE)
    no_fit = hs.assemble_row(
        "Llama-3-70B",
        ShapeRow(name=Boot.BASE, kv_cache_dtype="auto", tensor_parallel_size=1, planned=plan, not_booted=why),
        scheme="W4A16",
    )
    assert (no_fit["status"], no_fit["scheme"], no_fit["reason"], no_fit["measured"]) == (
        "does-not-fit",
        "bf16",
        why,
        None,
    )
    assert (
        no_fit["planner"]["fits"] is False
        and no_fit["planner"]["error_pct"] is None
        and no_fit["kernels"] is None
    )
    refused = hs.assemble_row(
        "Llama-3-70B",
        ShapeRow(
            name=Boot.QUANTIZED_16BIT_KV,
            kv_cache_dtype="auto",
            tensor_parallel_size=1,
            planned=plan,
            refused="No available memory for the cache blocks",
        ),
        scheme="W4A16",
        platform="cuda-fp8",
        log_text=LOG_72B + "ValueError: No available memory for the cache blocks",
    )
    assert refused["status"] == "refused" and refused["reason"].startswith("No available memory")
    assert (
        refused["kernels"]["kernels"] == ["MacheteLinearKernel"]
        and refused["kernels"]["kernel_check"] is None
    )
    assert hs.error_row("Qwen2-72B", Boot.BASE, "GateError: no metrics")["status"] == "error"


def test_the_json_keeps_every_row_in_the_table_order_and_summarizes_against_the_target():
    order = [hs.row_id(m, b) for m, b in hs.all_rows(hs.MODELS)]

    def row(rid: str, status: str, err: float | None = None, given: float | None = None) -> dict:
        return {
            "id": rid,
            "status": status,
            "planner": None if err is None else {"error_pct": err},
            "planner_given_vllm_graph_estimate": None if given is None else {"error_pct": given},
        }

    rows: list[dict] = []
    rows = merge_row(rows, row("Qwen2-72B/w4a16", "measured", 0.31, 0.02), order)
    rows = merge_row(rows, row("Llama-3-8B/base", "measured", 0.05, -0.01), order)
    rows = merge_row(rows, row("Llama-3-70B/base", "does-not-fit"), order)
    rows = merge_row(rows, row("Qwen3-30B-A3B/base", "error"), order)
    assert [r["id"] for r in rows] == [
        "Llama-3-8B/base",
        "Llama-3-70B/base",
        "Qwen2-72B/w4a16",
        "Qwen3-30B-A3B/base",
    ]
    rows = merge_row(rows, row("Qwen2-72B/w4a16", "measured", 0.08, 0.01), order)  # measured again: replaced
    assert len(rows) == 4 and rows[2]["planner"]["error_pct"] == 0.08
    s = hs.summarize(rows, order)
    assert (s["rows"], s["recorded"], s["measured"], s["does_not_fit"], s["complete"]) == (12, 3, 2, 1, False)
    assert (
        "Qwen3-30B-A3B/base" in s["missing"] and "Llama-3-8B/w4a16" in s["missing"] and len(s["missing"]) == 9
    )
    assert s["planner"] == {
        "rows": 2,
        "within_target": 2,
        "max_abs_error_pct": 0.08,
        "over_target": {},
        "all_within_target": True,
    }
    rows = merge_row(rows, row("Llama-3-8B/w4a16", "measured", -0.2, None), order)  # no graph estimate logged
    s = hs.summarize(rows, order)
    assert s["planner"]["over_target"] == {"Llama-3-8B/w4a16": -0.2} and not s["planner"]["all_within_target"]
    given = s["planner_given_vllm_graph_estimate"]
    assert (
        given["rows"] == 2 and given["within_target"] == 2 and not given["all_within_target"]
    )  # one row unplanned


def test_a_row_keeps_the_log_lines_its_figures_come_from():
    lines = evidence.evidence_lines(LOG_72B + POOL_LINES + "INFO Using FLASH_ATTN attention backend\n" * 3)
    assert not any("attention backend" in line for line in lines)
    assert any(line.startswith("INFO [gpu_worker.py:794] CUDA graph pool memory") for line in lines)
    assert (
        sum("Actual usage is" in line for line in lines) == 1
        and sum("Machete" in line for line in lines) == 1
    )
