"""The run report: one typed object, written as report.json, report.md and a capacity chart.

The same content feeds the Prefect UI (artifacts) and the model card, so the three never disagree.
"""

from __future__ import annotations

import base64
import json
import platform
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from quantize_serve.accuracy import AccuracyCheck
from quantize_serve.capacity import GIB, CapacityReport
from quantize_serve.decision import Decision
from quantize_serve.hub import PushResult
from quantize_serve.model_card import AccuracyRow, ModelCardInputs, Provenance
from quantize_serve.portable import portable_path
from quantize_serve.profile_search import ProfileSearchResult
from quantize_serve.quantize import QuantizeResult
from quantize_serve.soak import SoakResult
from quantize_serve.stress import StressResult
from quantize_serve.validate import BaseModelRef, ValidatedRecipe

CHART = "capacity.png"


class Release(BaseModel):
    status: Literal["promoted", "rejected", "not-published"]
    repo_id: str | None = None
    ref: str | None = None
    commit_sha: str | None = None
    candidate_sha: str | None = None
    rejection_tag: str | None = None
    url: str | None = None
    approved_by: str | None = None


class RunReport(BaseModel):
    run_id: str
    recipe: str
    recipe_source: str
    recipe_sha256: str
    base: BaseModelRef
    checkpoint: QuantizeResult
    candidate: PushResult | None = None
    capacity: CapacityReport | None = None
    profile: ProfileSearchResult | None = None
    accuracy: list[AccuracyCheck] = Field(default_factory=list)
    stress: StressResult | None = None
    soak: SoakResult | None = None  # only when the recipe sets gates.soak
    decision: Decision
    release: Release | None = None
    serving_command: str
    hardware: str = Field(default_factory=lambda: describe_hardware())
    report_dir: str = ""

    def card_inputs(self, validated: ValidatedRecipe, *, status: str | None = None) -> ModelCardInputs:
        """The card of this run, with the gates' figures (see :func:`card_inputs`)."""
        return card_inputs(validated, self.base, self.checkpoint, self.serving_command,
                           status=status or (self.release.status if self.release else "candidate"),
                           hardware=self.hardware, report=self)


def calibration_summary(validated: ValidatedRecipe) -> dict:
    from quantize_serve.calibration import describe

    return describe(validated.recipe)


def card_inputs(validated: ValidatedRecipe, base: BaseModelRef, checkpoint: QuantizeResult,
                serving_command: str, *, status: str = "candidate", hardware: str | None = None,
                report: RunReport | None = None) -> ModelCardInputs:
    """What the model card says. Without ``report``: the card pushed with the candidate, with no
    run id, timings or gate figures, so identical inputs give identical bytes (and no new commit).
    With ``report``: the card of the gated release, with its figures and, if rejected, why."""
    recipe = validated.recipe
    q = recipe.quantization
    gates: dict = {}
    if report is not None:
        gates = dict(
            rejection_reasons=report.decision.reasons if status == "rejected" else [],
            capacity_markdown=(report.capacity.markdown() + f"\n\n![capacity]({CHART})") if report.capacity else "",
            accuracy=[AccuracyRow(task=c.task, metric=c.metric, base=c.base, quantized=c.quantized,
                                  recovery=c.recovery, threshold=c.threshold, passed=c.passed)
                      for c in report.accuracy if None not in (c.base, c.quantized, c.recovery)],
            stress=stress_summary(report.stress))
    return ModelCardInputs(
        repo_id=recipe.hub.repo_id if recipe.hub else recipe.name,
        base_model=base.repo_id or recipe.model.id, base_revision_sha=base.sha,
        method=q.method, scheme=q.scheme, group_size=q.group_size,
        calibration=calibration_summary(validated),
        calibration_fingerprint=checkpoint.calibration_fingerprint,
        status="candidate" if status == "not-published" else status,
        serving_command=serving_command,
        provenance=Provenance(recipe_sha256=validated.recipe_sha256,
                              engine_versions=checkpoint.engine_versions,
                              hardware=hardware or describe_hardware(),
                              run_id=report.run_id if report else ""),
        **gates,
    )


def stress_summary(stress: StressResult | None) -> dict:
    if stress is None:
        return {}
    keys = ("requests", "completed", "rejected_overlong", "errors_5xx", "timeouts", "server_restarts",
            "peak_kv_cache_usage", "preemptions", "peak_rss_bytes", "peak_gpu_memory_bytes", "duration_s")
    out = {k: getattr(stress, k) for k in keys}
    if stress.throughput:
        out.update(request_throughput=stress.throughput.request_throughput,
                   output_throughput=stress.throughput.output_throughput,
                   p99_ttft_ms=stress.throughput.p99_ttft_ms)
    return out


def describe_hardware() -> str:
    import os

    from quantize_serve.gpu import describe_devices

    return f"{platform.machine()} {os.cpu_count()} CPUs, {describe_devices() or 'no GPU'}"


