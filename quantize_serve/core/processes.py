"""Is a process (or its group) still running, which processes does it own, and how a child dies with
the pipeline.

A zombie (exited, not yet reaped by its parent) counts as gone everywhere here: it holds no
memory and answers nothing, which is what every caller asks about.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

# The child's first program: it asks the kernel for SIGNUM when the thread that started it ends (Linux's
# PR_SET_PDEATHSIG, kept across exec), stops if that parent is gone already, then becomes ARGV (same pid).
_LAUNCHER = """\
import ctypes, os, sys
signum, parent, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signum)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != parent:
    sys.exit(1)
os.execvp(argv[0], argv)
"""


def dying_with_parent(argv: Sequence[str | os.PathLike], signum: int) -> list[str]:
    """``argv`` as a child that gets ``signum`` when the thread that starts it ends, so a pipeline process
    that dies hard takes the child with it (that thread must outlive the child: the caller waits for it, or
    stops it, in the same thread). Start it with ``start_new_session=True`` (a process group of its own,
    which the caller stops as one).

    The request is made in the child after exec, not in a ``preexec_fn``: a preexec_fn makes Python run the
    interpreter's at-fork hooks in the child between fork and exec, where another thread's locks are held
    for good. huggingface_hub's hook closes its HTTP session: a child forked while another thread of the
    flow used the Hub hung there, and its parent with it, waiting for the exec (a CLI run, 2026-12-07)."""
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(int(signum)), str(os.getpid()), *map(str, argv)]


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
