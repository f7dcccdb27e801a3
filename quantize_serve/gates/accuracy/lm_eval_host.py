"""lm-eval's host work in an accuracy run, done once where lm-eval repeats it; its results unchanged.

A look makes one ``simple_evaluate`` call a lane (lanes.py), and before its first request reaches
the server lm-eval builds every prompt on the host: the device waits meanwhile (the GIL runs one lane's
Python at a time). Two of its repeats, each undone when the run ends:

- :func:`templates_compiled_once`: ``lm_eval.utils.apply_template`` compiles the prompt's Jinja template
  on every render (``env.from_string``; lm-eval's open issue 1286). 25-shot arc_challenge renders ~17,000
  times a look. Here each template string is compiled once, by lm-eval's own environment (its filters,
  ``StrictUndefined``), and rendered as before: the same prompt strings.
- :func:`env_info_once`: every call ends with ``add_env_info``, torch's ``collect_env`` (a dozen
  subprocesses, ``nvidia-smi`` among them on a GPU host: 0.55 s a call on a 2-core CPU), and records
  the working folder's git commit with ``git describe``, whose stderr reaches the terminal: from a
  checkout without ``.git`` (a release tarball) each call printed ``fatal: not a git repository`` into
  the run's one-screen view. Here the first call's description and commit are kept for the run's other
  calls, the commit asked for quietly (lm-eval's own fallback, reading ``.git``, where git says no).

The production task set's four looks, one call a lane, on a 2-core CPU: 44.2 s of lm-eval's host work
stock, 4.0 s with both, every prompt the same (benchmarks/results/release-time/README.md,
``request_building.json``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def templates_compiled_once() -> Iterator[None]:
    """``lm_eval.utils.apply_template`` with each template string compiled once (module doc)."""
    from lm_eval import utils

    compiled = functools.lru_cache(maxsize=None)(utils.env.from_string)

    def apply_template(template: str, doc: dict) -> str:
        return compiled(template).render(**doc)

    with _replaced(utils, "apply_template", apply_template):
        yield


@contextlib.contextmanager
def env_info_once() -> Iterator[None]:
    """``simple_evaluate``'s environment description and git commit computed by the run's first call only,
    the commit without a word on the terminal (module doc)."""
    from lm_eval import evaluator

    original, described, lock = evaluator.add_env_info, {}, threading.Lock()

    def add_env_info(storage: dict[str, Any]) -> None:
        with lock:  # the lanes' calls end in their own threads
            if not described:
                original(described)
        storage.update(described)

    @functools.cache
    def get_git_commit_hash() -> str | None:
        try:
            done = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, check=True)
            return done.stdout.strip()
        except (subprocess.CalledProcessError, FileNotFoundError):
            from lm_eval.loggers.utils import get_commit_from_path

            return get_commit_from_path(os.getcwd())

    with (
        _replaced(evaluator, "add_env_info", add_env_info),
        _replaced(evaluator, "get_git_commit_hash", get_git_commit_hash),
    ):
        yield


@contextlib.contextmanager
def _replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` is ``value`` for the block, its own again afterwards."""
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextlib.contextmanager
def host_work_once() -> Iterator[None]:
    """Both, for one accuracy run."""
    with templates_compiled_once(), env_info_once():
        yield
