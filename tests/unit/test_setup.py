"""scripts/setup.sh in plan mode (QS_SETUP_DRY_RUN=1): which device, which torch, from where.

Nothing is installed: each test runs a copy of set-up (with the requirement files, pyproject.toml and the
Makefile) in a temporary folder, with a fake `nvidia-smi` first on PATH and, where a host's torch matters,
a fake host interpreter (this Python with a stand-in torch distribution on its path). A few seconds in all.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
H200 = "GPU 0: NVIDIA H200 (UUID: GPU-5a1f0c3e-0000-0000-0000-000000000000)"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of what set-up reads, so the checkout's own .venv and .venv-serve are never looked at."""
    root = tmp_path / "project"
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "setup.sh", root / "scripts" / "setup.sh")
    shutil.copytree(ROOT / "requirements", root / "requirements")
    shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")
    shutil.copy2(ROOT / "Makefile", root / "Makefile")
    return root


def fake_nvidia_smi(bin_dir: Path, listing: str | None) -> None:
    """An nvidia-smi whose `-L` prints `listing` (None: it fails, as with no driver loaded)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "nvidia-smi"
    body = (
        f"printf '%s\\n' '{listing}'" if listing is not None else "echo 'NVIDIA-SMI has failed' >&2; exit 9"
    )
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)


def fake_host_python(tmp_path: Path, torch_version: str | None, *, cuda_requires: bool = True) -> Path:
    """This Python, with only a stand-in `torch` distribution (metadata) on its path: the host's python3."""
    site = tmp_path / "host-site"
    site.mkdir(exist_ok=True)
    if torch_version:
        info = site / f"torch-{torch_version}.dist-info"
        info.mkdir()
        requires = "Requires-Dist: nvidia-cudnn-cu13==9.19.0.56\n" if cuda_requires else ""
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: torch\nVersion: {torch_version}\n{requires}"
        )
    python = tmp_path / "host-python3"
    # -S: none of this Python's own site-packages (its own torch, if any), only the stand-in
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    return python


def plan(
    project: Path,
    tmp_path: Path,
    *,
    gpu: str | None = None,
    python: Path | None = None,
    via_make: bool = False,
    **env: str,
) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, gpu)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("QS_", "PIP_", "VIRTUAL_ENV"))}
    if python is None:  # a host without torch: this test's Python may see one (a GPU host's, reused)
        (tmp_path / "bare-host").mkdir(exist_ok=True)
        python = fake_host_python(tmp_path / "bare-host", None)
    full_env = {
        **base,
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "PYTHON": str(python),
        "QS_SETUP_DRY_RUN": "1",
        **env,
    }
    if via_make:
        args = ["make", "-s", "-C", str(project), "setup", *(f"{k}={v}" for k, v in env.items())]
        full_env = {k: v for k, v in full_env.items() if k not in env}
    else:
        args = ["bash", str(project / "scripts" / "setup.sh")]
    return subprocess.run(args, env=full_env, capture_output=True, text=True, timeout=60)


