"""The judged checkout's bytecode, compiled by the judge, so candidate processes run with Python's defaults.

A user's checkout has `__pycache__` folders next to its modules, and a user's Python writes them: no
PYTHONPYCACHEPREFIX, no -B / PYTHONDONTWRITEBYTECODE. The judge used both to keep bytecode out of the judged
checkout, which candidate code could see (`sys.pycache_prefix`, `sys.flags`, a missing `__pycache__`). Instead,
once the patch is admitted, the judge removes every `__pycache__` of the checkout (the diff policy already
refuses binary files: a .pyc never comes from the patch) and compiles every module with its own interpreter's
`compileall` (compiling runs no candidate code), in a process of its own (-I: nothing of the checkout on its
path) with a timeout. Inside the sandbox those folders stay read-only (`pycache_folders`) while the rest of the
checkout is seen writable, so no candidate process can plant bytecode that a later import would load.
"""

import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["precompile", "pycache_folders", "PrecompileError"]

_COMPILE_TIMEOUT_S = 600.0


class PrecompileError(RuntimeError):
    """compileall did not finish: the message says why."""


def pycache_folders(tree: Path) -> tuple[Path, ...]:
    """Every `__pycache__` folder of `tree` (outside .git)."""
    return tuple(p for p in sorted(tree.rglob("__pycache__")) if p.is_dir() and ".git" not in p.relative_to(tree).parts)


def precompile(tree: Path, *, timeout_s: float = _COMPILE_TIMEOUT_S) -> tuple[Path, ...]:
    """Replace the bytecode of `tree` with the judge's own compile of its sources; returns the `__pycache__` folders.

    A module that does not compile gets no bytecode (its import fails in the tests, as it would for a user)."""
    for folder in pycache_folders(tree):
        shutil.rmtree(folder)
    argv = [sys.executable, "-I", "-m", "compileall", "-q", "-f", "-j", "0", "--invalidation-mode", "timestamp",
            "-x", r"(^|/)\.git/", str(tree)]
    try:
        subprocess.run(argv, cwd=tree.parent, capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise PrecompileError(f"compiling the judged checkout's modules took more than {timeout_s:g} s") from None
    return pycache_folders(tree)
