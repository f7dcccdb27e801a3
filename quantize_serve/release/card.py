"""The model card: what a consumer of the quantized repo needs to trust and serve it.

Rendered from plain data (``ModelCardInputs``) into a ``huggingface_hub.ModelCard``. The YAML
header uses ``ModelCardData`` with ``eval_results``, so the Hub renders the ``model-index``
metadata as an evaluation table; the quantized model's scores go there (the base scores and the
recovery ratios sit in the body's table, next to the thresholds the gate applied). Tasks are named
by their lm-eval task name and datasets by id (a Hub dataset id, or ``local:<name>`` with the data's
sha256 as the revision for data in a project file), never by a file path. A base model on the Hub
is linked in the model tree with ``base_model`` and ``base_model_relation: quantized``.
The card is pushed in the same commit as the checkpoint and updated when the gates decide.

No ``.eval_results/`` files: see ``EVAL_RESULTS_NOTE``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from quantize_serve.capacity.chart import CHART
from quantize_serve.gates.accuracy.results import format_recovery
from quantize_serve.hub.client import SHA40
from quantize_serve.quantize.calibration import describe
from quantize_serve.quantize.existing_checkpoint import checkpoint_group_size
from quantize_serve.quantize.run import QuantizeResult
from quantize_serve.recipe.section import REPO_ID, looks_local
from quantize_serve.report.provenance import describe_hardware, eval_task_refs, public_url
from quantize_serve.report.run_report import RunReport, stress_summary
from quantize_serve.validate.preflight import BaseModelRef, ValidatedRecipe

if TYPE_CHECKING:
    from huggingface_hub import ModelCard

Status = Literal["candidate", "promoted", "rejected"]
STATUS_LINE = {
    "candidate": "**Status: candidate: gates pending.** Do not use this revision in production yet.",
    "promoted": "**Status: promoted.** This revision passed the accuracy and stress gates.",
    "rejected": "**Status: rejected.** This revision failed its gates and was not promoted.",
}
# Why the scores are in model-index and not in the Hub's `.eval_results/*.yaml` format (its schema:
# huggingface/hub-docs eval_results.yaml and docs/hub/eval-results.md; huggingface_hub's
# EvalResultEntry): an entry is one `value` for a `dataset.id` that must be a registered Hub
# Benchmark and a `task_id` from that benchmark's eval.yaml, with no metric name and no reference
# model, so a recovery against the base cannot be expressed (nor a project-local task).
EVAL_RESULTS_NOTE = (
    "Not written as `.eval_results/` files: that Hub format (hub-docs `eval_results.yaml`) holds one "
    "value per registered Hub Benchmark dataset and task, with no metric name and no reference model, "
    "so it cannot carry recovery against the base (nor a project-local task). The quantized scores "
    "are in this card's `model-index` metadata; the base scores and recovery are in the table above."
)
# Anything that looks like a credential is masked before the card is written (defence in depth:
# inputs should never hold one, but a serving command may be pasted with --api-key in it).
SECRET_PATTERNS = (
    (re.compile(r"\bhf_[A-Za-z0-9]{16,}"), "hf_<redacted>"),
    (
        re.compile(r"(?i)(--api-key[= ]|--hf-token[= ]|bearer\s+|(?:HF_TOKEN|HUGGING_FACE_HUB_TOKEN)=)\S+"),
        r"\1<redacted>",
    ),
)


class AccuracyRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: str = Field(description="lm-eval's task name (e.g. gsm8k), never a file path")
    dataset: str = Field(description="Hub dataset id (e.g. openai/gsm8k), or local:<name> for a file")
    dataset_config: str | None = None
    dataset_split: str | None = None
    dataset_revision: str | None = Field(
        default=None, description="the dataset's revision; for local data, the sha256 of its file(s)"
    )
    metric: str
    base: float
    quantized: float
    recovery: float
    recovery_interval: tuple[float, float] | None = Field(
        default=None, description="~95% paired interval on the recovery (per-document differences, Fieller)"
    )
    threshold: float = Field(
        description="the stated bad recovery: a candidate this bad passes at most max_false_pass of the time"
    )
    documents: str = Field(default="", description="documents paired, and the look the gate stopped at")
    false_pass: float | None = Field(
        default=None, description="achieved chance to pass a candidate at threshold"
    )
    true_pass: float | None = Field(
        default=None, description="achieved chance to pass one at the good recovery"
    )
    passed: bool


class Provenance(BaseModel):
    model_config = ConfigDict(extra="forbid")

    recipe_sha256: str
    engine_versions: dict[str, str] = Field(default_factory=dict)
    hardware: str = ""
    run_id: str = ""
    run_url: str | None = Field(default=None, description="the Prefect UI page of the run, when it has one")
    vllm_version: str | None = Field(default=None, description="vLLM in the serving environment")


class ModelCardInputs(BaseModel):
    """Everything the card says, as data (no I/O), so it is easy to test and to re-render."""

    model_config = ConfigDict(extra="forbid")

    repo_id: str
    base_model: str
    base_revision_sha: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{40,64}$",
        description="Hub commit sha of the base model (a content hash for a local folder).",
    )
    method: str
    scheme: str
    group_size: int | None  # None: per output channel (the 8-bit schemes)
    source_checkpoint: str | None = None  # an existing checkpoint released as it is (not quantized here)
    checkpoint_format: str = "compressed-tensors"  # awq, gptq or compressed-tensors
    quantization_device: str | None = Field(
        default=None,
        description="where llm-compressor ran (cpu, cuda:0 NVIDIA H200, ...); None: not recorded",
    )
    calibration: dict[str, Any] = Field(default_factory=dict)
    calibration_fingerprint: str = ""
    status: Status = "candidate"
    rejection_reasons: list[str] = Field(default_factory=list)
    capacity_markdown: str = ""
    steps_markdown: str = Field(default="", description="what the run did and why (report/steps.py)")
    alerts_markdown: str = Field(
        default="", description="the Prometheus rules the release carries (release/alerts.py)"
    )
    regression_markdown: str = Field(
        default="",
        description="base, production and candidate side by side (the regression gate), or why it was off",
    )
    accuracy: list[AccuracyRow] = Field(default_factory=list)
    stress: dict[str, Any] = Field(default_factory=dict)
    serving_command: str = ""
    provenance: Provenance
    license: str | None = None

    @model_validator(mode="after")
    def _reasons(self) -> ModelCardInputs:
        if self.status == "rejected" and not self.rejection_reasons:
            raise ValueError("status 'rejected' needs rejection_reasons (what failed, with numbers)")
        return self


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        value = json.dumps(value, sort_keys=True)
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _dataset_cell(row: AccuracyRow) -> str:
    parts = [
        row.dataset,
        *(f"{k} {v}" for k, v in (("config", row.dataset_config), ("split", row.dataset_split)) if v),
    ]
    if row.dataset_revision:
        parts.append(f"revision {row.dataset_revision[:12]}")
    return ", ".join(parts)


def scrub_secrets(text: str) -> str:
    for pattern, replacement in SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def render_model_card(inputs: ModelCardInputs) -> ModelCard:
    """Render the card; ``ModelCard.load`` reads it back with the same eval results."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    i = inputs
    name = i.repo_id.split("/")[-1]
    # A local base model (a folder) is not valid `base_model` metadata on the Hub: name it in the
    # text only.
    on_hub = bool(REPO_ID.match(i.base_model)) and not looks_local(i.base_model)
    eval_results = [
        EvalResult(
            task_type="text-generation",
            task_name=row.task,
            dataset_type=row.dataset,
            dataset_name=row.dataset,
            dataset_config=row.dataset_config,
            dataset_split=row.dataset_split,
            dataset_revision=row.dataset_revision,
            metric_type=row.metric,
            metric_name=row.metric,
            metric_value=row.quantized,
        )
        for row in i.accuracy
    ]
    data = ModelCardData(
        base_model=i.base_model if on_hub else None,
        base_model_relation="quantized" if on_hub else None,
        model_name=name,
        eval_results=eval_results or None,
        library_name="vllm",  # the pipeline proves it on vLLM; the format is checkpoint_format
        pipeline_tag="text-generation",
        license=i.license,
        tags=[
            "quantized",
            i.checkpoint_format,
            "vllm",
            i.method.lower().replace(" ", "-"),
            i.scheme.lower(),
            f"quantize-serve-{i.status}",
        ],
    )
    rev = i.base_revision_sha or "main"
    granularity = f"group size {i.group_size}" if i.group_size else "per channel"
    base = (
        f"[{i.base_model}](https://huggingface.co/{i.base_model}/tree/{rev})"
        if on_hub
        else f"`{i.base_model}`"
    )
    pinned = f" at `{i.base_revision_sha}`" if i.base_revision_sha else ""
    engine = f"vLLM {i.provenance.vllm_version}" if i.provenance.vllm_version else "vLLM"
    parts = [
        f"# {name}",
        STATUS_LINE[i.status],
    ]
    if i.status == "rejected":
        parts.append("Reasons:\n\n" + "\n".join(f"- {r}" for r in i.rejection_reasons))
    parts += [
        f"{i.scheme} ({i.method.upper()}, {granularity}) quantization of "
        f"{base}{pinned}, "
        + (
            f"the existing checkpoint `{i.source_checkpoint}` (not quantized again), validated "
            if i.source_checkpoint
            else "made with llm-compressor and measured "
        )
        + f"on {engine} by quantize-serve."
        + (
            ""
            if on_hub
            else " The base is a local folder, not a Hub repo id, so the card's metadata "
            "names no `base_model` (and the Hub's model tree shows no link to it)."
        ),
        "## Quantization\n\n"
        + _table(
            ["setting", "value"],
            [
                ["method", i.method],
                ["scheme", i.scheme],
                ["group size", i.group_size or "per channel"],
                ["quantization device", i.quantization_device or "not recorded"],
                *[
                    [f"calibration {k}", f"`{v}`" if k == "revision" and SHA40.match(str(v)) else v]
                    for k, v in sorted(i.calibration.items())
                ],
                [
                    "calibration fingerprint",
                    f"`{i.calibration_fingerprint}`" if i.calibration_fingerprint else "-",
                ],
            ],
        ),
    ]
    if i.accuracy:
        parts.append(
            "## Accuracy (gate: paired recovery shown above the bad recovery)\n\n"
            + _table(
                [
                    "task",
                    "dataset",
                    "metric",
                    "base",
                    "quantized",
                    "recovery [95%]",
                    "bad recovery",
                    "documents",
                    "false pass",
                    "true pass",
                    "passed",
                ],
                [
                    [
                        r.task,
                        _dataset_cell(r),
                        r.metric,
                        r.base,
                        r.quantized,
                        format_recovery(r.recovery, r.recovery_interval),
                        r.threshold,
                        r.documents or "-",
                        _rate(r.false_pass),
                        _rate(r.true_pass),
                        "yes" if r.passed else "NO",
                    ]
                    for r in i.accuracy
                ],
            )
            + "\n\nTasks are lm-eval task names. Base and quantized are scored on the same documents with "
            "the same prompts; the interval is paired (per-document differences), perplexities on the log "
            "scale (nats, base / quantized). `false pass` / `true pass`: the chance this run's documents "
            "give to pass a candidate at the bad / good recovery the recipe states (docs/gates.md). "
            + EVAL_RESULTS_NOTE
        )
    if i.regression_markdown.strip():
        parts.append(
            "## Against production (base, production, candidate)\n\n" + i.regression_markdown.strip()
        )
    if i.capacity_markdown.strip():
        parts.append("## Memory and batch capacity\n\n" + i.capacity_markdown.strip())
    if i.stress:
        parts.append(
            "## Stress test\n\n" + _table(["measure", "value"], [[k, v] for k, v in sorted(i.stress.items())])
        )
    if i.steps_markdown.strip():
        parts.append("## How the run made it (each choice and why)\n\n" + i.steps_markdown.strip())
    if i.alerts_markdown.strip():
        parts.append(i.alerts_markdown.strip())
    if i.serving_command.strip():
        parts.append("## Serving\n\n```bash\n" + i.serving_command.strip() + "\n```")
    p = i.provenance
    parts.append(
        "## Provenance\n\n"
        + _table(
            ["item", "value"],
            [
                ["recipe sha256", f"`{p.recipe_sha256}`"],
                ["run id", p.run_id or "-"],
                ["run", f"[Prefect flow run]({p.run_url})" if p.run_url else "-"],
                ["hardware", p.hardware or "-"],
                ["vLLM version (serving)", p.vllm_version or "unknown"],
                *[[f"{k} version (quantization)", v] for k, v in sorted(p.engine_versions.items())],
            ],
        )
    )
    content = f"---\n{data.to_yaml()}\n---\n\n" + "\n\n".join(parts) + "\n"
    return ModelCard(scrub_secrets(content))


