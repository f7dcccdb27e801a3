"""The release blocked by a Hub step that failed for good (quantize_serve/release/blocked.py): its words,
the first failure winning, and the run's live boots stopped from another thread (the whole flow:
tests/flows/test_hub_fail_fast.py)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from quantize_serve.core.errors import HubAuthError, HubError, ServerBootError
from quantize_serve.recipe.model import HubSection
from quantize_serve.release.blocked import Blocked
from quantize_serve.serving import server

TOKEN = "hf_BlockedUnitToken0123456789abcdef"
HUB = HubSection(repo_id="org/tiny-w4a16")


def sleeper() -> subprocess.Popen:
    """A process group of its own, as a vLLM boot's."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)


def test_the_first_failure_blocks_with_the_step_the_hub_the_repo_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    blocked = Blocked(tmp_path, HUB)
    blocked.check()  # nothing failed: nothing raised
    refused = HubAuthError(
        f"push the candidate on org/tiny-w4a16@main failed: token {TOKEN} refused. Fix it."
    )
    assert blocked.fail("push-candidate", refused)
    assert not blocked.fail("find-production-release", HubError("later"))  # the first counts
    with pytest.raises(HubAuthError) as raised:  # its class kept: the CLI exits 2 for a token to fix
        blocked.check()
    message = str(raised.value)
    assert message.startswith("push-candidate failed for good (the Hub at ")
    assert "repo org/tiny-w4a16" in message and "promoted nothing" in message and "Fix:" in message
    assert TOKEN not in message and "later" not in message


def test_what_a_stopped_boot_raises_becomes_the_hub_failure(tmp_path):
    blocked = Blocked(tmp_path, HUB)
    with pytest.raises(ServerBootError), blocked.stops():  # not blocked: the boot's own error
        raise ServerBootError("vLLM exited")
    blocked.fail("find-production-release", RuntimeError("boom"))
    with pytest.raises(HubError, match="^find-production-release failed for good"), blocked.stops():
        raise ServerBootError("vLLM exited with code -15 before it became healthy")


def test_a_block_stops_the_live_boots_of_its_run_only(tmp_path):
    ours, theirs = sleeper(), sleeper()
    server._boot_started(ours, tmp_path / "run" / "vllm-base.log")
    server._boot_started(theirs, tmp_path / "other-run" / "vllm-base.log")
    try:
        failing = threading.Thread(
            target=Blocked(tmp_path / "run", HUB).fail, args=("push-candidate", OSError())
        )
        failing.start()
        failing.join(10)
        assert ours.wait(10) == -15  # SIGTERM, from another thread than the boot's
        assert theirs.poll() is None
    finally:
        for proc in (ours, theirs):
            server._boot_stopping(proc)
            server.stop_process_group(proc, 5)


def test_a_boot_that_starts_after_the_block_is_stopped_as_it_starts(tmp_path):
    """The boot's thread was on its way when the Hub step failed for good (seen under load: the base's boot
    registered after the block, then waited for a health that never came): it is stopped as it starts."""
    Blocked(tmp_path / "run", HUB).fail("find-production-release", OSError())
    late, elsewhere = sleeper(), sleeper()
    try:
        server._boot_started(late, tmp_path / "run" / "vllm-base.log")
        server._boot_started(elsewhere, tmp_path / "other-run" / "vllm-base.log")
        assert late.wait(10) == -15
        assert elsewhere.poll() is None
    finally:
        for proc in (late, elsewhere):
            server._boot_stopping(proc)
            server.stop_process_group(proc, 5)
