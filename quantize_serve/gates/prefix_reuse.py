"""Prefix reuse on the production boot, and whether vLLM's host-memory KV tier (serve.kv_offload) ships.

The workload is vLLM's own ``vllm bench serve --dataset-name prefix_repetition``: distinct random prefixes
whose tokens together are ``serve.kv_offload.workload.working_set`` times the boot's GPU KV cache, each sent
``prompts_per_prefix`` times with its own suffix, shuffled, so a prefix's later requests often come after
the GPU cache evicted it. Only a tier that holds what the GPU evicted can turn those misses into hits.

- :func:`plan_prefix_workload` sizes it (:class:`PrefixPlan`). vLLM's tier is write-through (it stores a
  copy of every prompt block the GPU computes), so it holds max(GPU, host) distinct tokens, not their sum:
  the working set is capped at 90% of the tier's tokens where they are known, and a cap that leaves it
  inside the GPU cache is said in the plan (the workload cannot show the tier then).
- :func:`run_prefix_workload` runs it once against a live server (:class:`PrefixFigures`): the bench's
  TTFT p50/p99 and output tokens per second, and from ``/metrics`` (before and after; KV usage sampled
  throughout by traffic/sampler.py) the prefix cache's queried and hit tokens on the GPU and in the tier,
  preemptions, the peak KV usage and the tier's load/store bytes. :func:`run_prefix_repeats` runs it
  ``repeats`` times on one boot, each with its own seed (fresh prefixes); run i has the same seed on both
  sides, so the tier-on and tier-off boots see the same prompts.
- :func:`decide_offload` compares the two sides (:class:`OffloadDecision`): the noise of a measure is the
  larger of the two sides' spreads (max - min over the repeats), and the tier ships (``ship:
  if_it_helps``) only where the median prefix hit rate rose by more than its noise and the median TTFT p50
  fell, or the median output throughput rose, by more than theirs, with no failed request and no more
  preemptions than without it. ``ship: always`` ships it and still says what was measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from quantize_serve.core.errors import GateError
from quantize_serve.core.processes import process_alive
from quantize_serve.recipe.model import PrefixWorkload
from quantize_serve.serving.metrics import counter_deltas, read_gauges
from quantize_serve.serving.server import RunningServer
from quantize_serve.traffic.bench import (
    BENCH_MIN_TIMEOUT_S,
    PrefixRepetition,
    bench_args,
    run_bench,
    start_bench,
    stop_bench,
)
from quantize_serve.traffic.requests import race, run_sync
from quantize_serve.traffic.sampler import Sampler

# The share of the host tier's tokens the working set may fill (the rest: what LRU churn and in-flight
# requests take)
HOST_TIER_SHARE = 0.9

# PrefixFigures' counters -> vLLM's series (counters are exposed with "_total"): the prefix cache's queried
# and hit prompt tokens on the GPU, the same for the tier (its queries are the GPU's misses), preemptions, and
# the tier's traffic (exposed only where a tier is configured)
PREFIX_COUNTERS = {
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "external_prefix_cache_queries": "vllm:external_prefix_cache_queries_total",
    "external_prefix_cache_hits": "vllm:external_prefix_cache_hits_total",
    "preemptions": "vllm:num_preemptions_total",
    "kv_offload_load_bytes": "vllm:kv_offload_load_bytes_total",
    "kv_offload_store_bytes": "vllm:kv_offload_store_bytes_total",
}
STARTED = "process_start_time_seconds"  # changed between the scrapes: the server restarted


# --------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------


class PrefixPlan(BaseModel):
    """The prefix_repetition run: ``num_prefixes`` prefixes x ``prompts`` // num_prefixes prompts each."""

    num_prefixes: int
    prompts: int
    prefix_len: int
    suffix_len: int
    output_len: int
    concurrency: int
    working_set_tokens: int  # num_prefixes x prefix_len: the distinct prefix tokens
    gpu_kv_tokens: int
    host_tier_tokens: int | None
    why: str

    @property
    def shows_tier(self) -> bool:
        """Whether the working set exceeds the GPU cache (else every hit is a GPU hit, tier or not)."""
        return self.working_set_tokens > self.gpu_kv_tokens

    def dataset(self) -> PrefixRepetition:
        return PrefixRepetition(
            prefix_len=self.prefix_len,
            suffix_len=self.suffix_len,
            num_prefixes=self.num_prefixes,
            output_len=self.output_len,
        )


