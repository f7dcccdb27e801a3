"""Serving-profile search: the largest ``max_num_seqs`` the stress profile survives, found with real boots.

The planner predicts a safe ``max_num_seqs`` from arithmetic (KV tokens / ``max_model_len``, less
10 %), assuming every request is ``max_model_len`` tokens long. Real traffic is shorter, so the real
limit usually lies above it; how far depends on the traffic. This stage measures it: each candidate
``max_num_seqs`` is one vLLM boot (the production configuration: the quantized checkpoint, the
recipe's KV dtype and KV budget) and one stress test (the recipe's stress profile at concurrency =
the candidate). A candidate passes when the stress test passes: no failed request and no more
preemptions than ``gates.stress.max_preemptions``.

The search (:func:`search_largest`) starts at the planner's recommendation, then brackets the limit
(doubling while it passes, halving while it fails) and bisects the bracket until the largest passing
and the smallest failing value are at most ``serve.search.step`` apart, or ``serve.search.max_boots``
boots are spent. Every boot is recorded as a :class:`SearchPoint`: its settings, pass/fail and why
(the stress test's failures), the peak KV usage and the throughput.

The boot-and-stress step is a ``probe(serve_section) -> SearchPoint`` callable
(``serve_profile.probe.vllm_probe`` for the real one), so the search logic is tested without boots.

What shows the limit: preemptions come from outputs that grow after admission (vLLM reserves a
prompt's blocks before it admits the request, so long prompts alone never preempt). A profile that
finds the limit needs long outputs against the KV budget, e.g. 256-token outputs against a budget of
a few dozen 128-token blocks on the tiny model (benchmarks/results/capacity/README.md).

The winner ships as ``serve-profile.yaml`` (``profile_output.write_serve_profile``), a file ``vllm serve
--config`` reads: the boot's vLLM config (``ServerSpec.vllm_config``). The modules: this one (the
search and its records), ``serve_profile.probe`` (the real boots), ``serve_profile.output`` (the file and the
chart).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from quantize_serve.capacity import planner
from quantize_serve.capacity.measure import plan_for
from quantize_serve.core.errors import GateError
from quantize_serve.recipe.model import ProfileSearch, Recipe, ServeSection
from quantize_serve.serving.boot import Boot
from quantize_serve.serving.server import ServerSpec

# KV block size when the recipe uses a fixed budget (the CPU runs: vLLM CPU's block is 128 tokens)
# and when it does not (CUDA's default, 16). Only the planner's starting point depends on it.
CPU_BLOCK_SIZE, GPU_BLOCK_SIZE = planner.BLOCK_SIZE_CPU, planner.BLOCK_SIZE_GPU

Dimension = Literal["max_num_seqs", "max_model_len"]


class SearchPoint(BaseModel):
    """One probed setting: what was booted, whether the stress profile passed, and why not."""

    dimension: Dimension = "max_num_seqs"
    max_num_seqs: int
    max_num_batched_tokens: int | None
    max_model_len: int
    passed: bool
    why: list[str] = Field(
        default_factory=list, description="The stress test's failures (or the boot error)."
    )
    peak_kv_cache_usage: float | None = Field(default=None, description="Fraction 0..1 (vLLM's gauge).")
    preemptions: int | None = None
    output_throughput: float | None = Field(default=None, description="tokens/s, vllm bench serve")
    request_throughput: float | None = Field(default=None, description="requests/s, vllm bench serve")
    mean_tpot_ms: float | None = None
    boot_seconds: float | None = None
    seconds: float | None = Field(default=None, description="Wall time of the probe (boot + stress + stop).")
    log_path: str | None = None
    spec: ServerSpec | None = Field(default=None, description="The real boot; None for injected probes.")

    @property
    def value(self) -> int:
        return self.max_num_seqs if self.dimension == "max_num_seqs" else self.max_model_len

    def summary(self) -> str:
        kv = f"{self.peak_kv_cache_usage:.0%}" if self.peak_kv_cache_usage is not None else "-"
        tput = f"{self.output_throughput:.0f} tok/s" if self.output_throughput is not None else "-"
        verdict = "pass" if self.passed else "FAIL: " + "; ".join(self.why)[:300]
        return (
            f"max_num_seqs={self.max_num_seqs} max_model_len={self.max_model_len} "
            f"preemptions={self.preemptions} peak KV={kv} output {tput}: {verdict}"
        )


Probe = Callable[[ServeSection], SearchPoint]


class ProfileSearchResult(BaseModel):
    found: SearchPoint | None = Field(description="The best validated setting; None when nothing passed.")
    boots: int
    points: list[SearchPoint] = Field(description="Every probe, in boot order.")
    planner_start: int = Field(description="The planner's recommended max_num_seqs, clamped to the range.")
    planner_recommended: int
    planner_max_concurrency: float
    min_num_seqs: int
    max_num_seqs: int
    step: int
    stop_reason: str
    max_model_len_stop_reason: str | None = None
    profile_path: str | None = None
    serve_command: str | None = None
    plot_path: str | None = None

    def markdown(self) -> str:
        rows = [
            "| boot | max_num_seqs | max_model_len | result | preemptions | peak KV | output tok/s | why |",
            "|---:|---:|---:|---|---:|---:|---:|---|",
        ]
        for i, p in enumerate(self.points, 1):
            kv = f"{p.peak_kv_cache_usage:.0%}" if p.peak_kv_cache_usage is not None else "-"
            tput = f"{p.output_throughput:.0f}" if p.output_throughput is not None else "-"
            why = "; ".join(p.why).replace("|", "/")[:160]
            rows.append(
                f"| {i} | {p.max_num_seqs} | {p.max_model_len} | {'pass' if p.passed else 'fail'} | "
                f"{p.preemptions if p.preemptions is not None else '-'} | {kv} | {tput} | {why} |"
            )
        found = (
            f"max_num_seqs={self.found.max_num_seqs}, max_num_batched_tokens="
            f"{self.found.max_num_batched_tokens}, max_model_len={self.found.max_model_len}"
            if self.found
            else "nothing passed"
        )
        return "\n".join(
            [
                f"Found: {found} after {self.boots} boot(s); searched "
                f"{self.min_num_seqs}..{self.max_num_seqs} at step {self.step}, starting at the planner's "
                f"{self.planner_start} (max concurrency {self.planner_max_concurrency:.2f}). Stopped: "
                f"{self.stop_reason}",
                "",
                *rows,
            ]
        )


# --------------------------------------------------------------------------------------------
# The search logic (no boots: everything goes through the probe).
# --------------------------------------------------------------------------------------------


class _BudgetSpent(Exception):
    pass


def search_largest(
    try_value: Callable[[int], SearchPoint],
    *,
    start: int,
    lo: int,
    hi: int,
    step: int,
    max_boots: int,
    known: Sequence[SearchPoint] = (),
) -> tuple[SearchPoint | None, list[SearchPoint], str]:
    """The largest value in [lo, hi] whose probe passes, to within ``step``.

    Start at ``start`` (or from ``known`` points, already measured, which cost no boot); while the
    largest pass has no failure above it, double (capped at ``hi``); while the smallest failure has no
    pass below it, halve (floored at ``lo``); then bisect the bracket (largest pass, smallest fail)
    until they are at most ``step`` apart. Each probe moves one end of the bracket, so no value is
    probed twice, and there are never more than ``max_boots`` probes. Returns (the largest passing
    point or None, the new points in probe order, why it stopped).
    """
    if not lo <= hi:
        raise ValueError(f"empty search range [{lo}, {hi}]")
    points: list[SearchPoint] = []
    passed: SearchPoint | None = None  # largest passing
    failed: SearchPoint | None = None  # smallest failing above it

    def probe(value: int) -> SearchPoint:
        if len(points) >= max_boots:
            raise _BudgetSpent
        point = try_value(value)
        points.append(point)
        return point

    def record(point: SearchPoint) -> None:
        nonlocal passed, failed
        if point.passed and (passed is None or point.value > passed.value):
            passed = point
        if not point.passed and (failed is None or point.value < failed.value):
            failed = point

    for point in known:
        record(point)
    try:
        if passed is None and failed is None:
            record(probe(min(max(start, lo), hi)))
        while passed is not None and failed is None and passed.value < hi:  # grow
            record(probe(min(hi, max(2 * passed.value, passed.value + 1))))
        while failed is not None and passed is None and failed.value > lo:  # shrink
            record(probe(max(lo, min(failed.value // 2, failed.value - 1))))
        while passed is not None and failed is not None and failed.value - passed.value > step:  # bisect
            record(probe((passed.value + failed.value) // 2))
    except _BudgetSpent:
        bracket = f"bracket [{passed.value if passed else '-'}, {failed.value if failed else '-'}]"
        return passed, points, f"max_boots={max_boots} spent with {bracket} (step {step})"
    if passed is None:
        return None, points, f"even the lower end {lo} failed"
    if failed is None:
        return passed, points, f"the upper end {hi} passed: the limit lies above the searched range"
    return passed, points, (f"bracketed: {passed.value} passes, {failed.value} fails (within step {step})")


def candidate_serve(
    serve: ServeSection, *, max_num_seqs: int, max_model_len: int | None = None
) -> ServeSection:
    """The recipe's serve section with one candidate's values (validated like a recipe's).

    max_num_batched_tokens is the recipe's (or vLLM's default, 8192: ServeSection.batched_tokens), raised
    to max_num_seqs where it is lower: vLLM needs at least one token per running sequence in a step.
    """
    batched = max(serve.batched_tokens, max_num_seqs)
    data = serve.model_dump()
    data.update(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=batched,
        max_model_len=max_model_len or serve.max_model_len,
    )
    return ServeSection.model_validate(data)


def search_profile(
    probe: Probe,
    serve: ServeSection,
    search: ProfileSearch,
    *,
    planner_recommended: int,
    planner_max_concurrency: float,
    max_model_len_range: tuple[int, int] | None = None,
    max_model_len_step: int = CPU_BLOCK_SIZE,
) -> ProfileSearchResult:
    """Search max_num_seqs (and, if asked, then max_model_len) through ``probe``."""
    lo = search.min_num_seqs
    hi = search.max_num_seqs or max(lo, int(planner_max_concurrency))
    hi = max(hi, lo)
    start = min(max(planner_recommended, lo), hi)

    def seqs(value: int) -> SearchPoint:
        point = probe(candidate_serve(serve, max_num_seqs=value))
        return point.model_copy(update={"dimension": "max_num_seqs"})

    found, points, reason = search_largest(
        seqs, start=start, lo=lo, hi=hi, step=search.step, max_boots=search.max_boots
    )
    len_reason = None
    if search.max_model_len_search and found is not None and max_model_len_range is not None:
        len_lo, len_hi = max_model_len_range
        n = found.max_num_seqs

        def length(value: int) -> SearchPoint:
            point = probe(candidate_serve(serve, max_num_seqs=n, max_model_len=value))
            return point.model_copy(update={"dimension": "max_model_len"})

        # The found point already passed at the recipe's max_model_len: the bracket's known lower end.
        longest, len_points, len_reason = search_largest(
            length,
            start=len_lo,
            lo=len_lo,
            hi=len_hi,
            step=max_model_len_step,
            max_boots=search.max_boots,
            known=[found.model_copy(update={"dimension": "max_model_len"})],
        )
        points += len_points
        if longest is not None and longest.max_model_len > found.max_model_len:
            found = longest
    return ProfileSearchResult(
        found=found,
        boots=len(points),
        points=points,
        planner_start=start,
        planner_recommended=planner_recommended,
        planner_max_concurrency=round(planner_max_concurrency, 3),
        min_num_seqs=lo,
        max_num_seqs=hi,
        step=search.step,
        stop_reason=reason,
        max_model_len_stop_reason=len_reason,
    )


def search_serve_profile(
    recipe: Recipe,
    checkpoint_dir: str | Path,
    *,
    probe: Probe,
    block_size: int | None = None,
    device_memory_bytes: int | None = None,
    log: Callable[[str], None] = print,
) -> ProfileSearchResult:
    """Search the recipe's serving profile on the quantized checkpoint (serve.search's settings).

    The planner's numbers come from the checkpoint's config.json (same shape as the base), in the
    capacity stage's accounting (fixed budget when serve.memory_budget is set, else the device's
    ``device_memory_bytes``). ``block_size`` defaults to vLLM's: 128 on CPU (the fixed-budget runs),
    16 on CUDA. ``probe`` boots and stresses one setting (``serve_profile.probe.vllm_probe``: real boots).
    """
    search = recipe.serve.search or ProfileSearch()
    if not search.enabled:
        raise GateError("serve.search.enabled is false; enable it, or do not run the profile search")
    checkpoint_dir = Path(checkpoint_dir)
    config = json.loads((checkpoint_dir / "config.json").read_text())
    fixed = recipe.serve.memory_budget is not None
    block = block_size or (CPU_BLOCK_SIZE if fixed else GPU_BLOCK_SIZE)
    plan = plan_for(
        recipe, config, Boot.PRODUCTION, block_size=block, device_memory_bytes=device_memory_bytes
    )
    len_range = None
    if search.max_model_len_search:
        longest = min(plan.largest_max_model_len, int(config.get("max_position_embeddings") or 0) or 10**9)
        len_range = (recipe.serve.max_model_len, max(recipe.serve.max_model_len, longest))
    log(
        f"profile search: planner: KV {plan.kv_cache_tokens:,} tokens, max concurrency "
        f"{plan.max_concurrency:.2f} at max_model_len {recipe.serve.max_model_len}, recommends "
        f"max_num_seqs={plan.recommended_max_num_seqs}"
    )
    result = search_profile(
        probe,
        recipe.serve,
        search,
        planner_recommended=plan.recommended_max_num_seqs,
        planner_max_concurrency=plan.max_concurrency,
        max_model_len_range=len_range,
        max_model_len_step=block,
    )
    log(
        f"profile search: {result.stop_reason}; found "
        + (result.found.summary() if result.found else "nothing that passes")
    )
    return result


# --------------------------------------------------------------------------------------------
# The winner as the gate's ServeSection (profile_output writes it as a file).
# --------------------------------------------------------------------------------------------


def found_serve(serve: ServeSection, result: ProfileSearchResult) -> ServeSection:
    """``serve`` with the found max_num_seqs / max_num_batched_tokens / max_model_len (for ServerSpec)."""
    if result.found is None:
        raise GateError(
            f"the profile search found no passing max_num_seqs ({result.stop_reason}); "
            "give the KV cache more memory, lower serve.max_model_len, or lower "
            "serve.search.min_num_seqs"
        )
    f = result.found
    data = serve.model_dump()
    data.update(
        max_num_seqs=f.max_num_seqs,
        max_num_batched_tokens=f.max_num_batched_tokens,
        max_model_len=f.max_model_len,
    )
    return ServeSection.model_validate(data)
