"""Quantize where the model can be quantized: on a host with an NVIDIA GPU, a pipeline environment
whose torch has no CUDA stops the run at validation (`validate`, `run`, the flow's validate stage),
with the reason and the fix, instead of quantizing on the CPU for hours. The GPU and the torch build
are given, not read (this machine has neither a GPU nor a CUDA torch)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from quantize_serve.cli import main
from quantize_serve.core.errors import RecipeError
from quantize_serve.quantize import device
from quantize_serve.quantize.device import TorchBuild, parse_build, torch_build
from quantize_serve.recipe.load import load_recipe
from quantize_serve.serving import gpu
from quantize_serve.validate.preflight import check_quantize_host
from tests.conftest import ROOT

RECIPE = ROOT / "recipes" / "tiny-llama-awq.yaml"
CPU_TORCH_VERSION_PY = (
    "__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'rocm', 'xpu']\n"
    "__version__ = '2.13.0+cpu'\ndebug = False\ncuda: Optional[str] = None\n"
)
CUDA_TORCH_VERSION_PY = "__version__ = '2.11.0+cu130'\ndebug = False\ncuda: Optional[str] = '13.0'\n"


@pytest.mark.parametrize(
    "version, version_py, cuda",
    [
        ("2.13.0+cpu", CPU_TORCH_VERSION_PY, None),
        ("2.11.0+cu130", CUDA_TORCH_VERSION_PY, "13.0"),
        ("2.13.0+cpu", None, None),  # no version.py: the local label decides
        ("2.9.0+cu128", None, "12.8"),
        ("2.9.0+rocm6.4", None, None),
        ("2.9.0", None, "unknown (no local version label)"),  # PyPI's Linux default is a CUDA build
    ],
)
def test_the_torch_build_is_read_without_importing_torch(version, version_py, cuda):
    assert parse_build("py", version, version_py).cuda == cuda


def torch_build_by_import(python: Path):
    """What the interpreter's torch says of itself when imported (the slow way torch_build avoids)."""
    done = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m, torch; print(m.version('torch')); print(torch.version.cuda)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    version, cuda = done.stdout.split()[-2:]
    return torch_build(python).model_copy(
        update={"version": version, "cuda": None if cuda == "None" else cuda}
    )


