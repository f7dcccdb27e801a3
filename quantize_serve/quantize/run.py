"""Quantization stage: llm-compressor's oneshot (AWQ or GPTQ) in a child process.

The parent never imports torch for this: the child loads the model, calibrates, saves the
compressed-tensors checkpoint and exits, so on a GPU host every byte of device memory is returned
before vLLM boots. The parent streams the child's output into the logs, then writes a manifest
(file sizes and sha256, engine versions, calibration fingerprint, seconds).

The checkpoint folder is keyed by everything that determines it (base model identity, the
llm-compressor recipe, the calibration fingerprint, the engine versions), so a rerun with the same
inputs, for example after a late failure in the flow, reuses it instead of quantizing again.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections import deque
from pathlib import Path
from typing import Callable

import yaml
from filelock import FileLock
from pydantic import BaseModel

from quantize_serve.core.digest import file_sha256
from quantize_serve.core.errors import QuantizationError
from quantize_serve.core import progress
from quantize_serve.core.log_stream import BarFrame, stream_lines
from quantize_serve.core.processes import dying_with_parent
from quantize_serve.core.settings import PROJECT_ROOT, get_settings
from quantize_serve.recipe.model import Recipe
from quantize_serve.recipe.quantization import QuantizationSection

MANIFEST = "quantize_manifest.json"
RECIPE_FILE = "llmcompressor_recipe.yaml"
NOT_QUANTIZED = "n/a (not quantized again)"  # the device of an existing checkpoint used as it is
ENGINE_PACKAGES = ("llmcompressor", "compressed-tensors", "torch", "transformers", "datasets")


class QuantizeResult(BaseModel):
    checkpoint_dir: str
    method: str
    scheme: str
    seconds: float
    base_bytes: int
    quantized_bytes: int
    calibration_fingerprint: str
    engine_versions: dict[str, str]
    calibration_tokens: int | None = None  # None: a checkpoint made before they were recorded
    cached: bool = False
    source_checkpoint: str | None = None  # an existing checkpoint used as it is (existing_checkpoint.py)
    format: str = "compressed-tensors"  # config.json's quantization_config.quant_method
    # Where llm-compressor ran (the worker's torch device: ``cpu``, ``cuda:0 NVIDIA H200``), NOT_QUANTIZED
    # for an existing checkpoint; None: a checkpoint made before the device was recorded.
    device: str | None = None
    # Where the model and the calibration activations were (worker.placement), with the reason.
    placement: str | None = None
    # The device memory the worker's torch reserved (what another process on the device sees) and allocated
    # (what its tensors held) at their peaks (None: on a CPU, or not recorded).
    device_peak_bytes: int | None = None
    device_peak_allocated_bytes: int | None = None
    # The worker's wall seconds per stage: imports (torch, transformers, llm-compressor), prepare
    # (tokenizer, data, placement), load, calibrate
    # (llm-compressor's oneshot), save (compress and write), and its CPU seconds (all threads) per stage,
    # which a busy machine inflates less; empty for a checkpoint made before they were recorded.
    stage_seconds: dict[str, float] = {}
    stage_cpu_seconds: dict[str, float] = {}
    # The worker was started ahead of the stage (prepare_worker): its imports, stage_seconds["imports"],
    # were done before the stage began, and are not in ``seconds``.
    imports_ahead: bool = False


def build_llmcompressor_recipe(q: QuantizationSection) -> str:
    """The llm-compressor recipe (YAML) for the quantization section: what actually runs.

    The scheme is written out as a config group rather than a preset name so the saved recipe
    states every number (bits, symmetry, group size), including non-default group sizes.
    """
    if q.llmcompressor_recipe is not None:
        raw = q.llmcompressor_recipe
        if isinstance(raw, str) and Path(raw).is_file():
            return Path(raw).read_text()
        return raw if isinstance(raw, str) else yaml.safe_dump(raw, sort_keys=False)
    scheme = weight_scheme(q)
    if q.method == "gptq":
        modifiers = {"GPTQModifier": {**scheme, "dampening_frac": q.dampening_frac}}
    elif q.method == "smoothquant-gptq":  # INT8 W8A8: move activation outliers into the weights, then GPTQ
        modifiers = {
            "SmoothQuantModifier": {"smoothing_strength": q.smoothing_strength},
            "GPTQModifier": {**scheme, "dampening_frac": q.dampening_frac},
        }
    elif (
        q.method == "rtn"
    ):  # FP8_DYNAMIC: per-channel weights rounded, activations scaled per token at run time
        modifiers = {"QuantizationModifier": scheme}
    else:
        modifiers = {
            "AWQModifier": {"duo_scaling": q.duo_scaling, "n_grid": q.n_grid},
            "QuantizationModifier": scheme,
        }
    return yaml.safe_dump({"quant_stage": {"quant_modifiers": modifiers}}, sort_keys=False)


# llm-compressor's calibration pipeline (oneshot's pipeline and propagate_error) chosen by measurement on
# the reference model (benchmarks/quantize_speed.py): AWQ's two modifiers in one layer-by-layer pass
# instead of two, without the second forward per layer. Every other method, and a raw
# llmcompressor_recipe, keeps llm-compressor's defaults: GPTQ's error compensation needs the quantized
# layers' outputs (and saved only noise without them), SmoothQuant + GPTQ must not share a pass (GPTQ
# would take its Hessians before the smoothing), round-to-nearest needs no data.
MEASURED_PIPELINES = {"awq": {"pipeline": "sequential", "propagate_error": False}}
LLMCOMPRESSOR_PIPELINE = {"pipeline": "independent", "propagate_error": True}


def calibration_pipeline(recipe: Recipe) -> dict:
    """oneshot's pipeline arguments for the recipe: what its calibration section sets, else the measured
    choice for its method (MEASURED_PIPELINES), else llm-compressor's defaults."""
    c, q = recipe.calibration, recipe.quantization
    measured = MEASURED_PIPELINES.get(q.method or "", {}) if q.llmcompressor_recipe is None else {}
    chosen = {**LLMCOMPRESSOR_PIPELINE, **measured}
    return {
        "pipeline": c.pipeline or chosen["pipeline"],
        "propagate_error": chosen["propagate_error"] if c.propagate_error is None else c.propagate_error,
        "sequential_targets_per_subgraph": c.sequential_targets_per_subgraph,
    }