def calibration_summary(validated: ValidatedRecipe) -> dict:
    return describe(validated.recipe)


def card_inputs(
    validated: ValidatedRecipe,
    base: BaseModelRef,
    checkpoint: QuantizeResult,
    serving_command: str,
    *,
    status: str = "candidate",
    hardware: str | None = None,
    vllm_version: str | None = None,
    report: RunReport | None = None,
    rejection_reasons: list[str] | None = None,
) -> ModelCardInputs:
    """What the model card says. Without ``report``: the card pushed with the candidate, with no
    run id, timings or gate figures, so identical inputs give identical bytes (and no new commit).
    With ``report``: the card of the gated release, with its figures and, if rejected, why
    (``rejection_reasons``, else the gates' reasons: a reviewer's rejection has no failed gate).
    Tasks appear by lm-eval name and dataset id (:func:`eval_task_refs`), never by file path."""
    recipe = validated.recipe
    q = recipe.quantization
    gates: dict = {}
    if report is not None:
        refs = eval_task_refs(
            [c.task for c in report.accuracy], base_dir=Path(recipe.base_dir), report_dir=report.report_dir
        )
        # the decision's rows name a task by lm-eval's name already (report/provenance.py task_labels)
        reasons = (rejection_reasons or report.decision.reasons) if status == "rejected" else []
        gates = {
            "rejection_reasons": reasons,
            "capacity_markdown": (
                report.capacity.markdown() + f"\n\n![capacity]({CHART})" if report.capacity else ""
            ),
            "accuracy": [
                AccuracyRow(
                    **refs[c.task].model_dump(),
                    metric=c.metric,
                    base=c.base,
                    quantized=c.quantized,
                    recovery=c.recovery,
                    recovery_interval=c.recovery_interval,
                    threshold=c.threshold,
                    documents=c.docs_text,
                    false_pass=c.false_pass,
                    true_pass=c.true_pass,
                    passed=c.passed,
                )
                for c in report.accuracy
                if None not in (c.base, c.quantized, c.recovery)
            ],
            "stress": stress_summary(report.stress),
            "regression_markdown": report.regression.markdown() if report.regression else "",
            "steps_markdown": report.steps.markdown() if report.steps else "",
            "alerts_markdown": report.alerts or "",
        }
    return ModelCardInputs(
        repo_id=recipe.hub.repo_id if recipe.hub else recipe.name,
        base_model=base.repo_id or recipe.model.id,
        base_revision_sha=base.sha,
        method=checkpoint.method,
        scheme=checkpoint.scheme,
        group_size=(
            checkpoint_group_size(Path(checkpoint.checkpoint_dir))
            if checkpoint.source_checkpoint
            else q.group_size
            if checkpoint.scheme.startswith("W4")
            else None
        ),
        source_checkpoint=checkpoint.source_checkpoint,
        checkpoint_format=checkpoint.format,
        quantization_device=checkpoint.device,
        calibration={} if checkpoint.source_checkpoint else calibration_summary(validated),
        calibration_fingerprint=checkpoint.calibration_fingerprint,
        status="candidate" if status == "not-published" else status,
        serving_command=serving_command,
        provenance=Provenance(
            recipe_sha256=validated.recipe_sha256,
            engine_versions=checkpoint.engine_versions,
            hardware=hardware or describe_hardware(),
            run_id=report.run_id if report else "",
            run_url=public_url(report.run_url) if report else None,
            vllm_version=vllm_version,
        ),
        **gates,
    )


def report_card_inputs(
    validated: ValidatedRecipe,
    report: RunReport,
    *,
    status: str | None = None,
    rejection_reasons: list[str] | None = None,
) -> ModelCardInputs:
    """The card of a gated run, with its figures (see :func:`card_inputs`)."""
    return card_inputs(
        validated,
        report.base,
        report.checkpoint,
        report.serving_command,
        status=status or (report.release.status if report.release else "candidate"),
        hardware=report.hardware,
        vllm_version=report.vllm_version,
        report=report,
        rejection_reasons=rejection_reasons,
    )
