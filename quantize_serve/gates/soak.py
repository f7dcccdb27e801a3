"""Soak stage: sustained traffic for a long time, for the failure that comes hours into production.

A stress test proves the server survives a burst; an out-of-memory kill hours later comes from
memory that grows a little with every request (a leak in the server, a cache without a bound,
fragmentation) or from a KV cache that only just fits and keeps preempting. Against one live vLLM
server (the production boot):

1. **Traffic**: ``concurrency`` requests kept in flight for ``duration_s``, drawn (seeded) from the
   traffic generator (:func:`quantize_serve.traffic.requests.token_prompts`, exact token counts,
   ``ignore_eos``), sent and classified by :func:`~quantize_serve.traffic.requests.send_probe`.
2. **Samples** every ``sample_interval_s`` by :class:`~quantize_serve.traffic.sampler.Sampler`:
   RSS of the server's process tree, GPU memory (NVML; None on CPU hosts),
   ``vllm:kv_cache_usage_perc``, ``vllm:num_preemptions_total``; a dead server stops the soak.
3. **The trend**: after ``warmup_s``, a least-squares line (``numpy.polyfit``) through memory
   against time; its slope in MiB/min is what the gate compares with
   ``max_memory_growth_mib_per_min``. Preemptions counted after warm-up must stay at or below
   ``max_preemptions_after_warmup``.

:func:`judge_soak` is pure: one human-readable line per violated condition. A soak that captured
too few samples after warm-up fails (it proved nothing). Output: ``soak-samples.jsonl`` (one
sample a line, ``t`` in seconds since the traffic started), ``soak_result.json`` and ``soak.png``
(the memory series with the fitted line).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from quantize_serve.core.errors import GateError
from quantize_serve.core.processes import process_alive
from quantize_serve.recipe.gates import MIN_SOAK_SAMPLES, SoakGate, StressGate
from quantize_serve.recipe.model import ServeSection
from quantize_serve.serving.server import RunningServer
from quantize_serve.traffic.requests import Probe, answer_failures, race, run_sync, send_probe, token_prompts
from quantize_serve.traffic.sampler import Sampler

if TYPE_CHECKING:
    pass

MIB = 2**20
SAMPLES_FILE = "soak-samples.jsonl"
CHART = "soak.png"
RSS, GPU = "rss_bytes", "gpu_memory_bytes"
KV_USAGE, PREEMPTIONS = "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total"
ERROR_PAUSE_S = 0.1  # after a failed request, so a broken server is not hammered in a busy loop


class SoakTraffic(BaseModel):
    """What the sustained traffic got back (requests cut off at the end of the soak are not counted)."""

    completed: int = 0  # HTTP 200 with exactly max_tokens completion tokens
    completed_after_warmup: int = 0
    errors_5xx: int = 0
    timeouts: int = 0
    wrong_token_counts: int = 0
    other_errors: int = 0
    error_samples: list[str] = Field(default_factory=list)

    @property
    def failed(self) -> int:
        return self.errors_5xx + self.timeouts + self.wrong_token_counts + self.other_errors


class SoakFigures(BaseModel):
    """What the samples show (a pure function of them: :func:`soak_figures`)."""

    samples: int
    samples_after_warmup: int  # samples after warm-up that read the RSS
    fit_window_s: float  # time between the first and last sample after warm-up
    rss_slope_mib_per_min: float | None  # least-squares slope after warm-up
    rss_intercept_mib: float | None  # the fitted line at t = 0 (for the chart)
    rss_after_warmup_bytes: int | None  # first RSS sample after warm-up
    rss_last_bytes: int | None
    peak_rss_bytes: int | None
    gpu_slope_mib_per_min: float | None  # None without NVML (CPU hosts)
    gpu_intercept_mib: float | None
    peak_gpu_memory_bytes: int | None
    peak_kv_cache_usage: float | None  # fraction 0..1
    preemptions: int | None  # over the whole soak
    preemptions_after_warmup: int | None


class SoakResult(BaseModel):
    duration_s: float  # planned traffic time (gates.soak.duration_s)
    measured_s: float  # traffic time actually run (shorter when the server died)
    warmup_s: float
    sample_interval_s: float
    concurrency: int
    prompt_tokens: list[int]
    output_tokens: list[int]
    max_memory_growth_mib_per_min: float
    max_preemptions_after_warmup: int
    figures: SoakFigures
    traffic: SoakTraffic
    server_died: bool
    failures: list[str]
    samples_path: str
    chart_path: str | None
    output_dir: str

    @property
    def passed(self) -> bool:
        return not self.failures

    def summary(self) -> dict[str, object]:
        """The figures a report shows, by name."""
        f = self.figures
        return {
            "duration_s": self.measured_s,
            "warmup_s": self.warmup_s,
            "concurrency": self.concurrency,
            "requests_completed": self.traffic.completed,
            "requests_failed": self.traffic.failed,
            "samples_after_warmup": f.samples_after_warmup,
            "rss_slope_mib_per_min": f.rss_slope_mib_per_min,
            "gpu_memory_slope_mib_per_min": f.gpu_slope_mib_per_min,
            "max_memory_growth_mib_per_min": self.max_memory_growth_mib_per_min,
            "peak_rss_bytes": f.peak_rss_bytes,
            "peak_gpu_memory_bytes": f.peak_gpu_memory_bytes,
            "peak_kv_cache_usage": f.peak_kv_cache_usage,
            "preemptions_after_warmup": f.preemptions_after_warmup,
        }


# --------------------------------------------------------------------------------------------
# The trend and the verdict (pure).
# --------------------------------------------------------------------------------------------


def fit_line(t_s: Sequence[float], values_bytes: Sequence[float | None]) -> tuple[float, float] | None:
    """Least-squares line through (minutes, MiB): (slope in MiB/min, intercept in MiB).

    Points whose value is None are left out; None when fewer than two points (or one instant) remain.
    """
    import numpy as np

    points = [(t, v) for t, v in zip(t_s, values_bytes, strict=True) if v is not None]
    if len(points) < 2 or len({t for t, _ in points}) < 2:
        return None
    t, v = np.asarray(points, dtype=float).T
    slope, intercept = np.polyfit(t / 60.0, v / MIB, 1)
    return float(slope), float(intercept)


def fit_slope(t_s: Sequence[float], values_bytes: Sequence[float | None]) -> float | None:
    """Growth in MiB/min of a byte series sampled at t_s seconds (least squares); None if unfit."""
    line = fit_line(t_s, values_bytes)
    return None if line is None else line[0]


def soak_figures(samples: Sequence[dict], warmup_s: float) -> SoakFigures:
    """Slopes, peaks and counts from samples with ``t`` (seconds since the traffic started)."""
    after = [s for s in samples if s["t"] >= warmup_s]
    rss_after = [s for s in after if s.get(RSS) is not None]
    times = [s["t"] for s in after]
    rss = fit_line(times, [s.get(RSS) for s in after])
    gpu = fit_line(times, [s.get(GPU) for s in after])
    counts = [(s["t"], s[PREEMPTIONS]) for s in samples if s.get(PREEMPTIONS) is not None]
    # preemptions after warm-up count from the last reading at or before its end (else the first reading)
    before = [c for t, c in counts if t <= warmup_s]
    base = before[-1] if before else counts[0][1] if counts else None

    def peak(key: str) -> float | None:
        values = [s[key] for s in samples if s.get(key) is not None]
        return max(values) if values else None

    return SoakFigures(
        samples=len(samples),
        samples_after_warmup=len(rss_after),
        fit_window_s=round(rss_after[-1]["t"] - rss_after[0]["t"], 2) if rss_after else 0.0,
        rss_slope_mib_per_min=None if rss is None else round(rss[0], 3),
        rss_intercept_mib=None if rss is None else rss[1],
        rss_after_warmup_bytes=_int(rss_after[0][RSS]) if rss_after else None,
        rss_last_bytes=_int(rss_after[-1][RSS]) if rss_after else None,
        peak_rss_bytes=_int(peak(RSS)),
        gpu_slope_mib_per_min=None if gpu is None else round(gpu[0], 3),
        gpu_intercept_mib=None if gpu is None else gpu[1],
        peak_gpu_memory_bytes=_int(peak(GPU)),
        peak_kv_cache_usage=peak(KV_USAGE),
        preemptions=_int(counts[-1][1] - counts[0][1]) if counts else None,
        preemptions_after_warmup=None if base is None else _int(counts[-1][1] - base),
    )


def judge_soak(
    figures: SoakFigures,
    traffic: SoakTraffic,
    gate: SoakGate,
    *,
    server_died: bool = False,
    death_reason: str = "",
) -> list[str]:
    """One line per violated condition; empty means passed."""
    f: list[str] = []
    limit = gate.max_memory_growth_mib_per_min
    first = f" (first: {traffic.error_samples[0]})" if traffic.error_samples else ""
    if server_died:
        f.append(f"the server died during the soak test: {death_reason or 'no reason recorded'}")
    if figures.samples_after_warmup < MIN_SOAK_SAMPLES:
        f.append(
            f"the soak captured {figures.samples_after_warmup} memory sample(s) after the "
            f"{gate.warmup_s:g} s warm-up ({figures.samples} in all); a trend needs at least "
            f"{MIN_SOAK_SAMPLES}, and a measurement that saw nothing is not a pass: raise "
            "gates.soak.duration_s or lower warmup_s or sample_interval_s"
        )
    else:
        for name, slope, start, end in (
            (
                "server memory (RSS of its process tree)",
                figures.rss_slope_mib_per_min,
                figures.rss_after_warmup_bytes,
                figures.rss_last_bytes,
            ),
            ("GPU memory (NVML)", figures.gpu_slope_mib_per_min, None, None),
        ):
            if slope is not None and slope > limit:
                span = f", {start / MIB:,.0f} -> {end / MIB:,.0f} MiB" if start and end else ""
                f.append(
                    f"{name} grew {slope:.1f} MiB/min after warm-up (least squares over "
                    f"{figures.fit_window_s:g} s{span}), over max_memory_growth_mib_per_min={limit:g}: "
                    f"{slope * 60 / 1024:.2f} GiB an hour, an out-of-memory kill in production; "
                    "look for a leak or an unbounded cache in the server"
                )
    if figures.preemptions_after_warmup is None:
        f.append("vllm:num_preemptions_total was never read from /metrics, so preemptions are unknown")
    elif figures.preemptions_after_warmup > gate.max_preemptions_after_warmup:
        f.append(
            f"{figures.preemptions_after_warmup} preemption(s) after warm-up (vllm:num_preemptions_total "
            f"kept climbing), over max_preemptions_after_warmup={gate.max_preemptions_after_warmup}: "
            "the KV cache cannot hold this load for long; lower gates.soak.concurrency or "
            "serve.max_num_seqs, or give the KV cache more memory"
        )
    f += answer_failures(traffic, gate.request_timeout_s, first)
    if traffic.other_errors:
        f.append(f"{traffic.other_errors} request(s) failed otherwise{first}")
    if not traffic.completed_after_warmup and not server_died:
        f.append(
            "no request completed after warm-up: the soak measured an idle server; raise "
            "gates.soak.duration_s, or lower output_tokens so requests finish within it"
        )
    return f


# --------------------------------------------------------------------------------------------
# The soak.
# --------------------------------------------------------------------------------------------


def run_soak_test(
    server: RunningServer,
    gate: SoakGate,
    serve: ServeSection,
    *,
    stress: StressGate | None = None,
    tokenizer_dir: str,
    output_dir: Path,
    server_process_alive: Callable[[], bool] | None = None,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> SoakResult:
    """Soak the live server; the result says whether and why it failed.

    Prompt and output sizes not set in ``gate`` come from ``stress`` (the recipe's gates.stress).
    Raises GateError only when the soak cannot run (sizes beyond max_model_len, no tokenizer, server
    down at the start); what the server does wrong during the soak is a failure in the result.
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    stress = stress or StressGate()
    prompts, outputs = gate.prompt_tokens or stress.prompt_tokens, gate.output_tokens or stress.output_tokens
    if max(prompts) + max(outputs) > serve.max_model_len:
        raise GateError(
            f"gates.soak: the largest prompt ({max(prompts)}) + the largest output ({max(outputs)}) "
            f"tokens exceed serve.max_model_len={serve.max_model_len}. Fix: lower "
            "gates.soak.prompt_tokens / output_tokens (or gates.stress's, which it defaults to)"
        )
    rng = random.Random(seed)
    prompt = token_prompts(tokenizer_dir, rng)
    if not server.healthy():
        raise GateError(
            f"the server at {server.base_url} is not healthy before the soak test; "
            f"last lines of its log:\n{server.log_tail(20)}"
        )
    alive = server_process_alive or (lambda: process_alive(server.pid))
    concurrency = serve.concurrency(gate.concurrency)

    def draw() -> tuple[list[int], int]:
        return prompt(rng.choice(prompts)), rng.choice(outputs)

    coro = _soak(server, gate, draw, concurrency, alive, log)
    samples, traffic, measured, death_reason, died = run_sync(coro)

    figures = soak_figures(samples, gate.warmup_s)
    samples_path = output_dir / SAMPLES_FILE
    with samples_path.open("w") as fh:
        fh.writelines(json.dumps(s) + "\n" for s in samples)
    result = SoakResult(
        duration_s=gate.duration_s,
        measured_s=measured,
        warmup_s=gate.warmup_s,
        sample_interval_s=gate.sample_interval_s,
        concurrency=concurrency,
        prompt_tokens=list(prompts),
        output_tokens=list(outputs),
        max_memory_growth_mib_per_min=gate.max_memory_growth_mib_per_min,
        max_preemptions_after_warmup=gate.max_preemptions_after_warmup,
        figures=figures,
        traffic=traffic,
        server_died=died,
        failures=judge_soak(figures, traffic, gate, server_died=died, death_reason=death_reason),
        samples_path=str(samples_path),
        chart_path=None,
        output_dir=str(output_dir),
    )
    with contextlib.suppress(Exception):  # a chart that cannot be drawn must not hide the verdict
        result.chart_path = str(soak_chart(samples, result, output_dir / CHART))
    (output_dir / "soak_result.json").write_text(result.model_dump_json(indent=2))
    slope = figures.rss_slope_mib_per_min
    log(
        f"soak: RSS {'n/a' if slope is None else f'{slope:+.1f}'} MiB/min after warm-up, "
        f"{traffic.completed} requests; "
        f"{'passed' if result.passed else 'FAILED: ' + '; '.join(result.failures)}"
    )
    return result


async def _soak(
    server: RunningServer,
    gate: SoakGate,
    draw: Callable[[], tuple[list[int], int]],
    concurrency: int,
    alive: Callable[[], bool],
    log: Callable[[str], None],
) -> tuple[list[dict], SoakTraffic, float, str, bool]:
    t0 = time.monotonic()
    sampler, stop = Sampler(server, alive), asyncio.Event()
    sampling = asyncio.create_task(_sample_every(sampler, gate.sample_interval_s, stop))
    traffic = SoakTraffic()
    log(
        f"soak: {concurrency} requests in flight for {gate.duration_s:g} s (warm-up {gate.warmup_s:g} s), "
        f"sampled every {gate.sample_interval_s:g} s"
    )
    ended, _ = await race(
        _sustain(server.base_url, draw, concurrency, gate, t0, traffic), sampler.dead, gate.duration_s
    )  # ends by time ("timeout") or by death ("died")
    measured = round(time.monotonic() - t0, 1)
    stop.set()
    with contextlib.suppress(asyncio.CancelledError):
        await sampling
    died = ended == "died" or sampler.dead.is_set()
    samples = [{**s, "t": round(s["t"] - t0, 2)} for s in sampler.samples]
    return samples, traffic, measured, sampler.death_reason, died


async def _sample_every(sampler: Sampler, interval_s: float, stop: asyncio.Event) -> None:
    import aiohttp  # heavy (~0.15 s): imported where requests are sent

    """The stress test's sampler at the soak's own cadence (one tick per interval, from t = 0)."""
    async with aiohttp.ClientSession() as session:
        while not stop.is_set() and not sampler.dead.is_set():
            started = time.monotonic()
            await sampler.tick(session)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, interval_s - (time.monotonic() - started)))


