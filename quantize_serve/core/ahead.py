"""Work started ahead in this process, in one thread, and joined before anything depends on it.

The flow starts some work while it waits on something else: the calibration count's imports and data as
the base resolves (quantize/calibration.py count_ahead), lm-eval's imports and task index as a server boots
(tasks/accuracy.py prepare_accuracy). That work imports transformers, datasets and lm-eval, which are not
safe to import from two threads at once: transformers' lazy module resolves a name on first access, and two
first accesses race (``ImportError: cannot import name 'AutoTokenizer' from 'transformers'``, 4 runs of 4 of
``make demo`` on an H100 host, 2026-12-06). So all of it runs here, one piece at a time in one thread, and
code that imports those libraries in the flow's own threads calls :func:`settle` first: it waits for every
piece started so far. A piece's error stays in its future, for the code that takes its result.

Work ahead in another process (the quantization worker, a prepared vLLM boot, the boot compiling ahead)
shares no imports with this one; each is taken, or stopped, by the code that started it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ahead")
_STARTED: list[Future] = []
_LOCK = threading.Lock()


def start(work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Future[T]:
    """``work`` started now in the work-ahead thread, after any piece started before it."""
    with _LOCK:
        future = _POOL.submit(work, *args, **kwargs)
        _STARTED.append(future)
        return future


def settle(*, cancel: bool = False) -> None:
    """Wait for every piece of work started ahead so far (their errors stay in their futures). Called by code
    that imports what work ahead imports, before it does. ``cancel``: pieces not yet begun never begin (a
    run that ends waits only for the piece under way)."""
    if threading.current_thread().name.startswith("ahead"):
        return  # a piece of work ahead runs after those before it already
    with _LOCK:
        pending = [f for f in _STARTED if not f.done()]
        _STARTED[:] = pending
    if cancel:
        for future in pending:
            future.cancel()
    wait(pending)
