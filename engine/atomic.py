"""Crash-safe file updates: the one atomic writer of the engine (CONVENTIONS.md 7).

A reader sees either the old content or the new, never a torn file: write a temp file in the same
folder, fsync it, `os.replace` it over the target, then fsync the folder so the rename itself
survives a power loss (a process crash needs only the replace).
"""

import os
from pathlib import Path

__all__ = ["write_text_atomic", "write_bytes_atomic", "fsync_dir"]


def fsync_dir(path: Path) -> None:
    """Make the entries of folder `path` (files created, renamed or removed in it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))