async def _sustain(
    base_url: str,
    draw: Callable[[], tuple[list[int], int]],
    concurrency: int,
    gate: SoakGate,
    t0: float,
    traffic: SoakTraffic,
) -> None:
    import aiohttp  # heavy (~0.15 s): imported where requests are sent

    """Keep ``concurrency`` requests in flight until cancelled (race() ends it at duration_s)."""
    url, index = base_url + "/v1/completions", itertools.count()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def worker() -> None:
            while True:
                tokens, max_tokens = draw()
                rec = await send_probe(
                    session, url, Probe(next(index), "normal", tokens, max_tokens), gate.request_timeout_s
                )
                outcome = rec["outcome"]
                if outcome == "completed":
                    traffic.completed += 1
                    if time.monotonic() - t0 >= gate.warmup_s:
                        traffic.completed_after_warmup += 1
                    continue
                field = {"5xx": "errors_5xx", "timeout": "timeouts", "wrong_tokens": "wrong_token_counts"}
                name = field.get(outcome, "other_errors")
                setattr(traffic, name, getattr(traffic, name) + 1)
                if rec.get("error") and len(traffic.error_samples) < 5:
                    traffic.error_samples.append(rec["error"])
                await asyncio.sleep(ERROR_PAUSE_S)

        await asyncio.gather(*(worker() for _ in range(concurrency)))


