"""What is committed or published names things by path relative to the repository (or to a
benchmark's scratch folder), never by the absolute path of the machine it ran on, and carries no
throwaway server port."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quantize_serve.core.settings import PROJECT_ROOT


def portable_path(path: str) -> str:
    """A local path as reports show it: relative to the project, else the folder's name alone
    (a report or card never carries the absolute path of the machine it ran on)."""
    p = Path(path).resolve()
    return p.relative_to(PROJECT_ROOT).as_posix() if p.is_relative_to(PROJECT_ROOT) else p.name


ABSOLUTE_PATH = re.compile(r"(?<![\w.:/-])/[^\s\"'`,;()\[\]{}]+")
LOOPBACK_PORT = re.compile(r"\b(127\.0\.0\.1|localhost):\d+")


def portable_text(text: str, *, roots: Sequence[Path] = ()) -> str:
    """Text as committed or published: an absolute path under the project, or under one of
    ``roots`` (a benchmark's scratch folder), becomes relative to it; a loopback port (a
    throwaway server's) becomes ``PORT``. Other absolute strings (``/v1/completions``) stay."""
    bases = [Path(r) for r in (PROJECT_ROOT, *roots)]
    bases += [b.resolve() for b in bases]

    def relative(match: re.Match) -> str:
        p = Path(match.group(0))
        for base in bases:
            if p == base:
                return "."
            if p.is_relative_to(base):
                return p.relative_to(base).as_posix()
        return match.group(0)

    return LOOPBACK_PORT.sub(r"\1:PORT", ABSOLUTE_PATH.sub(relative, text))


def portable_data(value: Any, *, roots: Sequence[Path] = ()) -> Any:
    """``portable_text`` applied to every string in a JSON-like value (numbers untouched)."""
    if isinstance(value, str):
        return portable_text(value, roots=roots)
    if isinstance(value, dict):
        return {k: portable_data(v, roots=roots) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [portable_data(v, roots=roots) for v in value]
    return value
