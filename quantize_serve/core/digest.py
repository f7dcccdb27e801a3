"""sha256 of files and folders, streamed (checkpoints are gigabytes; nothing is read whole)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from pathlib import Path

CHUNK = 1 << 20


def update_from_file(path: Path, *hashes: "hashlib._Hash") -> None:
    """Feed a file's bytes, a chunk at a time, to every hash given (one read for several hashes)."""
    with Path(path).open("rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            for h in hashes:
                h.update(chunk)


def file_sha256(path: Path) -> str:
    """Hex sha256 of one file."""
    h = hashlib.sha256()
    update_from_file(path, h)
    return h.hexdigest()


def folder_sha256(folder: Path, *, include: Callable[[Path], bool] = lambda p: True) -> str:
    """sha256 over the files directly in ``folder`` that ``include`` keeps, in name order: each
    file's name, then its bytes. Renaming a file changes the digest as well as editing it."""
    h = hashlib.sha256()
    for f in _files(folder, include):
        h.update(f.name.encode())
        update_from_file(f, h)
    return h.hexdigest()


def _files(folder: Path, include: Callable[[Path], bool]) -> Iterable[Path]:
    return sorted((p for p in Path(folder).iterdir() if p.is_file() and include(p)), key=lambda p: p.name)