def lines(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_a_gpu_listed_by_nvidia_smi_chooses_cuda_and_says_why(project, tmp_path):
    out = lines(plan(project, tmp_path, gpu=H200))
    assert out.splitlines()[0] == (
        "setup: device cuda (nvidia-smi -L: GPU 0: NVIDIA H200; QS_DEVICE=cpu|cuda overrides)"
    )
    assert "-r requirements/serving-cuda.txt -r requirements/torch-cuda.txt" in out
    assert "-r requirements/pipeline.txt -r requirements/torch-cuda.txt" in out
    assert "plan only" in out and not (project / ".venv").exists()


def test_no_gpu_chooses_cpu_with_todays_environments(project, tmp_path):
    out = lines(plan(project, tmp_path, gpu=None))
    assert out.splitlines()[0].startswith("setup: device cpu (nvidia-smi lists no GPU;")
    assert (
        "installing torch==2.13.0+cpu from the configured package sources, else "
        "https://download.pytorch.org/whl/cpu" in out
    )
    assert "-r requirements/serving-cpu.txt -r requirements/torch-cpu.txt" in out


@pytest.mark.parametrize("gpu, device, expected", [(H200, "cpu", "cpu"), (None, "cuda", "cuda")])
def test_qs_device_overrides_the_detection(project, tmp_path, gpu, device, expected):
    out = lines(plan(project, tmp_path, gpu=gpu, QS_DEVICE=device))
    assert (
        out.splitlines()[0] == f"setup: device {expected} (QS_DEVICE={device}; QS_DEVICE=cpu|cuda overrides)"
    )


def test_an_unknown_device_is_refused(project, tmp_path):
    result = plan(project, tmp_path, QS_DEVICE="tpu")
    assert result.returncode == 2 and "QS_DEVICE is cpu or cuda, not 'tpu'" in result.stderr


def test_the_hosts_cuda_torch_of_the_pinned_version_is_reused(project, tmp_path):
    host = fake_host_python(tmp_path, "2.11.0+cu130")
    out = lines(plan(project, tmp_path, gpu=H200, python=host))
    assert f"setup: reusing the host's torch 2.11.0+cu130 from {tmp_path / 'host-site'} ({host})" in out
    assert re.search(r"plan: \.venv: torch: the host's torch 2\.11\.0\+cu130 \(\.pth to .*host-site", out)
    assert re.search(r"plan: \.venv-serve: torch: the host's torch 2\.11\.0\+cu130", out)


@pytest.mark.parametrize(
    "version, cuda, says",
    [
        ("2.13.0+cpu", False, "torch 2.13.0+cpu (no CUDA)"),  # a CPU build
        ("2.12.0", True, "torch 2.12.0"),  # CUDA, but not the version vLLM pins
        (None, True, "no torch"),
    ],
)
def test_any_other_host_torch_is_not_reused(project, tmp_path, version, cuda, says):
    host = fake_host_python(tmp_path, version, cuda_requires=cuda)
    out = lines(plan(project, tmp_path, gpu=H200, python=host))
    assert (
        "setup: installing torch==2.11.0 (CUDA build) from the configured package sources (the host's "
        f"{host} has {says};" in out
    )
    assert "plan: .venv: torch: torch==2.11.0 from the configured package sources" in out


def test_the_wheelhouse_is_the_only_source(project, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    out = lines(plan(project, tmp_path, gpu=H200, QS_WHEELHOUSE=str(wheels)))
    assert f"setup: packages come from the wheelhouse {wheels} (no index)" in out
    assert f"torch==2.11.0 from the wheelhouse {wheels} (no index)" in out
    assert "configured package sources" not in out
    cpu = lines(plan(project, tmp_path, gpu=None, QS_WHEELHOUSE=str(wheels)))  # a CPU wheelhouse too
    assert f"setup: installing torch==2.13.0+cpu from the wheelhouse {wheels} (no index)\n" in cpu
    assert "download.pytorch.org" not in cpu and "configured package sources" not in cpu


def test_make_passes_its_command_line_variables_to_set_up(project, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    out = lines(plan(project, tmp_path, gpu=None, via_make=True, QS_WHEELHOUSE=str(wheels), QS_DEVICE="cuda"))
    assert out.splitlines()[0].startswith("setup: device cuda (QS_DEVICE=cuda;")
    assert f"from the wheelhouse {wheels} (no index)" in out


def test_a_missing_wheelhouse_is_refused(project, tmp_path):
    result = plan(project, tmp_path, QS_WHEELHOUSE=str(tmp_path / "nowhere"))
    assert result.returncode == 2 and "is not a folder" in result.stderr


def test_both_environments_install_at_once_and_a_failure_waits_for_the_other(project, tmp_path):
    """Not a plan: set-up makes both venvs, then installs the serving one in the background beside the
    pipeline one. From an empty wheelhouse both fail at torch; set-up exits 1 with the pipeline's reason, and
    only after the serving install has ended too (its log complete: nothing of set-up left running)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, None)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QS_", "PIP_", "VIRTUAL_ENV"))}
    env |= {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHON": sys.executable, "QS_WHEELHOUSE": str(wheels)}
    result = subprocess.run(
        ["bash", str(project / "scripts" / "setup.sh")], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "setup: installing .venv-serve beside .venv (its output: .venv-serve/setup.log)" in result.stdout
    reason = f"setup: torch==2.13.0+cpu is not in {wheels}"
    assert reason in result.stderr and reason in (project / ".venv-serve" / "setup.log").read_text()
    assert not (project / ".venv" / ".stamp").exists() and not (project / ".venv-serve" / ".stamp").exists()


def test_the_stamp_holds_the_device_so_switching_rebuilds(project, tmp_path):
    venv = project / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / ".device").write_text("cpu torch=install\n")
    cpu = lines(plan(project, tmp_path, gpu=None))
    (stamp,) = re.findall(r"plan: \.venv: update in place \(stamp (\w+)\)", cpu)
    (venv / ".stamp").write_text(stamp + "\n")
    assert "setup: .venv is up to date (cpu)" in lines(plan(project, tmp_path, gpu=None))
    cuda = lines(plan(project, tmp_path, gpu=H200))
    assert "plan: .venv: rebuild (it was set up for cpu torch=install;" in cuda
    (cuda_stamp,) = re.findall(r"plan: \.venv: rebuild .*stamp (\w+)\)", cuda)
    assert cuda_stamp != stamp


def test_an_environment_of_the_old_set_up_counts_as_cpu(project, tmp_path):
    """Checkouts set up before the device existed have a stamp and no .device: updated in place on CPU."""
    venv = project / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / ".stamp").write_text("0123456789abcdef\n")
    assert re.search(r"plan: \.venv: update in place", lines(plan(project, tmp_path, gpu=None)))
    assert "plan: .venv: rebuild (it was set up for cpu torch=install;" in lines(
        plan(project, tmp_path, gpu=H200)
    )


def test_check_pins_agrees_and_catches_a_second_vllm_version(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import check_pins
    finally:
        sys.path.pop(0)
    assert check_pins.problems(ROOT) == []
    assert check_pins.problems(ROOT, vllm_arg="0.27.0") == [
        "VLLM_VERSION=0.27.0 (build argument), requirements/serving-cuda.txt: vllm==0.26.0"
    ]
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "requirements", copy / "requirements")
    (copy / "Dockerfile").write_text(
        (ROOT / "Dockerfile").read_text().replace("ARG VLLM_VERSION=0.26.0", "ARG VLLM_VERSION=0.25.0")
    )
    (copy / "requirements" / "torch-cuda.txt").write_text("torch==2.12.0\n")
    assert check_pins.problems(copy) == [
        "requirements/torch-cuda.txt pins torch==2.12.0, vllm==0.26.0 pins torch==2.11.0",
        "Dockerfile: ARG VLLM_VERSION=0.25.0, requirements/serving-cuda.txt: vllm==0.26.0",
    ]


def test_the_test_runner_is_pinned_exactly_and_is_what_runs():
    """pytest and pytest-xdist move together (tests/conftest.py's lane scheduler stands in for --dist
    loadgroup, which pytest 9.2 broke): one exact pin each, the same in pyproject's test extra, and the
    pytest running this test is the pinned one."""
    import tomllib
    from importlib.metadata import version

    pins = {
        name: re.findall(rf"^{name}==(\S+)\s*$", (ROOT / "requirements" / "pipeline.txt").read_text(), re.M)
        for name in ("pytest", "pytest-xdist")
    }
    assert all(len(found) == 1 for found in pins.values()), pins
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert {f"{name}=={found[0]}" for name, found in pins.items()} <= set(extra), extra
    assert version("pytest") == pins["pytest"][0] and version("pytest-xdist") == pins["pytest-xdist"][0]