# --------------------------------------------------------------------------------------------
# The chart.
# --------------------------------------------------------------------------------------------


def soak_chart(samples: Sequence[dict], result: SoakResult, path: Path) -> Path:
    """Memory over time with the fitted line after warm-up; KV usage and preemptions below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f, warm_min = result.figures, result.warmup_s / 60
    fig, (mem, kv) = plt.subplots(2, 1, figsize=(9, 6), sharex=True, height_ratios=[2, 1])
    for key, label, color, line in (
        (RSS, "RSS, server process tree", "#4c72b0", (f.rss_slope_mib_per_min, f.rss_intercept_mib)),
        (GPU, "GPU memory (NVML)", "#c44e52", (f.gpu_slope_mib_per_min, f.gpu_intercept_mib)),
    ):
        points = [(s["t"] / 60, s[key] / MIB) for s in samples if s.get(key) is not None]
        if not points:
            continue
        t, v = zip(*points, strict=True)
        mem.plot(t, v, ".", color=color, label=label, markersize=4)
        slope, intercept = line
        if slope is not None and intercept is not None:
            fit_t = [tt for tt in t if tt >= warm_min]
            mem.plot(
                [fit_t[0], fit_t[-1]],
                [intercept + slope * fit_t[0], intercept + slope * fit_t[-1]],
                "-",
                color=color,
                label=f"fit after warm-up: {slope:+.1f} MiB/min",
            )
    mem.axvspan(0, warm_min, color="#dddddd", label="warm-up (not fitted)")
    mem.set_ylabel("MiB")
    verdict = "passed" if result.passed else "FAILED"
    mem.set_title(
        f"Soak: {result.concurrency} in flight for {result.measured_s:g} s, limit "
        f"{result.max_memory_growth_mib_per_min:g} MiB/min: {verdict}"
    )
    mem.legend(loc="best", fontsize=8)
    usage = [(s["t"] / 60, 100 * s[KV_USAGE]) for s in samples if s.get(KV_USAGE) is not None]
    if usage:
        kv.plot(*zip(*usage, strict=True), "-", color="#dd8452")
    kv.set_ylabel("KV cache usage %", color="#dd8452")
    kv.set_xlabel("minutes since the traffic started")
    counts = [(s["t"] / 60, s[PREEMPTIONS]) for s in samples if s.get(PREEMPTIONS) is not None]
    counts = [(t, c - counts[0][1]) for t, c in counts]
    if counts:
        from matplotlib.ticker import MaxNLocator

        pre = kv.twinx()
        pre.step(*zip(*counts, strict=True), where="post", color="#8172b3")
        pre.set_ylabel("preemptions since start", color="#8172b3")
        pre.set_ylim(bottom=0, top=max(1, max(c for _, c in counts)) * 1.1)
        pre.yaxis.set_major_locator(MaxNLocator(integer=True))
    kv.axvspan(0, warm_min, color="#dddddd")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)