def plan_prefix_workload(
    workload: PrefixWorkload,
    gpu_kv_tokens: int,
    host_tier_tokens: int | None,
    concurrency: int,
    *,
    max_model_len: int | None = None,
) -> PrefixPlan:
    """The workload sized to the boot: working_set x ``gpu_kv_tokens`` distinct prefix tokens in prefixes of
    prefix_len (rounded up to whole prefixes), capped at HOST_TIER_SHARE of ``host_tier_tokens`` when known
    (rounded down then, to stay inside the tier). ``concurrency``: the requests in flight where the
    workload sets none (serve.max_num_seqs). ``max_model_len``: a request must fit it."""
    if gpu_kv_tokens <= 0:
        raise ValueError(f"plan_prefix_workload: gpu_kv_tokens must be positive, got {gpu_kv_tokens}")
    w = workload
    request_tokens = w.prefix_len + w.suffix_len + w.output_len
    if max_model_len is not None and request_tokens > max_model_len:
        raise ValueError(
            f"serve.kv_offload.workload: a request of prefix_len {w.prefix_len} + suffix_len "
            f"{w.suffix_len} + output_len {w.output_len} = {request_tokens} tokens exceeds "
            f"serve.max_model_len {max_model_len}. Fix: shorten the prefix or raise max_model_len"
        )
    target = w.working_set * gpu_kv_tokens
    cap = None if host_tier_tokens is None else HOST_TIER_SHARE * host_tier_tokens
    capped = cap is not None and cap < target
    if capped:
        num_prefixes = max(1, math.floor(cap / w.prefix_len))
    else:
        num_prefixes = max(1, math.ceil(target / w.prefix_len))
    prompts = num_prefixes * w.prompts_per_prefix
    in_flight = min(w.concurrency or concurrency, prompts)
    working_set = num_prefixes * w.prefix_len
    why = (
        f"{num_prefixes:,} prefixes x {w.prefix_len:,} tokens = {working_set:,} distinct prefix tokens, "
        f"{working_set / gpu_kv_tokens:.2f}x the GPU KV cache's {gpu_kv_tokens:,} tokens"
    )
    if capped:
        why += (
            f" (working_set {w.working_set:g}x capped at {HOST_TIER_SHARE:.0%} of the host tier's "
            f"{host_tier_tokens:,} tokens)"
        )
    why += (
        f"; {w.prompts_per_prefix} prompts per prefix (+{w.suffix_len:,} suffix tokens, {w.output_len:,} "
        f"output tokens each), {prompts:,} prompts, {in_flight} in flight"
    )
    if in_flight * request_tokens > gpu_kv_tokens:
        why += (
            f"; the requests in flight alone take {in_flight * request_tokens:,} tokens, more than the GPU "
            "cache: expect preemptions with and without the tier"
        )
    if working_set <= gpu_kv_tokens:
        why += (
            f": the measurement cannot show the tier: the tier ({host_tier_tokens:,} tokens) is too small to "
            "hold more distinct prefixes than the GPU cache, which holds the whole working set"
        )
    return PrefixPlan(
        num_prefixes=num_prefixes,
        prompts=prompts,
        prefix_len=w.prefix_len,
        suffix_len=w.suffix_len,
        output_len=w.output_len,
        concurrency=in_flight,
        working_set_tokens=working_set,
        gpu_kv_tokens=gpu_kv_tokens,
        host_tier_tokens=host_tier_tokens,
        why=why,
    )


# --------------------------------------------------------------------------------------------
# One run: the bench's figures and the server's counters
# --------------------------------------------------------------------------------------------


