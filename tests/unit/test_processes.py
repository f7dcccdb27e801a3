"""A child started with dying_with_parent goes when the process that started it is killed hard."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from quantize_serve.core.processes import dying_with_parent, process_alive

PARENT = """\
import signal, subprocess, sys, time
from quantize_serve.core.processes import dying_with_parent
child = subprocess.Popen(
    dying_with_parent([sys.executable, "-c", "import time; time.sleep(120)"], signal.SIGKILL),
    start_new_session=True,
)
print(child.pid, flush=True)
time.sleep(120)
"""


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not process_alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_a_child_dies_with_the_process_that_started_it():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        assert os.getsid(child) == child  # a session, so a process group, of its own
        assert psutil.Process(child).ppid() == parent.pid and not gone_within(child, 0.5)
        parent.send_signal(signal.SIGKILL)  # no cleanup runs in it: only the kernel can end the child
        parent.wait()
        assert gone_within(child, 10), "the child outlived its parent (it sleeps 120 s)"
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
        if not gone_within(child, 0):
            psutil.Process(child).kill()


def test_a_child_starts_while_a_lock_of_the_hub_client_is_held():
    """huggingface_hub closes its HTTP session in every forked child (os.register_at_fork). Run from a
    preexec_fn, that hook ran between fork and exec and waited for a lock another thread of the flow held at
    the fork (a Hub request in flight): the child hung there, and its parent waiting for the exec (a CLI
    run's prepared boot, 2026-12-07). Started by dying_with_parent, nothing runs in the child before exec."""
    import threading

    from huggingface_hub.utils._http import get_session

    started: list[subprocess.Popen] = []

    def start() -> None:
        argv = dying_with_parent([sys.executable, "-c", "pass"], signal.SIGTERM)
        started.append(subprocess.Popen(argv, start_new_session=True))

    lock = get_session()._transport._pool._optional_thread_lock  # what a request in flight holds
    with lock:
        starter = threading.Thread(target=start, daemon=True)
        starter.start()
        starter.join(timeout=30)
    assert started, "the child did not start within 30 s"
    assert started[0].wait(timeout=30) == 0