# compressed-tensors' presets, written out (compressed_tensors.quantization.quant_scheme): the
# 8-bit schemes quantize weights per output channel and activations per token at run time.
EIGHT_BIT = {
    "W8A8": {
        "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True, "dynamic": False},
        "input_activations": {
            "num_bits": 8,
            "type": "int",
            "strategy": "token",
            "symmetric": True,
            "dynamic": True,
        },
    },
    "FP8_DYNAMIC": {
        "weights": {
            "num_bits": 8,
            "type": "float",
            "strategy": "channel",
            "symmetric": True,
            "dynamic": False,
        },
        "input_activations": {
            "num_bits": 8,
            "type": "float",
            "strategy": "token",
            "symmetric": True,
            "dynamic": True,
        },
    },
}
# The checkpoint format llm-compressor saves each scheme in (config.json's quantization_config.format).
CHECKPOINT_FORMAT = {
    "W4A16": "pack-quantized",
    "W4A16_ASYM": "pack-quantized",
    "W8A8": "int-quantized",
    "FP8_DYNAMIC": "float-quantized",
}


def weight_scheme(q: QuantizationSection) -> dict:
    """The scheme of the quantization section as llm-compressor's modifiers take it (config
    groups, ignore, and the KV-cache scheme when scales are calibrated)."""
    if q.scheme in EIGHT_BIT:
        group = {"targets": list(q.targets), **EIGHT_BIT[q.scheme]}
    else:
        group = {
            "targets": list(q.targets),
            "weights": {
                "num_bits": 4,
                "type": "int",
                "strategy": "group",
                "group_size": q.group_size,
                "symmetric": q.scheme == "W4A16",
                "dynamic": False,
            },
        }
    scheme: dict = {"config_groups": {"group_0": group}, "ignore": list(q.ignore)}
    if q.kv_cache_scales:
        scheme["kv_cache_scheme"] = {
            "num_bits": 8,
            "type": "float",
            "strategy": "tensor",
            "dynamic": False,
            "symmetric": True,
        }
    return scheme


