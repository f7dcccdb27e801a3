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
   ``--max-concurrency`` = target). Its process starts with the traffic and imports vLLM's CLI
   meanwhile (traffic/bench.py start_bench), so the bench runs as the traffic ends; it does not run
   when a request of the traffic failed (the test has failed then). No figures are computed here.

The verdict is :attr:`StressResult.failures`: one human-readable line per violated condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from quantize_serve.core.errors import GateError
from quantize_serve.core.processes import process_alive
from quantize_serve.recipe.gates import StressGate
from quantize_serve.recipe.model import ServeSection
from quantize_serve.recipe.section import LONG_PROMPT_MARGIN as LONG_MARGIN
from quantize_serve.serving.server import RunningServer
from quantize_serve.traffic.bench import (
    BENCH_KEYS,
    BENCH_MIN_TIMEOUT_S,
    ThroughputFigures,
    bench_args,
    bench_lengths,
    run_bench,
    start_bench,
    stop_bench,
)
from quantize_serve.traffic.requests import Probe, answer_failures, race, run_steps, run_sync, token_prompts
from quantize_serve.traffic.sampler import SAMPLE_EVERY_S, Sampler


# How long a traffic whose requests failed waits for the sampler to see a dead server (its /health fails
# HEALTH_FAILURES_DEAD times in a row, one check every SAMPLE_EVERY_S) before it judges the server alive
SETTLE_S = 10.0


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


# --------------------------------------------------------------------------------------------
# The plan: deterministic prompts of exact token counts, split into concurrency steps.
# --------------------------------------------------------------------------------------------


def went_wrong(schedule: list[tuple[int, list[Probe]]], records: dict[int, dict]) -> bool:
    """Whether a request of the traffic ended otherwise than planned: a valid one not completed with its
    token count, an over-long one not rejected with HTTP 400."""
    want = {"overlong": "rejected_overlong"}
    return any(
        records.get(p.index, {}).get("outcome") != want.get(p.kind, "completed")
        for _, probes in schedule
        for p in probes
    )


