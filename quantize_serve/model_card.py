"""The model card: what a consumer of the quantized repo needs to trust and serve it.

Rendered from plain data (``ModelCardInputs``) into a ``huggingface_hub.ModelCard``. The YAML
header uses ``ModelCardData`` with ``eval_results``, so the Hub renders the ``model-index``
metadata as an evaluation table; the quantized model's scores go there (the base scores and the
recovery ratios sit in the body's table, next to the thresholds the gate applied).
The card is pushed in the same commit as the checkpoint and updated when the gates decide.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from quantize_serve.recipe import REPO_ID, looks_local

if TYPE_CHECKING:
    from huggingface_hub import ModelCard

Status = Literal["candidate", "promoted", "rejected"]
STATUS_LINE = {
    "candidate": "**Status: candidate: gates pending.** Do not use this revision in production yet.",
    "promoted": "**Status: promoted.** This revision passed the accuracy and stress gates.",
    "rejected": "**Status: rejected.** This revision failed its gates and was not promoted.",
}
# Anything that looks like a credential is masked before the card is written (defence in depth:
# inputs should never hold one, but a serving command may be pasted with --api-key in it).
SECRET_PATTERNS = (
    (re.compile(r"\bhf_[A-Za-z0-9]{16,}"), "hf_<redacted>"),
    (re.compile(r"(?i)(--api-key[= ]|--hf-token[= ]|bearer\s+|(?:HF_TOKEN|HUGGING_FACE_HUB_TOKEN)=)\S+"),
     r"\1<redacted>"),
)


class AccuracyRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: str
    metric: str
    base: float
    quantized: float
    recovery: float
    threshold: float
    passed: bool


class Provenance(BaseModel):
    model_config = ConfigDict(extra="forbid")

    recipe_sha256: str
    engine_versions: dict[str, str] = Field(default_factory=dict)
    hardware: str = ""
    run_id: str = ""


class ModelCardInputs(BaseModel):
    """Everything the card says, as data (no I/O), so it is easy to test and to re-render."""

    model_config = ConfigDict(extra="forbid")

    repo_id: str
    base_model: str
    base_revision_sha: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{40,64}$",
        description="Hub commit sha of the base model (a content hash for a local folder).")
    method: str
    scheme: str
    group_size: int
    calibration: dict[str, Any] = Field(default_factory=dict)
    calibration_fingerprint: str = ""
    status: Status = "candidate"
    rejection_reasons: list[str] = Field(default_factory=list)
    capacity_markdown: str = ""
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


def scrub_secrets(text: str) -> str:
    for pattern, replacement in SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def render_model_card(inputs: ModelCardInputs) -> ModelCard:
    """Render the card; ``ModelCard.load`` reads it back with the same eval results."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData  # noqa: F811 - runtime import

    i = inputs
    name = i.repo_id.split("/")[-1]
    # A local base model (a folder) is not valid `base_model` metadata on the Hub: name it in the
    # text only.
    on_hub = bool(REPO_ID.match(i.base_model)) and not looks_local(i.base_model)
    eval_results = [
        EvalResult(task_type="text-generation", task_name=row.task, dataset_type=row.task,
                   dataset_name=row.task, metric_type=row.metric, metric_name=row.metric,
                   metric_value=row.quantized)
        for row in i.accuracy
    ]
    data = ModelCardData(
        base_model=i.base_model if on_hub else None,
        base_model_relation="quantized" if on_hub else None,
        model_name=name,
        eval_results=eval_results or None,
        library_name="vllm",  # the pipeline proves it on vLLM; the format is compressed-tensors
        pipeline_tag="text-generation",
        license=i.license,
        tags=["quantized", "compressed-tensors", "vllm", i.method.lower(), i.scheme.lower(),
              f"quantize-serve-{i.status}"],
    )
    rev = i.base_revision_sha or "main"
    base = (f"[{i.base_model}](https://huggingface.co/{i.base_model}/tree/{rev})" if on_hub
            else f"`{i.base_model}`")
    pinned = f" at `{i.base_revision_sha}`" if i.base_revision_sha else ""
    parts = [
        f"# {name}",
        STATUS_LINE[i.status],
    ]
    if i.status == "rejected":
        parts.append("Reasons:\n\n" + "\n".join(f"- {r}" for r in i.rejection_reasons))
    parts += [
        f"{i.scheme} ({i.method.upper()}, group size {i.group_size}) quantization of "
        f"{base}{pinned}, made with llm-compressor "
        "and measured on vLLM by quantize-serve.",
        "## Quantization\n\n" + _table(["setting", "value"], [
            ["method", i.method], ["scheme", i.scheme], ["group size", i.group_size],
            *[[f"calibration {k}", v] for k, v in sorted(i.calibration.items())],
            ["calibration fingerprint",
             f"`{i.calibration_fingerprint}`" if i.calibration_fingerprint else "-"],
        ]),
    ]
    if i.accuracy:
        parts.append("## Accuracy (gate: quantized / base >= threshold)\n\n" + _table(
            ["task", "metric", "base", "quantized", "recovery", "threshold", "passed"],
            [[r.task, r.metric, r.base, r.quantized, r.recovery, r.threshold, "yes" if r.passed else "NO"]
             for r in i.accuracy]))
    if i.capacity_markdown.strip():
        parts.append("## Memory and batch capacity\n\n" + i.capacity_markdown.strip())
    if i.stress:
        parts.append("## Stress test\n\n" + _table(["measure", "value"],
                                                   [[k, v] for k, v in sorted(i.stress.items())]))
    if i.serving_command.strip():
        parts.append("## Serving\n\n```bash\n" + i.serving_command.strip() + "\n```")
    p = i.provenance
    parts.append("## Provenance\n\n" + _table(["item", "value"], [
        ["recipe sha256", f"`{p.recipe_sha256}`"], ["run id", p.run_id or "-"],
        ["hardware", p.hardware or "-"],
        *[[f"{k} version", v] for k, v in sorted(p.engine_versions.items())],
    ]))
    content = f"---\n{data.to_yaml()}\n---\n\n" + "\n\n".join(parts) + "\n"
    return ModelCard(scrub_secrets(content))