def test_this_pipeline_environment_and_another_interpreter_are_read(tmp_path):
    here = torch_build(Path(sys.executable))  # in-process: importlib.metadata and torch/version.py
    assert here == torch_build_by_import(Path(sys.executable))
    code = (
        "import sys; from quantize_serve.quantize.device import torch_build; torch_build(); "
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr[-2000:]  # read, not imported
    serve_python = ROOT / ".venv-serve" / "bin" / "python"
    if serve_python.is_file():  # another interpreter reads its own with the standard library alone
        other = torch_build(serve_python)
        assert other.python == str(serve_python) and other == torch_build_by_import(serve_python)
    missing = tmp_path / "python"
    missing.write_text("#!/bin/sh\nexit 1\n")
    missing.chmod(0o755)
    assert torch_build(missing).version is None


@pytest.fixture
def gpu_host_with_cpu_torch(monkeypatch):
    """A host with an H200 whose pipeline environment holds torch 2.13.0+cpu."""
    monkeypatch.setattr(gpu, "describe_devices", lambda: "1 x NVIDIA H200")
    monkeypatch.setattr(gpu, "usable_memory_bytes", lambda index=0: 150_109_880_320)
    build = TorchBuild(python="/opt/pipeline/bin/python", version="2.13.0+cpu", cuda=None)
    monkeypatch.setattr(device, "torch_build", lambda python=None: build)
    return build


def test_a_gpu_host_with_cpu_torch_stops_at_validation(gpu_host_with_cpu_torch):
    with pytest.raises(RecipeError) as info:
        check_quantize_host(load_recipe(RECIPE), source="r.yaml")
    message = str(info.value)
    assert "NVIDIA GPU (1 x NVIDIA H200)" in message and "torch 2.13.0+cpu, a build without CUDA" in message
    assert "would quantize on the CPU" in message
    assert "run `make setup` on this host" in message and "QS_DEVICE=cuda make setup" in message


def test_cli_validate_and_run_stop_with_the_reason_and_the_fix(gpu_host_with_cpu_torch, capsys):
    assert main(["validate", str(RECIPE)]) == 2
    err = capsys.readouterr().err
    assert "build without CUDA" in err and "make setup" in err
    assert main(["run", str(RECIPE)]) == 2  # before Prefect is imported
    assert "build without CUDA" in capsys.readouterr().err


def test_the_flow_validate_stage_checks_it_too(gpu_host_with_cpu_torch):
    from tasks.validate import validate_recipe

    with pytest.raises(RecipeError, match="build without CUDA"):
        validate_recipe.fn(str(RECIPE))


def test_a_cuda_torch_no_gpu_or_nothing_to_quantize_passes(gpu_host_with_cpu_torch, monkeypatch):
    existing = load_recipe(
        RECIPE,
        {"quantization.method": None, "quantization.checkpoint": "../tests/fixtures/tiny-llama-autoawq"},
    )
    check_quantize_host(existing, source="r.yaml")  # an existing checkpoint: nothing is quantized here
    monkeypatch.setattr(
        device, "torch_build", lambda python=None: TorchBuild(python="p", version="2.11.0+cu130", cuda="13.0")
    )
    check_quantize_host(load_recipe(RECIPE), source="r.yaml")
    monkeypatch.setattr(
        device, "torch_build", lambda python=None: TorchBuild(python="p", version=None, cuda=None)
    )
    with pytest.raises(RecipeError, match="has no torch"):
        check_quantize_host(load_recipe(RECIPE), source="r.yaml")
    monkeypatch.setattr(gpu, "describe_devices", lambda: None)  # a CPU host: the CPU is where it quantizes
    check_quantize_host(load_recipe(RECIPE), source="r.yaml")


def test_the_worker_names_the_device_it_quantized_on():
    from types import SimpleNamespace

    from quantize_serve.quantize.worker import describe_device

    def fake_torch(kind):
        accelerator = SimpleNamespace(
            is_available=lambda: kind is not None,
            current_accelerator=lambda: SimpleNamespace(type=kind),
            current_device_index=lambda: 0,
        )
        return SimpleNamespace(
            accelerator=accelerator, cuda=SimpleNamespace(get_device_name=lambda i: "NVIDIA H200")
        )

    assert describe_device(fake_torch(None)) == "cpu"
    assert describe_device(fake_torch("cuda")) == "cuda:0 NVIDIA H200"
    assert describe_device(fake_torch("xpu")) == "xpu:0"


def test_a_model_that_fits_the_gpu_is_quantized_there_whole_and_a_larger_one_layer_by_layer():
    from quantize_serve.quantize.worker import GIB, placement

    # Llama-3-8B (16.1 GB) with 256 x 1,104 calibration tokens on a free H200: AWQ's counted cache is 77,824
    # bytes a token, taken 2.2 times (its measured peak on the H200 was 2.13 times)
    config = json.loads((ROOT / "benchmarks/configs/llama-3-8b.json").read_text())
    activations = device.calibration_activation_bytes(config, "awq", 256 * 1_104)
    weights, h200_free = 16_060_522_496, 140 * GIB
    assert activations == 171_212 * 256 * 1_104
    on_device, why = placement(h200_free, weights, activations)
    assert on_device and why.startswith(
        "model and calibration activations on the device: needs 68.0 GiB (weights 15.0, activations 45.1"
    ), why
    # GPTQ keeps only the sequential pipeline's cache of a layer's inputs and outputs
    assert device.calibration_activation_bytes(config, "gptq", 256 * 1_104) == 2 * 2 * 4_096 * 256 * 1_104
    # a 70B (141 GB in bf16) does not fit: llm-compressor's default, one layer at a time
    on_device, why = placement(h200_free, 141 * 10**9, activations)
    assert not on_device and "onloaded one layer at a time" in why and "140.0 GiB free" in why, why
    assert placement(None, weights, activations) == (
        False,
        "no accelerator: the model and its activations on the CPU",
    )


def test_quantization_goes_beside_the_base_where_the_device_memory_left_holds_it():
    from quantize_serve.core.model_files import GIB
    from quantize_serve.quantize.run import checkpoint_key

    recipe = load_recipe(ROOT / "recipes/llama3-8b-instruct-awq.yaml")
    at = {"auto": recipe}
    for mode in ("always", "never"):
        at[mode] = recipe.model_copy(
            update={"calibration": recipe.calibration.model_copy(update={"beside_base": mode})}
        )
    # Llama-3-8B (16.1 GB) with at most 256 x 2,048 calibration tokens, AWQ with the model on the device:
    # 106.6 GiB. An empty H200 (139.8 GiB, 1 of it the calibrating process's own context): its base served
    # at the recipe's 0.90 leaves 13.0 GiB (where onloaded AWQ ran out of memory), so the base is scored at
    # 0.23 and leaves 106.6 (auto as always: beside was measured faster on an H200)
    h200 = 150_109_880_320
    config = json.loads((ROOT / "benchmarks/configs/llama-3-8b.json").read_text())
    need = device.calibration_need_bytes(
        16_060_522_496, device.calibration_activation_bytes(config, "awq", 256 * 2_048)
    )
    for mode in ("auto", "always"):
        now, why, served_at = device.beside_base(
            at[mode], free_bytes=h200, usable_bytes=h200, need_bytes=need
        )
        assert now and served_at == 0.23, (served_at, why)
        assert why == (
            "13.0 GiB free beside the base at serve.gpu_memory_utilization 0.90, calibration with the model "
            "on the device needs 106.6: the base scored at 0.23 (106.6 GiB left), its capacity row derived "
            "at 0.90"
        ), why
    # sized by the tokens calibration runs on (the flow counts them where the bound does not fit): the H200's
    # 300,737 need 70.9 GiB, the base is scored at 0.48 and leaves 71.7 (the worker read 70.6 beside a base
    # at 0.49, where the flow counted 71.3 without its context); AWQ's measured peak was 61.5
    counted = device.calibration_need_bytes(
        16_060_522_496, device.calibration_activation_bytes(config, "awq", 300_737)
    )
    assert device.beside_base(at["auto"], free_bytes=h200, usable_bytes=h200, need_bytes=counted)[2] == 0.48
    # a base that does not serve in what calibration leaves: quantized first
    now, why, served_at = device.beside_base(
        at["always"], free_bytes=h200, usable_bytes=h200, need_bytes=need, base_fits=lambda u: u >= 0.5
    )
    assert not now and served_at is None and why.endswith("quantized first"), why
    assert not device.beside_base(at["auto"], free_bytes=need, usable_bytes=h200, need_bytes=need)[0]
    # half a GiB over the need is less than the calibrating process's own context takes: quantized first
    half_over = need + GIB // 2
    assert not device.beside_base(at["auto"], free_bytes=half_over, usable_bytes=10 * GIB, need_bytes=need)[0]
    # the recipe's utilization leaves enough (a smaller model, a larger GPU): served as the recipe says
    assert device.beside_base(at["auto"], free_bytes=h200, usable_bytes=h200, need_bytes=10 * GIB)[::2] == (
        True,
        None,
    )
    assert not device.beside_base(at["never"], free_bytes=h200, usable_bytes=h200, need_bytes=need)[0]
    # a CPU host: only when asked (the two share its cores)
    assert not device.beside_base(at["auto"], free_bytes=None, usable_bytes=None, need_bytes=need)[0]
    assert device.beside_base(at["always"], free_bytes=None, usable_bytes=None, need_bytes=need)[::2] == (
        True,
        None,
    )
    # where calibration runs does not change what it computes: the same checkpoint key
    keys = {checkpoint_key(r, base_identity="b", calibration_fingerprint="f") for r in at.values()}
    assert len(keys) == 1


def test_the_flow_counts_calibrations_tokens_only_where_the_count_can_decide(monkeypatch):
    """tasks/quantize.py beside_base on an empty H200 with the llama3 recipe: the recipe's bound (256 x
    512 tokens) does not fit beside the base at 0.90. With always, the tokens calibration runs on are
    counted (a few seconds with the base's tokenizer) and the base is scored at 0.68; auto does the same.
    With never, nothing is counted."""
    from types import SimpleNamespace

    from prefect.logging import disable_run_logger

    import tasks.quantize as task

    h200 = 150_109_880_320
    counted = []
    monkeypatch.setattr(task.gpu, "memory_info", lambda *a: {"free_bytes": h200})
    monkeypatch.setattr(task.gpu, "usable_memory_bytes", lambda *a: h200)
    monkeypatch.setattr(task.quantize, "weights_bytes_on_disk", lambda folder: 16_060_522_496)
    monkeypatch.setattr(task, "calibration_tokens", lambda recipe, folder: counted.append(folder) or 127_236)
    recipe = load_recipe(ROOT / "recipes/llama3-8b-instruct-awq.yaml")
    base = SimpleNamespace(config=json.loads((ROOT / "benchmarks/configs/llama-3-8b.json").read_text()))
    base.local_dir = "base"
    never = recipe.model_copy(
        update={"calibration": recipe.calibration.model_copy(update={"beside_base": "never"})}
    )
    with disable_run_logger():
        now, why, served_at = task.beside_base(SimpleNamespace(recipe=recipe), base).model_dump().values()
        assert (now, served_at, len(counted)) == (True, 0.68, 1), why
        assert why.endswith(
            "the base scored at 0.68 (43.7 GiB left), its capacity row derived at 0.90 "
            "(127,236 calibration tokens)"
        ), why
        now, why, served_at = task.beside_base(SimpleNamespace(recipe=never), base).model_dump().values()
    assert (now, served_at, len(counted)) == (False, None, 1), why
    assert why == "calibration.beside_base is never", why


def test_the_count_is_prepared_as_the_run_starts_only_where_it_can_run(monkeypatch):
    """worker_ahead starts calibration.count_ahead (the count's imports and dataset) beside the quantization
    worker on a GPU host whose recipe may quantize beside its base; not without a GPU (the count never runs
    there), with beside_base never, or with a checkpoint to use."""
    from types import SimpleNamespace

    import tasks.quantize as task

    started = []
    monkeypatch.setattr(task.quantize, "prepare_worker", lambda: None)
    monkeypatch.setattr(task.quantize, "discard_prepared_worker", lambda: None)
    monkeypatch.setattr(task, "count_ahead", lambda recipe: started.append(recipe.name))
    recipe = load_recipe(ROOT / "recipes/llama3-8b-instruct-awq.yaml")
    never = recipe.model_copy(
        update={"calibration": recipe.calibration.model_copy(update={"beside_base": "never"})}
    )
    reused = recipe.model_copy(
        update={"quantization": recipe.quantization.model_copy(update={"checkpoint": "org/checkpoint"})}
    )
    for device_info, r in [(None, recipe), ({"free_bytes": 1}, never), ({"free_bytes": 1}, reused)]:
        monkeypatch.setattr(task.gpu, "memory_info", lambda *a, info=device_info: info)
        with task.worker_ahead(SimpleNamespace(recipe=r)):
            pass
    assert started == []
    with task.worker_ahead(SimpleNamespace(recipe=recipe)):
        assert started == [recipe.name]
