"""The diff policy: what a candidate may touch, decided before any of its code runs.

A candidate is judged as the base commit plus its patch, so everything it can do to the judging starts
with a file it adds or changes. Two views of the patch are taken and both must be clean:
- what the patch says it does (`git apply --numstat --summary`: paths, renames, modes, binary hunks),
  read before it is applied;
- what it did (`changed_files`: the judged checkout on disk against the base commit, every file,
  never asking git about the checkout), so no patch dialect can touch a path the first view misses.

A path may change only when a milestone `editable` glob names it and no protected glob does. The one
exception is an honest test addition: a new `tests/**/test_*.py` file (never a conftest.py, never an
edit of an existing test), which the pytest gate runs in a process of its own. Binary content is
refused unless a `binary` glob of the milestone allows it; symlinks are refused everywhere (a link can
make an editable path alias a protected one), and so are submodules (gitlinks: content the patch does not carry).
"""

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness.spec import Milestone

__all__ = ["PatchView", "PolicyResult", "read_patch", "changed_files", "check_policy"]


@dataclass(frozen=True)
class PatchView:
    """What `git apply` reads from a patch without applying it."""

    paths: tuple[str, ...]  # every path named: sources and targets of renames and copies too
    binary: tuple[str, ...]  # paths with a binary hunk
    modes: tuple[str, ...]  # summary lines about modes, symlinks, renames ("mode change 100644 => 100755 x")


@dataclass(frozen=True)
class PolicyResult:
    violations: tuple[str, ...]
    changed: Mapping[str, str]  # path -> "added" | "changed" | "deleted"
    new_tests: tuple[str, ...] = field(default_factory=tuple)


def read_patch(tree: Path, patch: Path) -> PatchView:
    """The paths a patch touches, from git's own parser (the same one that applies it)."""
    numstat = subprocess.run(["git", "-C", str(tree), "apply", "--numstat", "-z", str(patch)],
                             capture_output=True)
    summary = subprocess.run(["git", "-C", str(tree), "apply", "--summary", str(patch)],
                             capture_output=True, text=True, errors="surrogateescape")
    if numstat.returncode != 0:
        raise ValueError(numstat.stderr.decode("utf-8", "replace").strip() or "git apply --numstat failed")
    paths: list[str] = []
    binary: list[str] = []
    fields = numstat.stdout.decode("utf-8", "surrogateescape").split("\0")
    i = 0
    while i < len(fields):
        entry = fields[i]
        if not entry:
            i += 1
            continue
        added, deleted, path = (entry.split("\t", 2) + ["", ""])[:3]
        names = [path]
        if path == "":  # a rename or copy: "added\tdeleted\t" then NUL, source NUL, target NUL
            names = [fields[i + 1], fields[i + 2]]
            i += 2
        paths += names
        if added == "-" and deleted == "-":
            binary += names
        i += 1
    modes = tuple(line.strip() for line in summary.stdout.splitlines() if line.strip())
    return PatchView(paths=tuple(dict.fromkeys(paths)), binary=tuple(binary), modes=modes)


def changed_files(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, str]:
    """path -> added / changed / deleted between two manifests."""
    out = {}
    for path in sorted(set(before) | set(after)):
        if path not in after:
            out[path] = "deleted"
        elif path not in before:
            out[path] = "added"
        elif before[path] != after[path]:
            out[path] = "changed"
    return out


def _is_binary(path: Path) -> bool:
    """NUL bytes or text that is not UTF-8: what git would show as a binary hunk."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    if b"\0" in data:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def check_policy(milestone: Milestone, view: PatchView, changed: Mapping[str, str], tree: Path,
                 held_out: frozenset[str] = frozenset()) -> PolicyResult:
    """Every violation of the diff policy, each naming the path and the rule it breaks. `held_out`: the
    paths the milestone's hidden material takes in the judged checkout (never the candidate's)."""
    editable = ", ".join(milestone.editable)
    violations: list[str] = []
    new_tests: list[str] = []
    for path in sorted(set(view.paths) | set(changed)):
        kind = changed.get(path, "named by the patch")
        full = tree / path
        if path in held_out:
            violations.append(f"{path}: {kind}, the path of the milestone's held-out (hidden) material: "
                              f"outside the editable globs ({editable})")
            continue
        if full.is_symlink():
            violations.append(f"{path}: a symlink ({kind}); symlinks are refused (a link can alias a protected file)")
            continue
        if milestone.is_editable(path):
            if (path in view.binary or (full.is_file() and _is_binary(full))) and not milestone.allows_binary(path):
                violations.append(f"{path}: binary content ({kind}); no `binary` glob of milestone {milestone.id} allows it")
            continue
        if kind == "added" and milestone.allows_new_test(path) and not _is_binary(full) and path not in view.binary:
            new_tests.append(path)
            continue
        what = "a protected file" if milestone.is_protected(path) else "not editable"
        hint = " (new test files tests/**/test_*.py may be added; existing tests, conftest.py and plugins may not change)" \
            if path.startswith("tests/") else ""
        violations.append(f"{path}: {kind}, {what}: outside the editable globs ({editable}){hint}")
    for line in view.modes:
        if "120000" in line:  # a symlink created or a file turned into one
            violations.append(f"patch summary: {line}: symlinks are refused")
        elif "160000" in line:  # a gitlink: another repository's commit at that path
            violations.append(f"patch summary: {line}: submodules are refused (their content is not in the patch)")
    return PolicyResult(violations=tuple(dict.fromkeys(violations)), changed=dict(changed), new_tests=tuple(new_tests))