def image_markdown(alt: str, path: Path, *, embed: bool = False) -> str:
    """A markdown image: a link relative to the report (report.md, the model card, which ship the
    PNG beside them), or with ``embed`` the PNG itself as a data URI, for the Prefect UI's markdown
    artifact, which has no folder to resolve a relative link against (its renderer allows
    ``data:image/`` sources on images)."""
    if embed and path.is_file():
        return f"![{alt}](data:image/png;base64,{base64.b64encode(path.read_bytes()).decode()})"
    return f"![{alt}]({path.name})"


def render_markdown(r: RunReport, *, embed_images: bool = False) -> str:
    """The report as markdown; ``embed_images`` inlines the charts (see ``image_markdown``)."""
    folder = Path(r.report_dir) if r.report_dir else None
    embed = embed_images and folder is not None
    verdict = "PASSED" if r.decision.passed else "FAILED"
    rel = r.release
    lines = [
        f"# quantize-serve: {r.recipe}",
        "",
        f"**Decision: {verdict}**" + (f" - release {rel.status}" if rel else ""),
        "",
        "## Summary",
        f"- base model: `{r.base.repo_id or portable_path(r.base.local_dir)}` at `{r.base.sha[:12]}`",
        f"- quantized: {r.checkpoint.method} {r.checkpoint.scheme}, {r.checkpoint.base_bytes:,} -> "
        f"{r.checkpoint.quantized_bytes:,} bytes on disk ({r.checkpoint.seconds:.0f} s"
        f"{', reused' if r.checkpoint.cached else ''})",
        f"- recipe: `{r.recipe_source}` (sha256 `{r.recipe_sha256[:12]}`), run `{r.run_id}`, {r.hardware}",
    ]
    if rel and rel.repo_id:
        lines.append(f"- Hub: `{rel.repo_id}` candidate `{(rel.candidate_sha or '')[:12]}`"
                     + (f", `{rel.ref}` -> `{(rel.commit_sha or '')[:12]}`" if rel.status == "promoted" else "")
                     + (f", rejection recorded as tag `{rel.rejection_tag}`" if rel.rejection_tag else "")
                     + (f" ({rel.url})" if rel.url else ""))
    lines += ["", "## Decision", r.decision.markdown(), ""]
    if r.capacity:
        lines += ["## Capacity (same memory budget)", r.capacity.markdown(), "",
                  image_markdown("capacity", (folder or Path()) / CHART, embed=embed), ""]
    if r.profile:
        lines += ["## Serving profile search (largest stable max_num_seqs)", r.profile.markdown(), ""]
        if r.profile.plot_path:
            lines += [image_markdown("profile search", Path(r.profile.plot_path), embed=embed), ""]
    if r.accuracy:
        lines += ["## Accuracy", "| task | metric | base | quantized | recovery | threshold | result |",
                  "|---|---|---:|---:|---:|---:|---|"]
        for c in r.accuracy:
            lines.append(f"| {c.task} | {c.metric} | {_num(c.base)} | {_num(c.quantized)} | {_num(c.recovery)} | "
                         f"{c.threshold:.2f} | {'pass' if c.passed else '**FAIL**'} |")
        lines.append("")
    if r.stress:
        lines += ["## Stress test (quantized, production serving settings)",
                  "| figure | value |", "|---|---|"]
        lines += [f"| {k} | {_num(v)} |" for k, v in stress_summary(r.stress).items()]
        lines.append("")
    if r.soak:  # the chart lies beside the report when the flow's soak writes into the run folder
        lines += ["## Soak test (sustained traffic, production serving settings)", "| figure | value |", "|---|---|"]
        lines += [f"| {k} | {_num(v)} |" for k, v in r.soak.summary().items()]
        lines += [""] + ([f"![soak]({Path(r.soak.chart_path).name})", ""] if r.soak.chart_path else [])
    lines += ["## Validated vLLM command", "```", r.serving_command, "```", ""]
    return "\n".join(lines)


def _num(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "n/a" if v is None else f"{v:,}" if isinstance(v, int) else str(v)


def capacity_chart(capacity: CapacityReport, path: Path) -> Path:
    """Weights and KV memory (stacked) and max concurrency for the three configurations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [c.name for c in capacity.configs]
    weights = [c.weights_bytes / GIB for c in capacity.configs]
    kv = [c.kv_cache_memory_bytes / GIB for c in capacity.configs]
    conc = [c.max_concurrency for c in capacity.configs]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.bar(names, weights, label="weights", color="#4c72b0")
    ax1.bar(names, kv, bottom=weights, label="KV cache", color="#dd8452")
    ax1.set_ylabel("GiB")
    ax1.set_title("Memory under one budget")
    ax1.legend()
    bars = ax2.bar(names, conc, color="#55a868")
    ax2.bar_label(bars, fmt="%.1fx")
    ax2.set_title(f"Max concurrency at {capacity.configs[0].max_model_len:,} tokens")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(report: RunReport, run_dir: Path) -> dict[str, Path]:
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": run_dir / "report.json", "markdown": run_dir / "report.md"}
    report.report_dir = str(run_dir)
    if report.capacity:
        paths["chart"] = capacity_chart(report.capacity, run_dir / CHART)
    paths["json"].write_text(json.dumps(report.model_dump(mode="json"), indent=2))
    paths["markdown"].write_text(render_markdown(report))
    return paths
