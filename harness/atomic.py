"""One atomic file writer for the harness: readers see the old content or the new, never a mix.

The data goes to a temp file beside the target (same filesystem, so the rename is atomic), is
fsynced, renamed over the target with os.replace, and the folder is fsynced so the rename itself
survives a power cut. A failure at any point removes the temp file and leaves the target as it was.

`mode` is the new file's permission bits before the umask (0o600 by default: run records and
scripts are private); `keep_mode=True` keeps an existing target's bits instead (the agent's file
tools: an executable script stays executable). The engine has its own writer (it never imports
the harness).
"""

import os
import secrets
from pathlib import Path

__all__ = ["write_atomic", "fsync_dir"]


def fsync_dir(directory: str | Path) -> None:
    """Make a rename or a new entry in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: str | bytes, *, mode: int = 0o600, keep_mode: bool = False,
                 mkdir: bool = False) -> None:
    """Replace `path` with `data` (str is written as UTF-8) atomically and durably.

    mode: permission bits of a new file (the umask applies). keep_mode: an existing file keeps its
    own bits. mkdir: create missing parent folders first.
    """
    path = Path(path)
    if mkdir:
        path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    old_mode = None
    if keep_mode:
        try:
            old_mode = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            old_mode = None
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            if old_mode is not None:
                os.fchmod(fd, old_mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
