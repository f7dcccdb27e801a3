"""Fault-matrix rows that need no engine (disk full during a download, ...): the matrix and its
rules are described in tests/engines/test_faults.py."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from quantize_serve.core.errors import (
    HubError,
)
from tests.conftest import ROOT, local_hub_server

MODEL = ROOT / "models" / "tiny-llama"


TOKEN = "hf_FaultMatrixWriteToken0123456789abcdef"


@pytest.fixture(autouse=True)
def no_child_left() -> Iterator[None]:
    """Every process this test started (directly or below) is gone after it.

    Processes that existed before the test (the session's Prefect API, a module's shared boot) are
    not the test's; a shared boot is checked by the test that ends it.
    """
    me = psutil.Process()
    before = {(p.pid, p.create_time()) for p in me.children(recursive=True)}
    yield
    deadline = time.monotonic() + 30
    while True:
        new = []
        for p in me.children(recursive=True):
            try:
                if (p.pid, p.create_time()) not in before and p.status() != psutil.STATUS_ZOMBIE:
                    new.append(f"{p.pid} {' '.join(p.cmdline())[:160]}")
            except psutil.Error:
                continue
        if not new or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not new, f"processes started by the test are still running: {new}"


@contextmanager
def small_disk(tmp_path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (disk-full faults); skipped where mounting is not permitted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a disk that fills up) needs root")
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here ({done.stderr.strip()}): no disk-full fault")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.timeout(120)
def test_disk_full_during_base_download_is_a_hub_error_without_token(tmp_path, monkeypatch, capfd, caplog):
    from huggingface_hub import constants as hf_constants

    from quantize_serve.hub.client import RetryPolicy
    from quantize_serve.hub.download import resolve_base_model
    from quantize_serve.hub.publish import push_candidate
    from quantize_serve.recipe.model import HubSection

    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)  # the session is offline; this is loopback
    with local_hub_server(tmp_path, tokens=(TOKEN,)) as hub:
        repo = HubSection(repo_id="org/tiny-base", private=True, release_ref="production")
        push_candidate(repo, MODEL, commit_message="base model", token=TOKEN, endpoint=hub.endpoint)
        with small_disk(tmp_path, "512k") as disk:  # the weights are 2.1 MB
            with pytest.raises(HubError) as info:
                resolve_base_model(
                    repo.repo_id,
                    revision=None,
                    token=TOKEN,
                    cache_dir=disk,
                    endpoint=hub.endpoint,
                    retry=RetryPolicy(attempts=3, base_s=0.01),
                )
    err, message = info.value, str(info.value)
    assert "the disk is full" in message and str(disk) in message, message
    assert "2.2 MB" in message and "HF_HUB_CACHE" in message and "Fix:" in message, message
    assert err.__context__ is None and err.__cause__ is None  # no OSError traceback under it
    out, errout = capfd.readouterr()
    for text in (message, repr(err), out, errout, caplog.text):
        assert TOKEN not in text
