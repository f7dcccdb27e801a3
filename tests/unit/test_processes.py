"""A child started with own_session_dying_with_parent goes when the process that started it is killed hard."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from quantize_serve.core.processes import process_alive

PARENT = """\
import signal, subprocess, sys, time
from quantize_serve.core.processes import own_session_dying_with_parent
child = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(120)"],
    preexec_fn=own_session_dying_with_parent(signal.SIGKILL),
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
