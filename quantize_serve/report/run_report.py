"""The run report: one typed object, written as report.json, report.md and a capacity chart.

The same content feeds the Prefect UI (artifacts) and the model card, so the three never disagree.
Accuracy tasks are named as lm-eval names them and their data by dataset id (:func:`eval_task_ref`),
not by the recipe's task file path; the run carries the vLLM version it served with and, when
Prefect has a UI, the run's page.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from quantize_serve.capacity.chart import CHART, capacity_chart
from quantize_serve.capacity.host_tier import HostTier
from quantize_serve.capacity.measure import CapacityReport
from quantize_serve.capacity.shape import ShapeCapacity
from quantize_serve.core.portable import portable_path
from quantize_serve.formats.choose import CHART as FORMATS_CHART
from quantize_serve.formats.choose import FormatChoice
from quantize_serve.gates.accuracy.results import AccuracyCheck, release_rates
from quantize_serve.gates.decision import Decision
from quantize_serve.gates.regression import RegressionResult, ReleaseResults
from quantize_serve.gates.soak import SoakResult
from quantize_serve.gates.prefix_reuse import OffloadDecision
from quantize_serve.gates.stress import StressResult
from quantize_serve.hub.client import PushResult
from quantize_serve.quantize.run import QuantizeResult
from quantize_serve.report.steps import RunSteps
from quantize_serve.report.provenance import (
    describe_hardware,
    eval_task_refs,
    serving_vllm_version,
    task_labels,
)
from quantize_serve.serve_profile.pinned import ServingProfile
from quantize_serve.serve_profile.search import ProfileSearchResult
from quantize_serve.serving.boot import Boot
from quantize_serve.validate.preflight import BaseModelRef


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
    overrides: dict[str, Any] = Field(default_factory=dict)  # recipe fields the run's parameters changed
    base: BaseModelRef
    checkpoint: QuantizeResult
    candidate: PushResult | None = None
    capacity: CapacityReport | None = None
    # what the run did and why, decided before the base or the checkpoint boots (report/steps.py): the base
    # booted or reused, row (b), quantization beside the base, compile ahead (with what it did)... Reports
    # written before it carried four of these as fields of their own (base_reused_from,
    # sixteen_bit_kv_reused_from, quantized_beside_base, compiled_ahead), which reading them now ignores
    steps: RunSteps | None = None
    # the Prometheus rules a promoted release carries (release/alerts.py), as the report's section; set by
    # the release step, None where it carries none (a rejected candidate, alerts.enabled false)
    alerts: str | None = None
    preflight: ShapeCapacity | None = None  # serve.preflight: measure - the shape with dummy weights
    profile: ProfileSearchResult | None = None
    formats: FormatChoice | None = None  # quantization.candidates: every format measured, the rule's choice
    accuracy: list[AccuracyCheck] = Field(default_factory=list)
    # context-once scoring's checks against lm-eval's echo path that found more than bf16 noise, by run:
    # kept or turned off, and why (gates/accuracy/results.py scoring_notes)
    scoring: list[str] = Field(default_factory=list)
    stress: StressResult | None = None
    soak: SoakResult | None = None  # only when the recipe sets gates.soak
    decision: Decision
    # the candidate's figures under this run's conditions (recorded with the release: release-results.json)
    results: ReleaseResults | None = None
    regression: RegressionResult | None = None  # the comparison with the release in production, or why off
    release: Release | None = None
    approval_note: str = ""  # approval: manual - the reviewer's note on the sign-off form
    serving_command: str
    serving_profile: ServingProfile | None = None  # serve-profile.yaml: the validated boot, KV cache pinned
    # serve.kv_offload: the host-memory tier measured on and off, and whether the profile carries it
    kv_tier: OffloadDecision | None = None
    kv_host_tier: HostTier | None = None  # the tier by vLLM's block arithmetic (None: LMCache sizes its own)
    kv_tier_sizing: str | None = None  # how serve.kv_offload.host_memory_share became its size on this host
    hardware: str = Field(default_factory=lambda: describe_hardware())
    vllm_version: str | None = None  # the serving environment's; write_report fills it in
    run_url: str | None = None  # the Prefect UI page of the run; None without a UI (ephemeral API)
    report_dir: str = ""

    @property
    def recipe_dir(self) -> Path:
        """The recipe's folder, which its task files are relative to."""
        return Path(self.recipe_source).parent if not self.recipe_source.startswith("<") else Path()

    def task_labels(self) -> dict[str, str]:
        """Each accuracy task as the recipe spells it -> its name in the report (provenance.task_labels)."""
        return task_labels(
            [c.task for c in self.accuracy], base_dir=self.recipe_dir, report_dir=self.report_dir
        )


