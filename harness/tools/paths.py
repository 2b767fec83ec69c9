"""Path confinement for the agent's file tools.

Every path the model sends is relative to the worktree root (an absolute path is accepted only when
it lies inside the root). A path is refused when it escapes the root lexically (`..`), when its real
location (all symlinks resolved, for existing and not-yet-existing tails alike) leaves the root, or
when it touches `.git`. For writes, the path as written *and* its real location must both be
editable and not protected, so a symlink inside an editable folder cannot reach a protected file.

The `run` tool cannot be confined this way: a shell can write anywhere the harness user can. What
makes such writes fail the attempt is the harness's gate that hashes every protected file before and
after the attempt (and the judge living outside the worktree), not these checks.
"""

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from harness.globs import glob_match
from harness.tools.context import ToolContext, ToolError

__all__ = ["ResolvedPath", "matches_glob", "is_writable", "resolve", "is_hidden"]

_HIDDEN = ".git"


@dataclass(frozen=True)
class ResolvedPath:
    """A checked path: `rel` as the model named it (normalized, '/'-separated, "." for the root)
    and `real`, the absolute location after resolving symlinks."""

    rel: str
    real: Path


def matches_glob(rel_path: str, pattern: str) -> bool:
    """Whether a worktree-relative path ('/'-separated) matches a root-anchored glob (see ToolContext).

    The judge's matcher (harness.globs) with its directory reading: a glob naming a folder covers
    everything below it, and `dir/**` names `dir` too.
    """
    return glob_match(pattern, rel_path, tree=True)


def is_hidden(rel_path: str) -> bool:
    return _HIDDEN in PurePosixPath(rel_path).parts


def is_writable(rel_path: str, ctx: ToolContext) -> tuple[bool, str]:
    """(allowed, reason when not) for writing the worktree-relative path."""
    if is_hidden(rel_path):
        return False, "'.git' is not accessible"
    for pattern in ctx.protected:
        if matches_glob(rel_path, pattern):
            return False, f"it is protected (matches {pattern!r}); protected files are read-only"
    if ctx.editable and not any(matches_glob(rel_path, p) for p in ctx.editable):
        globs = ", ".join(repr(p) for p in ctx.editable)
        return False, f"it is outside the editable paths ({globs})"
    return True, ""


def _root_real(ctx: ToolContext) -> Path:
    return Path(os.path.realpath(ctx.root))


def resolve(ctx: ToolContext, path: object, *, write: bool = False, what: str = "path") -> ResolvedPath:
    """Check a path the model sent; raise ToolError naming the problem and the fix."""
    if not isinstance(path, str) or not path.strip():
        raise ToolError(f"{what} must be a non-empty string relative to the worktree root, e.g. 'engine/model.py'")
    text = path.strip()
    if "\x00" in text:
        raise ToolError(f"{what} {path!r} contains a NUL character")
    root_real = _root_real(ctx)
    pure = PurePosixPath(text)
    if pure.is_absolute():
        rel_pure = None
        for base in (PurePosixPath(str(ctx.root.absolute())), PurePosixPath(str(root_real))):
            if pure == base or base in pure.parents:
                rel_pure = pure.relative_to(base)
                break
        if rel_pure is None:
            raise ToolError(
                f"{what} {path!r} is outside the worktree; use a path relative to the worktree root "
                f"(e.g. 'engine/model.py')"
            )
        text = str(rel_pure)
    norm = posixpath.normpath(text)
    if norm == ".." or norm.startswith("../"):
        raise ToolError(f"{what} {path!r} escapes the worktree ('..' above the root); use a path inside it")
    rel = "." if norm in ("", ".") else norm
    if is_hidden(rel):
        raise ToolError(f"{what} {path!r}: '.git' is not accessible")
    real = Path(os.path.realpath(root_real / rel))
    if real != root_real and root_real not in real.parents:
        raise ToolError(f"{what} {path!r} resolves outside the worktree through a symlink; it is not accessible")
    real_rel = "." if real == root_real else real.relative_to(root_real).as_posix()
    if is_hidden(real_rel):
        raise ToolError(f"{what} {path!r} resolves into '.git', which is not accessible")
    if write:
        if rel == ".":
            raise ToolError(f"{what} {path!r} is the worktree root, not a file")
        for candidate in dict.fromkeys((rel, real_rel)):
            allowed, reason = is_writable(candidate, ctx)
            if not allowed:
                shown = candidate if candidate == rel else f"{rel} (a symlink to {candidate})"
                raise ToolError(f"cannot write {shown}: {reason}")
    return ResolvedPath(rel=rel, real=real)