def checkpoint_key(recipe: Recipe, *, base_identity: str, calibration_fingerprint: str) -> str:
    """Everything that determines the checkpoint, hashed."""
    payload = {
        "base": base_identity,
        "llmcompressor_recipe": build_llmcompressor_recipe(recipe.quantization),
        "model": recipe.model.model_dump(mode="json", exclude={"id"}),
        # the data itself is the fingerprint's; its Hub revision adds nothing to the key, nor does where
        # calibration runs
        "calibration": recipe.calibration.model_dump(
            mode="json", exclude={"dataset", "files", "revision", "beside_base"}
        ),
        "calibration_fingerprint": calibration_fingerprint,
        "calibration_pipeline": calibration_pipeline(recipe),  # as resolved: a new default re-quantizes
        "engines": engine_versions(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:20]


def quantize_model(
    recipe: Recipe,
    base_model_dir: Path,
    *,
    base_identity: str,
    calibration_fingerprint: str,
    work_dir: Path | None = None,
    log: Callable[[str], None] = print,
) -> QuantizeResult:
    """Quantize the base model per the recipe, or reuse the checkpoint made from the same inputs.

    Two runs that need the same checkpoint at once (two GPUs, one work dir) make it once: the second
    waits on the key's lock file and then reuses what the first made."""
    work_dir = work_dir or get_settings().work_dir
    key = checkpoint_key(recipe, base_identity=base_identity, calibration_fingerprint=calibration_fingerprint)
    out = (
        work_dir / "checkpoints" / f"{recipe.quantization.method}-{key}"
    )  # recipes that differ elsewhere share it
    locks = work_dir / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with FileLock(locks / f"{out.name}.lock"):
        if (out / MANIFEST).is_file() and verify_manifest(out):
            discard_prepared_worker()  # nothing to quantize
            log(f"reusing checkpoint {out} (same base, recipe, calibration data and engines)")
            manifest = json.loads((out / MANIFEST).read_text())
            result = manifest["result"]  # older manifests keep the device beside the result only
            return QuantizeResult.model_validate(
                {**result, "device": result.get("device") or manifest.get("device"), "cached": True}
            )
        return _quantize_once(
            out,
            work_dir,
            recipe,
            base_model_dir,
            base_identity=base_identity,
            calibration_fingerprint=calibration_fingerprint,
            log=log,
        )


def _quantize_once(
    out: Path,
    work_dir: Path,
    recipe: Recipe,
    base_model_dir: Path,
    *,
    base_identity: str,
    calibration_fingerprint: str,
    log: Callable[[str], None],
) -> QuantizeResult:
    partial = out.with_name(out.name + ".partial")
    try:
        return _quantize_into(
            partial,
            out,
            recipe,
            base_model_dir,
            base_identity=base_identity,
            calibration_fingerprint=calibration_fingerprint,
            log=log,
        )
    except BaseException as exc:
        shutil.rmtree(partial, ignore_errors=True)  # never leave half a checkpoint on the disk
        if not disk_full(exc):
            raise
        failure = exc
    raise QuantizationError(  # outside the except block: the message says it all
        f"the disk is full: no space left on the device under {work_dir} (QS_WORK_DIR) while writing "
        f"the quantized checkpoint ({_free_space(work_dir)} free there; the base model's weights take "
        f"{weights_bytes_on_disk(base_model_dir) / 1e6:.1f} MB and the checkpoint needs up to as much). "
        "The half-written checkpoint was removed, so nothing partial can be reused. Fix: free space "
        "there, or set QS_WORK_DIR to a folder on a disk with room, and re-run.\n"
        f"--- what failed ---\n{_last_lines(str(failure), 4)}"
    )


def _quantize_into(
    partial: Path,
    out: Path,
    recipe: Recipe,
    base_model_dir: Path,
    *,
    base_identity: str,
    calibration_fingerprint: str,
    log: Callable[[str], None],
) -> QuantizeResult:
    """Quantize into ``partial``, write the manifest, then rename it to ``out`` (complete or absent)."""
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    spec = {
        "recipe": recipe.model_dump(mode="json"),
        "base_model_dir": str(base_model_dir),
        "output_dir": str(partial),
        "llmcompressor_recipe": build_llmcompressor_recipe(recipe.quantization),
    }
    spec_path = partial / "quantize_spec.json"
    spec_path.write_text(json.dumps(spec, indent=2))

    started = time.monotonic()
    worker_report = _run_child(spec_path, log=log)
    seconds = round(time.monotonic() - started, 2)
    spec_path.unlink()
    if worker_report["calibration_fingerprint"] != calibration_fingerprint:
        raise QuantizationError(
            "the calibration data changed while quantizing (fingerprint "
            f"{worker_report['calibration_fingerprint'][:12]} != {calibration_fingerprint[:12]}); rerun"
        )

    result = QuantizeResult(
        checkpoint_dir=str(out),
        method=recipe.quantization.method,
        scheme=recipe.quantization.scheme,
        seconds=seconds,
        base_bytes=weights_bytes_on_disk(base_model_dir),
        quantized_bytes=weights_bytes_on_disk(partial),
        calibration_fingerprint=calibration_fingerprint,
        engine_versions=worker_report["engine_versions"],
        calibration_tokens=worker_report.get("calibration_tokens"),
        device=worker_report.get("device"),
        placement=worker_report.get("placement"),
        device_peak_bytes=worker_report.get("device_peak_bytes"),
        device_peak_allocated_bytes=worker_report.get("device_peak_allocated_bytes"),
        stage_seconds=worker_report.get("stage_seconds", {}),
        stage_cpu_seconds=worker_report.get("stage_cpu_seconds", {}),
        imports_ahead=worker_report.get("imports_ahead", False),
    )
    write_manifest(
        partial,
        result,
        extra={
            "base_identity": base_identity,
            "calibration_pipeline": calibration_pipeline(recipe),
            "device": worker_report.get("device"),
            "workarounds": worker_report.get("workarounds", []),
        },
    )
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)  # the folder appears complete or not at all
    return result