class ReleaseRejected(Exception):
    """The data of a rejected run's failed state: the reasons, with the run's report. Prefect's engine
    raises a failed run's data when a deployment's run ends (an exception; the report itself would surface as
    "TypeError: Unexpected result for failed state"); :func:`report_of` gives a caller the report."""

    def __init__(self, message: str, report: RunReport | None = None) -> None:
        super().__init__(message)  # the message alone in args: pickled, __dict__ carries the report
        self.report = report


def report_of(result: Any) -> Any:
    """A flow run's result (``state.result(raise_on_failure=False)``) as its report where it has one, passed
    or rejected; otherwise the exception that stopped it."""
    return result.report if isinstance(result, ReleaseRejected) and result.report is not None else result


def stress_summary(stress: StressResult | None) -> dict:
    if stress is None:
        return {}
    keys = (
        "requests",
        "completed",
        "rejected_overlong",
        "errors_5xx",
        "timeouts",
        "server_restarts",
        "peak_kv_cache_usage",
        "preemptions",
        "peak_rss_bytes",
        "peak_gpu_memory_bytes",
        "duration_s",
    )
    out = {k: getattr(stress, k) for k in keys}
    if stress.throughput:
        out.update(
            request_throughput=stress.throughput.request_throughput,
            output_throughput=stress.throughput.output_throughput,
            p99_ttft_ms=stress.throughput.p99_ttft_ms,
        )
    return out


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
    steps = r.steps
    beside = steps.step("quantize").why if steps and steps.quantized_beside_base else None
    compiled = steps.step("compile ahead").outcome if steps else None
    lines = [
        f"# quantize-serve: {r.recipe}",
        "",
        f"**Decision: {verdict}**" + (f" - release {rel.status}" if rel else ""),
        "",
        "## Summary",
        f"- base model: `{r.base.repo_id or portable_path(r.base.local_dir)}` at `{r.base.sha[:12]}`"
        + (
            f"; {_lower_first(r.capacity.model.parameters_line())}" if r.capacity and r.capacity.model else ""
        ),
        (
            f"- quantized: {r.checkpoint.method} {r.checkpoint.scheme}, {r.checkpoint.base_bytes:,} -> "
            f"{r.checkpoint.quantized_bytes:,} bytes on disk ({r.checkpoint.seconds:.0f} s"
            f"{', reused' if r.checkpoint.cached else ''})"
        ),
        f"- quantization device: {r.checkpoint.device or 'not recorded'}"
        + (f"; {r.checkpoint.placement}" if r.checkpoint.placement else "")
        + (f"; beside the base's accuracy run ({beside})" if beside else ""),
        *([f"- the production boot: {compiled}"] if compiled else []),
        (
            f"- recipe: `{_recipe_source(r.recipe_source)}` (sha256 `{r.recipe_sha256[:12]}`), run "
            f"`{r.run_id}`" + (f" ({r.run_url})" if r.run_url else "") + f", {r.hardware}"
        ),
        f"- served with vLLM {r.vllm_version or 'unknown'}",
    ]
    if r.overrides:  # the deployment's parameters changed the recipe file: say how, next to it
        lines.append(
            "- the run's parameters changed the recipe: "
            + "; ".join(f"`{k}` = `{json.dumps(v)}`" for k, v in r.overrides.items())
        )
    if rel and rel.repo_id:
        lines.append(
            f"- Hub: `{rel.repo_id}` candidate `{(rel.candidate_sha or '')[:12]}`"
            + (f", `{rel.ref}` -> `{(rel.commit_sha or '')[:12]}`" if rel.status == "promoted" else "")
            + (f", rejection recorded as tag `{rel.rejection_tag}`" if rel.rejection_tag else "")
            + (f" ({rel.url})" if rel.url else "")
        )
    if steps:
        lines += [
            "",
            "## Steps (each choice and why, decided before the base or the checkpoint boots)",
            steps.markdown(),
        ]
    lines += ["", "## Decision", r.decision.markdown(), ""]
    if r.regression:
        lines += ["## Against production (base, production, candidate)", r.regression.markdown(), ""]
    if r.capacity:
        lines += ["## Capacity (same memory budget)", r.capacity.markdown(), ""]
        if steps and steps.base_reused_from:
            lines += [
                f"Row `base` and the base accuracy are reused from run `{steps.base_reused_from}`: the same "
                "base sha, accuracy tasks, serve settings, vLLM version and hardware; the base was not "
                "booted again.",
                "",
            ]
        if steps and steps.sixteen_bit_kv_reused_from:
            lines += [
                f"Row `{r.capacity.label(Boot.QUANTIZED_16BIT_KV)}` (16-bit KV) is reused from run "
                f"`{steps.sixteen_bit_kv_reused_from}`: the same "
                "base, quantization format, serve settings, vLLM version and hardware give the same tensor "
                "bytes and KV cache; the checkpoint was served with 16-bit KV there, and here only as "
                "released.",
                "",
            ]
        lines += [image_markdown("capacity", (folder or Path()) / CHART, embed=embed), ""]
    if r.preflight:
        lines += [
            "## Capacity before download (the model's shape, dummy weights)",
            r.preflight.markdown(),
            "",
        ]
    if r.formats:
        lines += [
            "## Release format (every candidate, production serving settings)",
            r.formats.markdown(),
            "",
        ]
        lines += [image_markdown("release formats", (folder or Path()) / FORMATS_CHART, embed=embed), ""]
    if r.profile:
        lines += ["## Serving profile search (largest stable max_num_seqs)", r.profile.markdown(), ""]
        if r.profile.plot_path:
            lines += [image_markdown("profile search", Path(r.profile.plot_path), embed=embed), ""]
    if r.accuracy:
        lines += [
            "## Accuracy (paired per document)",
            "| task | dataset | metric | base | quantized | recovery [95%] | documents | flipped | "
            "false pass at bad | true pass at good | result |",
            "|---|---|---|---:|---:|---:|---|---:|---:|---:|---|",
        ]
        refs = eval_task_refs([c.task for c in r.accuracy], base_dir=r.recipe_dir, report_dir=r.report_dir)
        labels = r.task_labels()
        for c in r.accuracy:
            ref = refs[c.task]
            rates = [
                f"{x:.1%} ({edge:g})" if x is not None and edge is not None else "-"
                for x, edge in ((c.false_pass, c.threshold), (c.true_pass, c.good_recovery))
            ]
            flips = f"{c.flip_rate:.1%}" if c.flip_rate is not None else "-"
            lines.append(
                f"| {labels[c.task]} | {ref.dataset} | {c.metric} | {_num(c.base)} | {_num(c.quantized)} | "
                f"{c.recovery_text} | {c.docs_text or '-'} | {flips} | {rates[0]} | {rates[1]} | "
                f"{'pass' if c.passed else '**FAIL**'}{', too few documents' if c.warning else ''} |"
            )
        release = release_rates(r.accuracy)
        lines += [
            *(["", release] if release else []),
            "",
            "Base and candidate are scored on the same documents (seeded random draw, same prompts); "
            "recovery's interval is paired (Fieller), perplexities on the log scale (nats: base / "
            "candidate). A metric passes when the sequential test shows recovery above the stated bad "
            "recovery; `false pass` and `true pass` are the chances this run's documents give to pass a "
            "candidate at the stated bad and good recoveries. `too few documents`: the run could not "
            "reach the stated true-pass rate (see the Decision's reason and docs/gates.md).",
            "",
        ]
        lines += [*(f"- scoring, {note}" for note in r.scoring), *([""] if r.scoring else [])]
    if r.stress:
        lines += [
            "## Stress test (quantized, production serving settings)",
            "| figure | value |",
            "|---|---|",
        ]
        lines += [f"| {k} | {_num(v)} |" for k, v in stress_summary(r.stress).items()]
        lines.append("")
    if r.soak:  # the chart lies beside the report when the flow's soak writes into the run folder
        lines += [
            "## Soak test (sustained traffic, production serving settings)",
            "| figure | value |",
            "|---|---|",
        ]
        lines += [f"| {k} | {_num(v)} |" for k, v in r.soak.summary().items()]
        lines += [""] + ([f"![soak]({Path(r.soak.chart_path).name})", ""] if r.soak.chart_path else [])
    if r.kv_tier:
        host = r.kv_host_tier.lines("the production boot") if r.kv_host_tier else []
        host += [f"- {r.kv_tier_sizing}"] if r.kv_tier_sizing else []
        lines += ["## Host-memory KV tier (prefix reuse, production serving settings)", *host, ""]
        lines += [r.kv_tier.markdown(), ""]
    if r.alerts:
        lines += [r.alerts.strip(), ""]
    lines += ["## Validated vLLM command", "```", r.serving_command, "```", ""]
    if r.serving_profile:
        lines += [r.serving_profile.markdown(), ""]
    return "\n".join(lines)


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def _recipe_source(source: str) -> str:
    """The recipe file relative to the project (a flow run gets it as an absolute path)."""
    return source if source.startswith("<") else portable_path(source)


def _num(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "n/a" if v is None else f"{v:,}" if isinstance(v, int) else str(v)


def write_report(report: RunReport, run_dir: Path) -> dict[str, Path]:
    """report.json, report.md and the chart; records the serving vLLM version if not yet known."""
    run_dir.mkdir(parents=True, exist_ok=True)
    report.vllm_version = report.vllm_version or serving_vllm_version()
    paths = {"json": run_dir / "report.json", "markdown": run_dir / "report.md"}
    report.report_dir = str(run_dir)
    if report.capacity:
        paths["chart"] = capacity_chart(
            report.capacity.configs, run_dir / CHART, scheme=report.capacity.scheme
        )
    paths["json"].write_text(json.dumps(report.model_dump(mode="json"), indent=2))
    paths["markdown"].write_text(render_markdown(report))
    return paths
