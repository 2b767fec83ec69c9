"""Crash-safe file and folder updates: the one atomic writer of the engine (CONVENTIONS.md 7).

A reader sees either the old content or the new, never a torn file: write a temp file in the same
folder, fsync it, `os.replace` it over the target, then fsync the folder so the rename itself
survives a power loss (a process crash needs only the replace). Folders (a checkpoint, a prepared
split, an HF export) are built complete beside their target and published with `replace_dir`;
`check_replaceable` first refuses a target whose replacement would delete something else.
"""

import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

from engine.errors import ConfigError

__all__ = ["write_text_atomic", "write_bytes_atomic", "fsync_dir", "sibling_dir", "replace_dir", "check_replaceable",
           "check_writable_dir"]


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


def sibling_dir(target: Path, tag: str) -> Path:
    """A hidden name beside `target` no other process uses: where a folder is built ("tmp") or set aside ("old")."""
    return target.parent / f".{target.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}"


def replace_dir(tmp: Path, target: Path) -> None:
    """Move the complete folder `tmp` (its files written and fsynced) to `target` on the same file system,
    replacing a folder already there.

    os.replace cannot replace a non-empty folder, so the old one is moved aside under a hidden name first and
    removed only after the swap: between the two renames `target` is briefly absent, never half written."""
    fsync_dir(tmp)
    if target.exists():
        old = sibling_dir(target, "old")
        os.replace(target, old)
        os.replace(tmp, target)
        shutil.rmtree(old)
    else:
        os.replace(tmp, target)
    fsync_dir(target.parent)


def check_replaceable(target: Path, flag: str, ours: Callable[[Path], bool], what: str) -> None:
    """Refuse an output folder whose replacement would delete something that is not `what`.

    `target` may be new, an empty folder, or a folder `ours` recognises as an earlier `what` (a noun: "HF export");
    a file, or a folder holding anything else (a save dir, a run dir, a home folder), is a ConfigError that
    names `flag` and the first entries that would be lost."""
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise ConfigError(flag, str(target), "choose a folder path", "is a file")
    if not target.is_dir() or ours(target):
        return
    entries = sorted(p.name for p in target.iterdir())
    if entries:
        shown = ", ".join(entries[:4]) + (f" and {len(entries) - 4} more" if len(entries) > 4 else "")
        raise ConfigError(flag, str(target), f"choose a new or empty folder (or the folder of an earlier {what})",
                          f"holds files that are not an earlier {what} ({shown}); replacing it would delete them")


def check_writable_dir(path: Path, flag: str) -> None:
    """Refuse an output folder that cannot be created or written (a file in the way, no permission) before any
    work, not at the first save an hour into a run. Creates nothing."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        where = "" if probe == path else f" ({probe} is a file)"
        raise ConfigError(flag, str(path), "choose a folder path", f"is not a folder{where}")
    if not os.access(probe, os.W_OK | os.X_OK):
        where = "" if probe == path else f" ({probe} is not writable)"
        raise ConfigError(flag, str(path), "choose a folder you can write to", f"cannot be written{where}")