# Progress bars in the child: tqdm redraws at most every 5 s (its own setting; AWQ's grid search
# still redraws on every step through set_postfix), the Hub client's download bars are off, and
# stream_lines collapses what is left to a line per bar (see quantize_serve/core/log_stream.py).
CHILD_ENV = {"PYTHONUNBUFFERED": "1", "TQDM_MININTERVAL": "5", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


# The worker started ahead of the stage (prepare_worker): `python -m quantize_serve.quantize.worker` with no
# argument does its imports (torch, transformers, llm-compressor: 4-5 s on a 2-core CPU), prints
# PREPARED_MARK and waits for the spec's path on stdin, touching no device. The stage hands it the path
# (_run_child) instead of starting a process; discard_prepared_worker stops one not used (it also exits when
# its stdin closes).
PREPARED_MARK = (
    "[quantize] worker started ahead of the stage: torch, transformers and llm-compressor imported"
)
_prepared: list[subprocess.Popen] = []


def _start_worker(*args: str, stdin: int) -> subprocess.Popen:
    # a pipeline killed hard takes the worker with it (and the device memory it holds); SIGKILL: it starts
    # no process of its own
    worker = [get_settings().pipeline_python, "-m", "quantize_serve.quantize.worker", *args]
    return subprocess.Popen(
        dying_with_parent(worker, signal.SIGKILL),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **CHILD_ENV},
        cwd=str(PROJECT_ROOT),
        start_new_session=True,
    )


def prepare_worker() -> None:
    """Start the quantization worker now, up to its imports, while the flow resolves (or downloads) the
    base; the next quantization takes it. Off with QS_PREPARE_BOOTS=false, as the boots' are."""
    settings = get_settings()
    if settings.prepare_boots and not _prepared and Path(settings.pipeline_python).exists():
        _prepared.append(_start_worker(stdin=subprocess.PIPE))


