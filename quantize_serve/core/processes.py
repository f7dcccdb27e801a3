"""Is a process (or its group) still running, and which processes does it own.

A zombie (exited, not yet reaped by its parent) counts as gone everywhere here: it holds no
memory and answers nothing, which is what every caller asks about.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil


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