class PrefixFigures(BaseModel):
    """One prefix_repetition run on one boot. Token counters are deltas over the run; a series the server
    does not expose is None (the tier's, without a tier)."""

    command: str
    result_path: str
    seed: int
    num_prompts: int
    completed: int
    failed: int
    duration_s: float | None = None
    output_throughput: float | None = None  # output tokens per second (the bench's)
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    ttft_mean_ms: float | None = None
    prefix_cache_queries: int | None = None  # prompt tokens looked up in the GPU prefix cache
    prefix_cache_hits: int | None = None
    external_prefix_cache_queries: int | None = None  # the GPU's misses, looked up in the tier
    external_prefix_cache_hits: int | None = None  # tokens loaded from the tier
    preemptions: int | None = None
    peak_kv_cache_usage: float | None = None  # fraction 0..1 of the GPU KV cache
    kv_offload_load_bytes: int | None = None
    kv_offload_store_bytes: int | None = None

    @property
    def gpu_hit_rate(self) -> float | None:
        return _rate(self.prefix_cache_hits, self.prefix_cache_queries)

    @property
    def tier_hit_rate(self) -> float | None:
        return _rate(self.external_prefix_cache_hits, self.external_prefix_cache_queries)

    @property
    def prefix_hit_rate(self) -> float | None:
        """Prompt tokens served from a cache (GPU or tier) per prompt token looked up."""
        if self.prefix_cache_hits is None:
            return None
        hits = self.prefix_cache_hits + (self.external_prefix_cache_hits or 0)
        return _rate(hits, self.prefix_cache_queries)

    @classmethod
    def from_run(
        cls,
        bench: dict,
        counters: dict[str, float],
        *,
        command: str,
        result_path: str,
        seed: int,
        peak_kv: float | None,
    ) -> PrefixFigures:
        """The bench's JSON (`vllm bench serve --save-result`) and the counters' deltas (PREFIX_COUNTERS)."""
        by_name = {key: round(counters[name]) for key, name in PREFIX_COUNTERS.items() if name in counters}
        return cls(
            command=command,
            result_path=result_path,
            seed=seed,
            num_prompts=int(bench.get("num_prompts") or 0),
            completed=int(bench.get("completed") or 0),
            failed=int(bench.get("failed") or 0),
            duration_s=bench.get("duration"),
            output_throughput=bench.get("output_throughput"),
            ttft_p50_ms=bench.get("p50_ttft_ms", bench.get("median_ttft_ms")),
            ttft_p99_ms=bench.get("p99_ttft_ms"),
            ttft_mean_ms=bench.get("mean_ttft_ms"),
            peak_kv_cache_usage=peak_kv,
            **by_name,
        )


def _rate(hits: int | None, queries: int | None) -> float | None:
    return None if hits is None or not queries else hits / queries


def scrape(server: RunningServer) -> dict[str, float]:
    """The counters PrefixFigures reads and the server's start time, summed over engines."""
    return read_gauges(server.get("/metrics"), [*PREFIX_COUNTERS.values(), STARTED])


async def run_prefix_workload_async(
    server: RunningServer,
    plan: PrefixPlan,
    *,
    tokenizer_dir: str,
    output_dir: Path,
    seed: int,
    timeout_s: float,
    alive: Callable[[], bool] | None = None,
) -> PrefixFigures:
    """One run of the plan against ``server`` (its bench in ``output_dir``). Raises GateError when it
    produced no figures: the server died or restarted, the bench failed or ran past ``timeout_s``.
    Requests that failed are figures (``failed``), not an error."""
    output_dir = Path(output_dir)
    argv = bench_args(
        server,
        tokenizer_dir=tokenizer_dir,
        num_prompts=plan.prompts,
        concurrency=plan.concurrency,
        output_dir=output_dir,
        seed=seed,
        dataset=plan.dataset(),
    )
    timeout = max(timeout_s, BENCH_MIN_TIMEOUT_S)
    sampler, stop = Sampler(server, alive or (lambda: process_alive(server.pid))), asyncio.Event()
    bench_proc = await start_bench(output_dir)  # its imports while the sampler takes its baseline
    sampling = asyncio.create_task(sampler.run(stop))
    try:
        await sampler.baseline.wait()
        before = await asyncio.to_thread(scrape, server)
        ended, outcome = await race(
            run_bench(argv, output_dir, timeout, prepared=bench_proc), sampler.dead, timeout + 30
        )
        up = ended == "done" and sampler.still_up()
        after = await asyncio.to_thread(scrape, server) if up else {}
    finally:
        await stop_bench(bench_proc)
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await sampling
    if ended != "done" or not up:
        raise GateError(
            "the prefix-reuse workload stopped: "
            + (
                f"the server died ({sampler.death_reason})"
                if sampler.dead.is_set()
                else f"vllm bench serve ran past {timeout + 30:.0f} s"
            )
        )
    bench, error = outcome
    if bench is None:
        raise GateError(f"the prefix-reuse workload produced no figures: {error}")
    if before.get(STARTED) != after.get(STARTED):
        raise GateError("the server restarted during the prefix-reuse workload: its counters start over")
    return PrefixFigures.from_run(
        bench,
        counter_deltas(before, after),
        command="vllm " + " ".join(argv),
        result_path=str(output_dir / "bench.json"),
        seed=seed,
        peak_kv=sampler.peak("vllm:kv_cache_usage_perc"),
    )