def discard_prepared_worker() -> None:
    """Stop the worker started ahead when no quantization took it (it holds nothing but imports)."""
    while _prepared:
        _stop(_prepared.pop())


def _stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        with contextlib.suppress(OSError):
            pipe.close()


def _take_prepared(spec_path: Path) -> subprocess.Popen | None:
    """The worker started ahead, given ``spec_path``; None when there is none, or it has ended (its imports
    failed: a new worker says why)."""
    proc = _prepared.pop() if _prepared else None
    try:
        if proc is not None and proc.poll() is None:
            proc.stdin.write(f"{spec_path}\n".encode())
            proc.stdin.close()
            return proc
    except OSError:  # it ended since
        pass
    if proc is not None:
        _stop(proc)
    return None


def _run_child(spec_path: Path, *, log: Callable[[str], None]) -> dict:
    tail: deque[str] = deque(maxlen=60)

    def emit(line: str) -> None:
        tail.append(line)
        log(line)

    proc = _take_prepared(spec_path) or _start_worker(str(spec_path), stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        stream_lines(proc.stdout, emit, on_frame=count_layers)
        code = proc.wait()
    except BaseException:
        _stop(proc)
        raise
    if code != 0:
        raise QuantizationError(
            f"llm-compressor exited with code {code}.\n--- last lines of its output ---\n" + "\n".join(tail)
        )
    report_path = spec_path.with_name("worker_report.json")
    report = json.loads(report_path.read_text())
    report_path.unlink()
    return report


# The flow's stage that quantizes (flows/pipeline.py), which the live count of layers is for
STAGE = "quantize"
# llm-compressor's sequential pipeline calibrates one subgraph (about a layer) at a time:
# "(3/5): Calibrating".
_SUBGRAPH = re.compile(r"^\((\d+)/(\d+)\)")


def count_layers(frame: BarFrame) -> None:
    """A live count of the subgraphs calibrated, from the child's progress bars (for the quantize stage,
    whatever stage started after it: the base's accuracy runs beside it)."""
    m, counts = _SUBGRAPH.match(frame.desc), frame.counts()
    if m and counts:
        done, total = counts
        step = int(m[1]) - 1 + (done / total if total else 0.0)
        progress.count("layers", step, int(m[2]), stage=STAGE)


DISK_FULL = re.compile(r"No space left on device|\[Errno 28\]|os error 28|Disk quota exceeded")


def disk_full(exc: BaseException) -> bool:
    """Did ``exc`` (ours, with the child's output, or an OSError here) come from a full disk?"""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(exc, (OSError, QuantizationError)) and bool(DISK_FULL.search(str(exc)))


def _free_space(folder: Path) -> str:
    for path in (folder, *folder.parents):
        if path.exists():
            return f"{shutil.disk_usage(path).free / 1e6:.1f} MB"
    return "unknown"


def _last_lines(text: str, n: int) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def weights_bytes_on_disk(model_dir: Path) -> int:
    return sum(f.stat().st_size for f in Path(model_dir).glob("*.safetensors"))


def write_manifest(folder: Path, result: QuantizeResult, *, extra: dict) -> None:
    files = {
        f.name: {"bytes": f.stat().st_size, "sha256": file_sha256(f)}
        for f in sorted(folder.iterdir())
        if f.is_file() and f.name != MANIFEST
    }
    manifest = {"result": result.model_dump(exclude={"cached"}), "files": files, **extra}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2))


def verify_manifest(folder: Path) -> bool:
    """A cached checkpoint is reused only if every file is still what the manifest says."""
    manifest = json.loads((folder / MANIFEST).read_text())
    for name, meta in manifest["files"].items():
        f = folder / name
        if not f.is_file() or f.stat().st_size != meta["bytes"] or file_sha256(f) != meta["sha256"]:
            return False
    return True


def engine_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ENGINE_PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out
