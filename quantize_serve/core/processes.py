"""Is a process (or its group) still running, which processes does it own, and how a child dies with
the pipeline.

A zombie (exited, not yet reaped by its parent) counts as gone everywhere here: it holds no
memory and answers nothing, which is what every caller asks about.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

PR_SET_PDEATHSIG = 1


def own_session_dying_with_parent(signum: int) -> Callable[[], None]:
    """A ``preexec_fn`` (it runs in the child between fork and exec): the child leads a session of its own
    (its own process group, which the caller stops as one) and, on Linux, gets ``signum`` when the thread
    that started it ends, so a pipeline process that dies hard takes the child with it. That thread must
    outlive the child: the caller waits for it, or stops it, in the same thread."""

    def preexec() -> None:
        os.setsid()
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signum)
        except OSError:
            pass

    return preexec


def process_alive(pid: int) -> bool:
    """True while the process runs (a zombie is not running)."""
    import psutil

    try:
        p = psutil.Process(pid)
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants; empty when it is gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def group_alive(pgid: int) -> bool:
    """True while any process of the group exists (one we may not signal still counts)."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