def run_prefix_workload(
    server: RunningServer,
    plan: PrefixPlan,
    *,
    tokenizer_dir: str,
    output_dir: Path,
    seed: int,
    timeout_s: float,
) -> PrefixFigures:
    """run_prefix_workload_async from sync code, or from async code (its own loop in a thread)."""
    coro = run_prefix_workload_async(
        server, plan, tokenizer_dir=tokenizer_dir, output_dir=output_dir, seed=seed, timeout_s=timeout_s
    )
    return run_sync(coro)


def run_prefix_repeats(
    server: RunningServer,
    plan: PrefixPlan,
    repeats: int,
    *,
    tokenizer_dir: str,
    output_dir: Path,
    seed: int,
    timeout_s: float,
) -> list[PrefixFigures]:
    """``repeats`` runs on one boot, run i in ``output_dir/repeat-<i+1>`` with seed ``seed + i`` (fresh
    prefixes each run; the other side's run i, given the same seed, sends the same prompts).
    ``timeout_s``: each run's."""

    async def runs() -> list[PrefixFigures]:
        return [
            await run_prefix_workload_async(
                server,
                plan,
                tokenizer_dir=tokenizer_dir,
                output_dir=Path(output_dir) / f"repeat-{i + 1}",
                seed=seed + i,
                timeout_s=timeout_s,
            )
            for i in range(repeats)
        ]

    return run_sync(runs())


# --------------------------------------------------------------------------------------------
# The decision: tier on against tier off
# --------------------------------------------------------------------------------------------


class Comparison(BaseModel):
    """One measure's medians over the repeats without and with the tier, and the run's noise for it (the
    larger of the two sides' spreads, max - min)."""

    off: float
    on: float
    noise: float
    lower_is_better: bool = False

    @property
    def gain(self) -> float:
        return self.off - self.on if self.lower_is_better else self.on - self.off

    @property
    def beats_noise(self) -> bool:
        return self.gain > self.noise


def compare(
    off: list[float | None], on: list[float | None], *, lower_is_better: bool = False
) -> Comparison | None:
    """The Comparison of two sides' values, or None where a side has no value for a repeat."""
    if not off or not on or None in off or None in on:
        return None
    return Comparison(
        off=statistics.median(off),
        on=statistics.median(on),
        noise=max(max(off) - min(off), max(on) - min(on)),
        lower_is_better=lower_is_better,
    )


