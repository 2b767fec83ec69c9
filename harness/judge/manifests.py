"""Judge integrity: protected files as at the base commit, hashed on disk.

The base side comes from git (`git ls-tree` of the base commit: what the judge was built from). The
attempt side never does: the agent's shell can edit `.gitignore`, `.git/info/exclude` or the index
(`git update-index --assume-unchanged`) to hide a change from git, so every file on disk is walked
and hashed here, the way git would hash it (a blob id), and compared path by path.

Only byte-level caches that the gates themselves neutralise are skipped: `__pycache__` folders (sandboxed,
the judge replaces them with its own compile and keeps them read-only, harness/judge/bytecode.py; unsandboxed,
gates run Python with PYTHONPYCACHEPREFIX pointing elsewhere, so planted bytecode is never loaded) and
`.pytest_cache` (gates run pytest with `-p no:cacheprovider`).
"""

import hashlib
import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from harness.settings import python_path

__all__ = [
    "SKIPPED_DIRS",
    "blob_id",
    "base_manifest",
    "disk_manifest",
    "tree_manifest",
    "manifest_changes",
    "python_env",
]

SKIPPED_DIRS = frozenset({".git", "__pycache__", ".pytest_cache"})


def blob_id(path: Path) -> str:
    """git's object id of a file's content (sha1 of "blob <size>\\0" + bytes); a symlink hashes its target."""
    data = os.readlink(path).encode("utf-8", "surrogateescape") if path.is_symlink() else path.read_bytes()
    digest = hashlib.sha1(b"blob %d\0" % len(data))
    digest.update(data)
    kind = "l" if path.is_symlink() else "f"
    return f"{kind}:{digest.hexdigest()}"


def base_manifest(repo: Path, commit: str, is_protected: Callable[[str], bool]) -> dict[str, str]:
    """{path: blob id} of every protected file in `commit` (kind-prefixed like `blob_id`)."""
    out = subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "-z", "--full-tree", commit],
                         capture_output=True, check=True).stdout.decode("utf-8", "surrogateescape")
    manifest = {}
    for entry in filter(None, out.split("\0")):
        meta, _, path = entry.partition("\t")
        mode, kind, sha = meta.split()
        if kind == "blob" and is_protected(path):
            manifest[path] = ("l:" if mode == "120000" else "f:") + sha
    return manifest


def tree_manifest(root: Path) -> dict[str, str]:
    """{path: blob id} of every file under `root` found by walking it (never git): symlinks as links, never
    followed; only `.git` and the caches the gates neutralise (SKIPPED_DIRS) are left out."""
    manifest = {}
    for folder, dirs, files in os.walk(root):
        rel_folder = Path(folder).relative_to(root)
        keep = []
        for name in dirs:
            full = Path(folder) / name
            if name in SKIPPED_DIRS:
                continue
            if full.is_symlink():  # os.walk does not follow it; a symlinked folder is a file-like entry
                files.append(name)
            else:
                keep.append(name)
        dirs[:] = keep
        for name in files:
            if name == ".git":  # a worktree's .git is a file pointing at the repository
                continue
            manifest[(rel_folder / name).as_posix()] = blob_id(Path(folder) / name)
    return manifest


def disk_manifest(root: Path, is_protected: Callable[[str], bool]) -> dict[str, str]:
    """{path: blob id} of every protected file on disk under `root`."""
    return {path: digest for path, digest in tree_manifest(root).items() if is_protected(path)}


def manifest_changes(base: Mapping[str, str], disk: Mapping[str, str]) -> list[str]:
    """Differences as violations: 'changed: p', 'deleted: p', 'added: p' (sorted by path)."""
    out = []
    for path in sorted(set(base) | set(disk)):
        if path not in disk:
            out.append(f"deleted: {path}")
        elif path not in base:
            out.append(f"added: {path}")
        elif base[path] != disk[path]:
            out.append(f"changed: {path}" + (" (file <-> symlink)" if base[path][0] != disk[path][0] else ""))
    return out


def python_env(tree: Path, cache: Path | None) -> dict[str, str]:
    """Overrides for every Python process a gate starts in `tree`: import the tree's code first (then the
    judge's own PYTHONPATH entries, libraries the user put there), and keep bytecode out of it (a .pyc
    planted in a __pycache__ folder must never be loaded). `cache` None: `tree` is a checkout of the base that
    the judge made itself (no candidate code, no __pycache__), so Python reads the installed packages' own
    bytecode (an empty PYTHONPYCACHEPREFIX compiles torch again, ~3 s a process) and writes none."""
    path = os.pathsep.join(dict.fromkeys([str(tree), *python_path()]))
    prefix = {} if cache is None else {"PYTHONPYCACHEPREFIX": str(cache)}
    return {"PYTHONPATH": path, **prefix, "PYTHONDONTWRITEBYTECODE": "1"}
