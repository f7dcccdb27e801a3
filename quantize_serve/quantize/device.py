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
import math
import re
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel

from quantize_serve.core.model_files import GIB, language_model
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
# AWQ with the model on the device took 2.13 times the cache calibration_activation_bytes counts (the 8B
# on an H200 at 300,737 tokens: benchmarks/results/release-time/h200_quantize_peak.json), a little over that
# here
AWQ_UNCOUNTED = 2.2
# The calibrating process's own CUDA context, taken before it reads the free memory it places the model by
# (worker.placement): beside a base served at 0.49 of an H200 the flow counted 71.3 GiB left and the worker
# read 70.6 (benchmarks/results/release-time/h200_release_time.json, first_release's placement_note)
WORKER_CONTEXT_BYTES = 1 * GIB
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


def calibration_activation_bytes(config: dict, method: str, tokens: int) -> int:
    """The device memory calibration's activations take for ``tokens`` calibration tokens, the model there.

    Counted: llm-compressor's sequential pipeline keeps a layer's 16-bit inputs and outputs (2 x hidden a
    token), and AWQ the inputs of its smoothing parents (attention, o_proj and the MLP: hidden each;
    down_proj: the MLP's intermediate) and one parent's outputs (hidden): 2 x (6 x hidden + intermediate)
    bytes a token, 77,824 for Llama-3-8B. AWQModifier keeps its cache on the device for a dense model and on
    the CPU for a mixture of experts (its offload_device default).

    Measured on one H200, the 8B's AWQ at 300,737 tokens with the model on the device
    (benchmarks/quantize_speed.py --gpu --peak: benchmarks/results/release-time/h200_quantize_peak.json): a
    peak of
    61.49 GiB reserved and 61.19 GiB allocated, so fragmentation is not it. Beside 14.96 GiB of weights that
    is 46.5 GiB where the count gives 21.8: 2.13 times. The count is taken AWQ_UNCOUNTED times: a
    placement that errs high keeps the model on the CPU (slower), one that errs low runs out of memory, as
    the 8B's AWQ did beside a base that left it 61.0 GiB (h200_release_time.json at 98cc560,
    earlier_sessions.beside_base_lower). A calibration batch of 4 (the llama3 recipe's) peaked 1.8 GiB higher
    (63.3 GiB reserved, h200_quantize_speed.json): a batch's transient, inside CALIBRATION_HEADROOM_BYTES."""
    text = language_model(config)
    hidden = int(text.get("hidden_size") or 0)
    per_token = 2 * 2 * hidden
    if method == "awq" and not any(text.get(k) for k in ("num_experts", "num_local_experts")):
        per_token = int(AWQ_UNCOUNTED * 2 * (6 * hidden + int(text.get("intermediate_size") or 0)))
    return per_token * tokens


def calibration_need_bytes(weights_bytes: int, activation_bytes: int) -> int:
    """Device memory calibration needs with the model on the device: the weights, the activations
    (calibration_activation_bytes) and the headroom."""
    return weights_bytes + activation_bytes + CALIBRATION_HEADROOM_BYTES


def beside_base(
    recipe: Recipe,
    *,
    free_bytes: int | None,
    usable_bytes: int | None,
    need_bytes: int,
    base_fits: Callable[[float], bool] = lambda utilization: True,
) -> tuple[bool, str, float | None]:
    """(whether to quantize beside the base's accuracy run, the reason in words, the
    gpu_memory_utilization the base is then served at when not the recipe's). ``free_bytes``: the device's
    free memory before the base boots (None: a CPU host); ``usable_bytes``: what vLLM's utilization
    multiplies; ``need_bytes``: calibration's with the model on the device (calibration_need_bytes);
    ``base_fits(u)``: whether the base serves at utilization u (the planner). Onloaded calibration is not
    enough: beside a base served at 0.90 of an H200 (13.7 GiB left), the 8B's onloaded AWQ ran out of memory
    at its third layer (benchmarks/results/release-time/h200_release_time.json at 98cc560,
    earlier_sessions.beside_base_attempt).
    On a GPU host, where the recipe's utilization leaves too little, the base is served at the highest that
    leaves enough (two decimals) and its capacity row derived at the recipe's (capacity.at_utilization): the
    accuracy run needs the weights and some KV cache, not the recipe's whole budget. Measured on one H200
    (the 8B's first release, the base at 0.49): from the base's boot to both done 483 s, where one after the
    other took 594 s on fewer documents. On a CPU host the two share its cores: only with ``always``."""
    mode = recipe.calibration.beside_base
    if mode == "never":
        return False, "calibration.beside_base is never", None
    if free_bytes is None or usable_bytes is None:
        if mode == "always":
            return True, "calibration.beside_base is always (a CPU host: the two share its cores)", None
        why = "a CPU host: the two would share its cores (calibration.beside_base: always to do it)"
        return False, why, None
    util = recipe.serve.gpu_memory_utilization
    free_bytes -= WORKER_CONTEXT_BYTES  # what the calibrating process will find free beside the base
    left = free_bytes - math.ceil(util * usable_bytes)
    room = (
        f"{max(left, 0) / GIB:.1f} GiB free beside the base at serve.gpu_memory_utilization {util:.2f}, "
        f"calibration with the model on the device needs {need_bytes / GIB:.1f}"
    )
    if need_bytes <= left:
        return True, room, None
    lower = math.floor((free_bytes - need_bytes) / usable_bytes * 100) / 100
    if lower <= 0 or not base_fits(lower):
        return False, f"{room}, and the base does not serve in what calibration leaves: quantized first", None
    return (
        True,
        f"{room}: the base scored at {lower:.2f} ({(free_bytes - math.ceil(lower * usable_bytes)) / GIB:.1f} "
        f"GiB left), its capacity row derived at {util:.2f}",
        lower,
    )
