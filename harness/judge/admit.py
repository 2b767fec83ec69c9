"""Admitting a patch: the one step between a candidate's diff and the tree the gates judge.

A throw-away checkout of the judge's base commit in a neutral random temp folder; `git apply --check`, then git's
own parser reads what the patch touches (harness/judge/policy.py), then it is applied; the diff policy sees the
patch and what applying it did on disk, against the base alone; only a patch the policy admits gets the
milestone's hidden material copied over it (a public judging, the agent's dry run, gets none: the checkout then holds
what the agent's worktree holds) and, sandboxed, its bytecode compiled by the judge. The manifest taken last is what
the checkout must still be after every gate.
"""

import contextlib
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.judge.bytecode import PrecompileError, precompile
from harness.judge.judging import GateError
from harness.judge.manifests import tree_manifest
from harness.judge.policy import PatchView, PolicyResult, changed_files, check_policy, read_patch
from harness.spec import Milestone
from harness.workspace import HELD_OUT_GLOB, Workspace, WorkspaceError

__all__ = ["AdmittedTree", "admit", "hidden_files", "overlay_hidden", "place_held_out"]


@dataclass(frozen=True)
class AdmittedTree:
    """The checkout the gates judge. `policy.violations` non-empty: the patch was refused (the protected gate says
    why) and nothing was overlaid or compiled, since no candidate code will run."""

    tree: Path
    holder: Path  # the neutral temp folder around the checkout
    policy: PolicyResult
    expected: dict[str, str]  # the checkout's manifest once admitted; must not move while gates run
    pycache: tuple[Path, ...]  # the judge-compiled bytecode folders (read-only in the sandbox)


@contextlib.contextmanager
def admit(milestone: Milestone, *, repo: Path, base: str, home: Path, diff: str,
          compile_bytecode: bool, public: bool = False) -> Iterator[AdmittedTree]:
    """Base + `diff`, admitted or refused by the diff policy; the checkout is removed when the block ends. GateError
    when the patch does not apply or the judge cannot compile the checkout. `public`: no held-out material (a dry
    run); the policy still refuses a patch that writes where it would go."""
    with Workspace.scratch(repo, base) as scratch:
        tree = scratch.worktree
        holder = tree.parent
        patch = holder / f"{secrets.token_hex(6)}.patch"
        patch.write_text(diff, encoding="utf-8", errors="surrogateescape")
        view = PatchView(paths=(), binary=(), modes=())
        before = tree_manifest(tree)
        if diff.strip():
            check = subprocess.run(["git", "-C", str(tree), "apply", "--check", "--whitespace=nowarn", str(patch)],
                                   capture_output=True, text=True)
            if check.returncode != 0:
                raise GateError(f"the patch does not apply to {base[:12]}: {check.stderr.strip()}")
            try:
                view = read_patch(tree, patch)
                scratch.apply_patch_file(patch)
            except (ValueError, WorkspaceError) as err:
                raise GateError(f"the patch cannot be applied: {err}") from None
        # The policy sees the candidate's changes to the base alone; the held-out material goes in after
        # (over anything the patch put at its paths, which the policy has already named).
        policy = check_policy(milestone, view, changed_files(before, tree_manifest(tree)), tree,
                              held_out=frozenset(hidden_files(milestone, home)))
        pycache: tuple[Path, ...] = ()
        if not policy.violations:  # (a refused patch runs nothing, and may have planted links on those paths)
            place_held_out(milestone, home, tree, public=public)
            if compile_bytecode:
                try:
                    pycache = precompile(tree)
                except PrecompileError as err:
                    raise GateError(f"the judge cannot compile the checkout: {err}") from None
        yield AdmittedTree(tree=tree, holder=holder, policy=policy, expected=tree_manifest(tree), pycache=pycache)


def hidden_files(milestone: Milestone, home: Path) -> dict[str, Path]:
    """The milestone's hidden material: {path in the judged checkout: source file}."""
    if milestone.hidden is None:
        return {}
    source = home / milestone.hidden
    if not source.is_dir():
        raise GateError(f"the milestone's hidden folder {source} does not exist")
    return {f.relative_to(source).as_posix(): f for f in sorted(source.rglob("*"))
            if f.is_file() and "__pycache__" not in f.parts}


def place_held_out(milestone: Milestone, home: Path, tree: Path, *, public: bool) -> None:
    """A judging's checkout gets the milestone's hidden material over it; a public one (the agent's dry run) none: the
    hidden folders a checkout of the repository holds are removed, as the agent's worktree leaves them out."""
    if not public:
        overlay_hidden(milestone, home, tree)
        return
    for folder in {*tree.glob(HELD_OUT_GLOB), *([tree / milestone.hidden] if milestone.hidden else [])}:
        if folder.is_dir() and not folder.is_symlink() and folder.resolve().is_relative_to(tree.resolve() / "milestones"):
            shutil.rmtree(folder)


def overlay_hidden(milestone: Milestone, home: Path, tree: Path) -> None:
    """Copy the milestone's hidden material (held-out tests, reference data) over the checkout."""
    for rel, file in hidden_files(milestone, home).items():
        target = tree / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)  # never write through whatever stood there
        shutil.copyfile(file, target)
