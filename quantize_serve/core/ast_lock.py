"""One thread at a time builds a Python AST, on the interpreters whose AST constructor races.

CPython 3.11.0-3.11.7 and 3.12.0-3.12.1 keep the AST constructor's recursion depth in state shared by every
thread (gh-106905, fixed in 3.11.8 and 3.12.2). On 3.11 a garbage collection inside ``ast.parse`` lets
another thread run; if that thread parses too, the first one fails with ``SystemError: AST constructor
recursion depth mismatch``. The pipeline parses from two threads: the work-ahead thread (core/ahead.py)
imports torch, whose import parses its overloads' source about 90 times, while the flow's thread imports
Prefect's server, whose key-value store parses each of its modules (beartype's import hook). The test
suite's CI saw it: the Prefect server's import failed and 30 tests with it (Python 3.11.7).

:func:`install` wraps the builtin ``compile`` so that a call asking for an AST (``ast.parse`` and every
``compile(..., PyCF_ONLY_AST)``) holds one process-wide lock; every other call passes straight through. The
wait is bounded, so a garbage collector's finalizer that blocks on the waiting thread can delay a parse but
never deadlock it. Installed by the package's import, on affected interpreters only.
"""

from __future__ import annotations

import builtins
import sys
import threading
from _ast import PyCF_ONLY_AST

# Longest a thread waits for another's parse before parsing anyway (a parse takes milliseconds).
WAIT_S = 30.0

_LOCK = threading.RLock()
_COMPILE = builtins.compile


def affected(version: tuple[int, int, int] = sys.version_info[:3]) -> bool:
    """Whether this interpreter's AST constructor shares its recursion depth between threads."""
    return (3, 11, 0) <= version < (3, 11, 8) or (3, 12, 0) <= version < (3, 12, 2)


def _compile(source, filename, mode, flags=0, dont_inherit=False, optimize=-1, **kwargs):  # type: ignore[no-untyped-def]
    if not flags & PyCF_ONLY_AST:
        return _COMPILE(source, filename, mode, flags, dont_inherit, optimize, **kwargs)
    held = _LOCK.acquire(timeout=WAIT_S)
    try:
        return _COMPILE(source, filename, mode, flags, dont_inherit, optimize, **kwargs)
    finally:
        if held:
            _LOCK.release()


def install() -> bool:
    """Serialize AST construction in this process where the interpreter needs it; True when installed."""
    if not affected():
        return False
    builtins.compile = _compile
    return True
