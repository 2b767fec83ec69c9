"""The judge's test process never imports candidate code.

A pytest gate decides pass or fail in the process that runs the tests. If candidate code were imported there,
it could rewrite how that process reports (through routes no guard can list in full) and the judge would sign a
failing test as passed. So the judge's pytest refuses, at import, every module whose file the candidate may have
written: only files the judge trusts (protected and unchanged by the patch, or the judge's held-out material)
load from the judged checkout; libraries outside it load as usual. A test that needs the engine runs it in a
child process (harness/judge/candidate.py) that hands back data, and asserts on that data itself.

The judge writes the trusted list (`write_barrier`) and its pytest plugin installs the barrier before any
conftest or test module loads (`--judge-barrier=PATH`, harness/judge/pytest_report.py).
"""

from __future__ import annotations

import importlib.abc
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

__all__ = ["BARRIER_OPTION", "CandidateImportError", "CandidateBarrier", "write_barrier", "install_from_file"]

BARRIER_OPTION = "--judge-barrier"


class CandidateImportError(ImportError):
    """A module of the candidate's was imported in the judge's test process."""


class CandidateBarrier(importlib.abc.MetaPathFinder):
    """First on sys.meta_path: finds each module through the finders after it, and refuses the ones whose file
    lies in `root` but is not in `trusted` (paths relative to `root`)."""

    def __init__(self, root: str, trusted: Iterable[str], candidate: Iterable[str]) -> None:
        self.root = os.path.realpath(root)
        self.trusted = frozenset(trusted)
        # Folders holding candidate files: a namespace package (no __init__.py, no file of its own) is one of them.
        self.candidate_dirs = frozenset(str(parent) for rel in candidate for parent in Path(rel).parents if str(parent) != ".")

    def relative(self, path: str) -> str | None:
        if not os.path.isabs(path):
            return None
        rel = os.path.relpath(os.path.realpath(path), self.root)
        return None if rel == ".." or rel.startswith(".." + os.sep) else Path(rel).as_posix()

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001, ANN201 -- the MetaPathFinder protocol
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is None:
                continue
            origin = spec.origin if spec.has_location and spec.origin else None
            if origin is not None:
                rel = self.relative(origin)
                refused = rel is not None and rel not in self.trusted
            else:  # a namespace package: refused when a folder of it holds candidate files
                rels = [self.relative(p) for p in (spec.submodule_search_locations or ())]
                rel = next((r for r in rels if r is not None and (r == "." or r in self.candidate_dirs)), None)
                refused = rel is not None
            if refused:
                raise CandidateImportError(
                    f"{fullname} ({rel}) is code the candidate may have written: the judge's test process never imports "
                    "it. A test calls the engine in a child process (harness.judge.candidate.Candidate) and asserts on "
                    "the data it hands back.")
            return spec
        return None


def write_barrier(path: Path, root: Path, manifest: Iterable[str], is_candidate) -> Path:  # noqa: ANN001 -- a predicate
    """Write the barrier's file for checkout `root`: every path of `manifest` (relative to root) is trusted unless
    `is_candidate(path)`."""
    trusted, candidate = [], []
    for rel in manifest:
        (candidate if is_candidate(rel) else trusted).append(rel)
    path.write_text(json.dumps({"root": str(root), "trusted": sorted(trusted), "candidate": sorted(candidate)}),
                    encoding="utf-8")
    return path


def install_from_file(path: str) -> CandidateBarrier:
    """Put the barrier described by the judge's file first on sys.meta_path. Raises CandidateImportError when
    a candidate module is already imported (nothing of the checkout's but the judge's plugin loads this early)."""
    with open(path, encoding="utf-8") as fh:
        spec = json.load(fh)
    barrier = CandidateBarrier(spec["root"], spec["trusted"], spec["candidate"])
    for name, module in list(sys.modules.items()):
        rel = barrier.relative(getattr(module, "__file__", None) or "")
        if rel is not None and rel not in barrier.trusted:
            raise CandidateImportError(f"{name} ({rel}) was imported before the judge's barrier was in place")
    sys.meta_path.insert(0, barrier)
    return barrier