def concurrency_steps(target: int) -> list[int]:
    return sorted({1, max(1, target // 4), max(1, target // 2), target})


def plan_traffic(
    profile: StressGate, serve: ServeSection, tokenizer_dir: str, *, seed: int
) -> list[tuple[int, list[Probe]]]:
    """(concurrency, requests) per step; over-long prompts go into the peak step."""
    max_len, max_out = serve.max_model_len, max(profile.output_tokens)
    long_len = max_len - max_out - LONG_MARGIN
    too_long = [p for p in profile.prompt_tokens if p + max_out > max_len]
    if too_long or long_len < 1:
        raise GateError(
            f"stress profile does not fit serve.max_model_len={max_len}: prompt_tokens {too_long or ''} "
            f"+ the largest output_tokens ({max_out}) exceed it. Fix: lower gates.stress.prompt_tokens / "
            f"output_tokens or raise serve.max_model_len"
        )
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

    steps = concurrency_steps(serve.concurrency(profile.concurrency))
    left, counts = n - min(n, steps[-1]), []
    for c in steps[:-1]:
        counts.append(min(c, left))
        left -= counts[-1]
    counts.append(n - sum(counts))
    schedule, start = [], 0
    for c, k in zip(steps, counts):
        if k:
            schedule.append((c, probes[start : start + k]))
        start += k
    peak, k = schedule[-1][1], profile.overlong_prompts
    for j, at in enumerate([(j + 1) * len(peak) // (k + 1) for j in range(k)]):  # spread through the peak
        peak.insert(at + j, Probe(n + j, "overlong", prompt(max_len + 16), 8))
    return schedule


# --------------------------------------------------------------------------------------------
# Traffic.
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# The sampler: vLLM's gauges, memory, liveness.
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# vllm bench serve.
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# The test.
# --------------------------------------------------------------------------------------------


def run_stress_test(
    server: RunningServer,
    profile: StressGate,
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
        raise GateError(
            f"the server at {server.base_url} is not healthy before the stress test; "
            f"last lines of its log:\n{server.log_tail(20)}"
        )
    alive = server_process_alive or (lambda: process_alive(server.pid))
    coro = _stress(server, profile, serve, schedule, alive, tokenizer_dir, output_dir, seed, log)
    return run_sync(coro)


async def _stress(
    server: RunningServer,
    profile: StressGate,
    serve: ServeSection,
    schedule: list[tuple[int, list[Probe]]],
    alive: Callable[[], bool],
    tokenizer_dir: str,
    output_dir: Path,
    seed: int,
    log: Callable[[str], None],
) -> StressResult:
    t0 = time.monotonic()
    target = serve.concurrency(profile.concurrency)
    bench_proc = await start_bench(output_dir)  # its imports while the traffic runs
    try:
        sampler, stop = Sampler(server, alive), asyncio.Event()
        sampling = asyncio.create_task(sampler.run(stop))
        await sampler.baseline.wait()  # counters before the first request (preemptions are a delta)
        records: dict[int, dict] = {}
        traffic, _ = await race(
            run_steps(server.base_url, schedule, profile.request_timeout_s, records, log),
            sampler.dead,
            profile.max_duration_s,
        )
        failed = traffic == "done" and went_wrong(schedule, records)
        if failed:  # requests failing fast can outrun the sampler: a few of its ticks to see a dead server
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sampler.dead.wait(), SETTLE_S)
        if traffic == "done" and not sampler.still_up():
            traffic = "died"

        throughput, bench_error = None, ""
        if traffic == "done" and failed:  # the test has failed: its figures would change nothing
            bench_error = "vllm bench serve did not run: the traffic's requests failed the test already"
        elif traffic == "done":
            input_len, output_len = bench_lengths(profile, serve)
            argv = bench_args(
                server,
                tokenizer_dir=tokenizer_dir,
                input_len=input_len,
                output_len=output_len,
                num_prompts=max(profile.num_requests, target),
                concurrency=target,
                output_dir=output_dir,
                seed=seed,
            )
            log(f"stress: vllm bench serve, {input_len} -> {output_len} tokens, concurrency {target}")
            timeout = max(profile.max_duration_s - (time.monotonic() - t0), BENCH_MIN_TIMEOUT_S)
            running = run_bench(argv, output_dir, timeout, prepared=bench_proc)
            ended, outcome = await race(running, sampler.dead, timeout + 30)
            bench, bench_error = (
                outcome
                if ended == "done"
                else (
                    None,
                    "vllm bench serve was stopped: "
                    + ("the server died" if ended == "died" else "it ran past its time limit"),
                )
            )
            if bench is not None:
                throughput = ThroughputFigures(
                    command="vllm " + " ".join(argv),
                    result_path=str(output_dir / "bench.json"),
                    input_len=input_len,
                    output_len=output_len,
                    **{k: bench.get(k) for k in BENCH_KEYS if bench.get(k) is not None},
                )
        else:
            bench_error = "vllm bench serve did not run: " + (
                "the server died during the traffic"
                if traffic == "died"
                else f"the traffic used up max_duration_s={profile.max_duration_s:g} s"
            )
    finally:
        await stop_bench(bench_proc)  # however the test went, no bench process outlives it
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
    result.failures = judge(
        result, profile, traffic=traffic, death_reason=sampler.death_reason, bench_error=bench_error
    )
    with (output_dir / "requests.jsonl").open("w") as f:
        f.writelines(
            json.dumps(records.get(p.index, {"index": p.index, "kind": p.kind, "outcome": "aborted"})) + "\n"
            for p in planned
        )
    with (output_dir / "metrics.jsonl").open("w") as f:
        f.writelines(json.dumps(s) + "\n" for s in sampler.samples)
    (output_dir / "stress_result.json").write_text(result.model_dump_json(indent=2))
    log(f"stress: {'passed' if result.passed else 'FAILED: ' + '; '.join(result.failures)}")
    return result


def judge(
    r: StressResult, profile: StressGate, *, traffic: str, death_reason: str, bench_error: str
) -> list[str]:
    """One line per violated condition; empty means passed."""
    f = []
    first = f" (first: {r.error_samples[0]})" if r.error_samples else ""
    if r.server_died:
        f.append(
            f"the server died during the stress test: {death_reason}"
            + (f"; {r.aborted} request(s) were never sent or never answered" if r.aborted else "")
        )
    if r.server_restarts:
        f.append(
            f"the server restarted {r.server_restarts} time(s) during the test "
            "(process_start_time_seconds changed)"
        )
    if traffic == "timeout":
        f.append(
            f"the traffic did not finish within max_duration_s={profile.max_duration_s:g} s; "
            f"{r.aborted} request(s) unanswered"
        )
    f += answer_failures(r, profile.request_timeout_s, first)
    if r.completed < profile.num_requests:
        f.append(
            f"only {r.completed} of {profile.num_requests} valid requests completed with the "
            "requested token count"
        )
    if r.rejected_overlong < r.overlong_expected:
        f.append(
            f"{r.overlong_expected - r.rejected_overlong} of {r.overlong_expected} over-long prompts "
            "did not get HTTP 400"
        )
    if r.other_errors:
        f.append(f"{r.other_errors} request(s) failed otherwise{first}")
    if not r.server_died and not r.peak_running:
        # A measurement that captured nothing proves nothing: the KV and memory peaks would be
        # those of an idle server, so the check fails instead of passing on empty data.
        f.append(
            f"the /metrics sampler saw no running request (peak vllm:num_requests_running = "
            f"{r.peak_running}, peak KV usage = {r.peak_kv_cache_usage}): the test measured an idle "
            "server; raise gates.stress.num_requests or output_tokens so the traffic lasts longer "
            f"than the {SAMPLE_EVERY_S:g} s sampling interval"
        )
    if r.preemptions is None:
        f.append("vllm:num_preemptions_total was never read from /metrics, so preemptions are unknown")
    elif r.preemptions > profile.max_preemptions:
        f.append(
            f"{r.preemptions} preemption(s) (vllm:num_preemptions_total), over max_preemptions="
            f"{profile.max_preemptions}: the KV cache cannot hold this concurrency; lower "
            "serve.max_num_seqs or serve.max_model_len, or give the KV cache more memory"
        )
    if r.throughput is None:
        f.append(bench_error or "vllm bench serve produced no result")
    elif r.throughput.failed or r.throughput.completed < r.throughput.num_prompts:
        f.append(
            f"vllm bench serve: {r.throughput.failed} of {r.throughput.num_prompts} requests failed "
            f"(see {Path(r.output_dir) / 'bench.log'})"
        )
    return f


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)