class OffloadDecision(BaseModel):
    """Whether the serving profile carries the tier, and why (one sentence with the numbers)."""

    ship: bool
    helped: bool  # the measurement's verdict, whatever serve.kv_offload.ship says
    policy: Literal["if_it_helps", "always"]
    why: str
    hit_rate: Comparison | None = None
    ttft_p50_ms: Comparison | None = None
    output_throughput: Comparison | None = None
    plan: PrefixPlan | None = None
    on: list[PrefixFigures]
    off: list[PrefixFigures]

    def lines(self) -> list[str]:
        """The report's section: the plan, a row per run (tier off, then on), the verdict."""
        head = [f"Workload: {self.plan.why}.", ""] if self.plan else []
        rows = [
            "| tier | run | prefix hit rate | GPU hit rate | tier hit rate | TTFT p50 ms | TTFT p99 ms "
            "| output tok/s | preemptions | peak KV usage | failed |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for side, runs in (("off", self.off), ("on", self.on)):
            for i, f in enumerate(runs, 1):
                cells = [
                    _cell(f.prefix_hit_rate, "{:.2f}"),
                    _cell(f.gpu_hit_rate, "{:.2f}"),
                    _cell(f.tier_hit_rate, "{:.2f}"),
                    _cell(f.ttft_p50_ms, "{:,.0f}"),
                    _cell(f.ttft_p99_ms, "{:,.0f}"),
                    _cell(f.output_throughput, "{:,.1f}"),
                    _cell(f.preemptions, "{:,}"),
                    _cell(f.peak_kv_cache_usage, "{:.0%}"),
                    f"{f.failed} of {f.num_prompts}",
                ]
                rows.append(f"| {side} | {i} | " + " | ".join(cells) + " |")
        verdict = "The tier ships" if self.ship else "The tier is left out"
        return [*head, *rows, "", f"**{verdict}**: {self.why}."]

    def markdown(self) -> str:
        return "\n".join(self.lines())


def _cell(value, spec: str) -> str:
    return "—" if value is None else spec.format(value)


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def decide_offload(
    on: list[PrefixFigures],
    off: list[PrefixFigures],
    ship: Literal["if_it_helps", "always"] = "if_it_helps",
    *,
    plan: PrefixPlan | None = None,
) -> OffloadDecision:
    """Tier on against off on the same boot settings (module doc). ``ship``: serve.kv_offload.ship."""
    hit = compare([f.prefix_hit_rate for f in off], [f.prefix_hit_rate for f in on])
    ttft = compare([f.ttft_p50_ms for f in off], [f.ttft_p50_ms for f in on], lower_is_better=True)
    tput = compare([f.output_throughput for f in off], [f.output_throughput for f in on])
    figures = []
    if hit:
        figures.append(f"hit rate {hit.off:.2f} -> {hit.on:.2f} (noise {hit.noise:.2f})")
    if ttft:
        figures.append(f"TTFT p50 {_num(ttft.off)} -> {_num(ttft.on)} ms (noise {_num(ttft.noise)} ms)")
    if tput:
        figures.append(f"output {_num(tput.off)} -> {_num(tput.on)} tok/s (noise {_num(tput.noise)})")
    if on and off:
        figures.append(f"median of {len(off)} run(s) without the tier and {len(on)} with it")

    reason = blocked(on, off)
    if not reason and hit is None:
        reason = "the prefix hit rate was not measured on both sides"
    elif not reason and not hit.beats_noise:
        reason = "the prefix hit rate did not rise by more than the run's noise"
    elif not reason and not ((ttft and ttft.beats_noise) or (tput and tput.beats_noise)):
        reason = "more hits, but neither TTFT p50 fell nor output throughput rose by more than the noise"
    if reason and plan is not None and not plan.shows_tier:
        reason += " (the working set fit the GPU cache: the tier was too small for the workload to show it)"
    helped = not reason
    verdict = "the tier ships" if helped else f"the tier is left out: {reason}"
    if ship == "always" and not helped:
        verdict = f"the tier did not help ({reason}), and ships anyway: serve.kv_offload.ship is always"
    why = ", ".join(figures) + ": " + verdict if figures else verdict
    return OffloadDecision(
        ship=helped or ship == "always",
        helped=helped,
        policy=ship,
        why=why,
        hit_rate=hit,
        ttft_p50_ms=ttft,
        output_throughput=tput,
        plan=plan,
        on=on,
        off=off,
    )


def blocked(on: list[PrefixFigures], off: list[PrefixFigures]) -> str:
    """Why the runs cannot ship the tier whatever their figures ("" when nothing stands in the way)."""
    if not on or not off:
        return "no run " + ("with" if not on else "without") + " the tier to compare"
    lost = sum(f.failed + max(0, f.num_prompts - f.completed - f.failed) for f in on)
    if lost:
        return f"{lost} of {sum(f.num_prompts for f in on)} requests failed with the tier"
    lost = sum(f.failed + max(0, f.num_prompts - f.completed - f.failed) for f in off)
    if lost:
        return f"{lost} request(s) failed without the tier: no clean baseline to compare with"
    pre_on = [f.preemptions for f in on if f.preemptions is not None]
    pre_off = [f.preemptions for f in off if f.preemptions is not None]
    if pre_on and max(pre_on) > max(pre_off, default=0):
        return (
            f"the tier's runs preempted up to {max(pre_on):,} requests against "
            f"{max(pre_off, default=0):,} without it"
        )
    return ""
