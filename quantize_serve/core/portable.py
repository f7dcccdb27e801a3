"""What a report or card shows names things by path relative to the repository, never by the absolute path
of the machine it ran on (the benchmarks' committed results: benchmarks/evidence.py portable_text)."""

from __future__ import annotations

from pathlib import Path

from quantize_serve.core.settings import PROJECT_ROOT


def portable_path(path: str) -> str:
    """A local path as reports show it: relative to the project, else the folder's name alone
    (a report or card never carries the absolute path of the machine it ran on)."""
    p = Path(path).resolve()
    return p.relative_to(PROJECT_ROOT).as_posix() if p.is_relative_to(PROJECT_ROOT) else p.name
