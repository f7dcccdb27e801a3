"""Where the quantization stage runs: the pipeline environment's torch against this host.

The quantization worker quantizes on the device torch offers (``torch.accelerator``). On a host
with an NVIDIA GPU whose pipeline environment holds a torch built without CUDA (``torch==X+cpu``,
what set-up installs on a CPU host), that is the CPU: an 8B model would quantize there for hours
without a word. ``quantize_device_gap`` says so before anything runs.

The build is read without importing torch (seconds and gigabytes of libraries, in a check meant
to answer at once): the installed distribution's version (``+cpu`` on the CPU builds) and its
``torch/version.py``, whose ``cuda`` is what ``torch.version.cuda`` answers (None without CUDA).
When the pipeline environment is another interpreter (``QS_PIPELINE_PYTHON``), that interpreter
reads the same two things with the standard library alone.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel

from quantize_serve.core.model_files import GIB
from quantize_serve.core.settings import get_settings
from quantize_serve.recipe.model import Recipe
from quantize_serve.serving import gpu

# Run by another interpreter: its torch's version and the text of torch/version.py (stdlib only).
READ_TORCH = """
import importlib.metadata as m, json
try:
    d = m.distribution("torch")
except m.PackageNotFoundError:
    print(json.dumps([None, None]))
else:
    f = d.locate_file("torch/version.py")
    print(json.dumps([d.version, f.read_text() if f.is_file() else None]))
"""
# What calibration needs on the device beyond the weights and the activation cache: the layer being
# calibrated with its observers, Hessians (GPTQ) or smoothing grid (AWQ), and CUDA's own context.
CALIBRATION_HEADROOM_BYTES = 8 * GIB
CUDA_LINE = re.compile(r"^cuda\s*(?::[^=\n]*)?=\s*(.+?)\s*$", re.MULTILINE)


class TorchBuild(BaseModel):
    """The torch of the pipeline environment: ``version`` None when it has none; ``cuda`` the CUDA
    version it was built with, None for a build without CUDA."""

    python: str
    version: str | None
    cuda: str | None


def parse_build(python: str, version: str | None, version_py: str | None) -> TorchBuild:
    """The build from the distribution's version and torch/version.py's text (None: not found, then
    the version's local label decides: ``+cpu``, ``+rocm...``, ``+xpu`` have no CUDA; ``+cuXYZ`` and
    no label, the Linux default on PyPI, have it)."""
    cuda: str | None = None
    found = CUDA_LINE.search(version_py or "")
    if found:
        try:
            cuda = ast.literal_eval(found.group(1))
        except (ValueError, SyntaxError):
            cuda = found.group(1)
    elif version is not None:
        local = version.partition("+")[2]
        cuda = (
            f"{local[2:-1]}.{local[-1]}"
            if re.fullmatch(r"cu\d{3,}", local)
            else None
            if local
            else "unknown (no local version label)"
        )
    return TorchBuild(python=python, version=version, cuda=str(cuda) if cuda else None)


def torch_build(python: Path | None = None) -> TorchBuild:
    """The torch of the environment that quantizes (``settings.pipeline_python`` by default)."""
    python = Path(python or get_settings().pipeline_python)
    if python.resolve() == Path(sys.executable).resolve():
        try:
            dist = metadata.distribution("torch")
        except metadata.PackageNotFoundError:
            return parse_build(str(python), None, None)
        path = Path(str(dist.locate_file("torch/version.py")))
        return parse_build(str(python), dist.version, path.read_text() if path.is_file() else None)
    done = subprocess.run([str(python), "-c", READ_TORCH], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return parse_build(str(python), None, None)
    version, version_py = json.loads(done.stdout.strip().splitlines()[-1])
    return parse_build(str(python), version, version_py)


def quantize_device_gap() -> str | None:
    """Why this host would quantize on its CPU although it has an NVIDIA GPU (the pipeline
    environment's torch has no CUDA, or no torch at all), or None."""
    gpus = gpu.describe_devices()
    if gpus is None:
        return None
    build = torch_build()
    if build.version is not None and build.cuda:
        return None
    has = f"torch {build.version}, a build without CUDA" if build.version else "no torch"
    return (
        f"this host has an NVIDIA GPU ({gpus}), but the pipeline environment ({build.python}) has {has}: "
        "llm-compressor would quantize on the CPU (hours for an 8B model) instead of the GPU"
    )


def calibration_need_bytes(weights_bytes: int, activation_bytes: int) -> int:
    """Device memory calibration needs with the model on the device: the weights, the activations (their
    cache holds a layer's inputs and outputs) and the headroom."""
    return weights_bytes + 2 * activation_bytes + CALIBRATION_HEADROOM_BYTES


def beside_base(recipe: Recipe, *, free_bytes: int | None, need_bytes: int) -> tuple[bool, str]:
    """(whether to quantize beside the base's accuracy run, the reason in words). ``free_bytes``: the device
    memory the base's boot will leave (None: a CPU host); ``need_bytes``: calibration's with the model on
    the device (calibration_need_bytes). Onloaded calibration is not enough: beside a base served at 0.90
    of an H200 (13.7 GiB left), the 8B's onloaded AWQ ran out of memory at its third layer
    (benchmarks/results/h200_release_time.json, beside_base_attempt)."""
    mode = recipe.calibration.beside_base
    if mode == "never":
        return False, "calibration.beside_base is never"
    if free_bytes is None:
        if mode == "always":
            return True, "calibration.beside_base is always (a CPU host: the two share its cores)"
        return False, "a CPU host: the two would share its cores (calibration.beside_base: always to do it)"
    room = (
        f"{max(free_bytes, 0) / GIB:.1f} GiB free beside the base at serve.gpu_memory_utilization "
        f"{recipe.serve.gpu_memory_utilization:.2f}, calibration with the model on the device needs "
        f"{need_bytes / GIB:.1f}"
    )
    if need_bytes > free_bytes:
        return False, f"{room}: quantized first"
    return True, room
