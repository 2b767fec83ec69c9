"""Canary tests: the judge's own tests, run in the candidate's pytest process beside the acceptance tests.

A candidate's code runs inside that process (the tests import the engine) and could change how pytest reports
outcomes: a patched report class or hook that turns every failure into a pass or a skip. The judge cannot see
inside the process, but it knows how its own tests must come out: one passes, one fails, one skips. Their file
and names are drawn anew for every run, in a folder outside the checkout, so no candidate code knows them in
advance; any other outcome means the process's reporting was altered, and the whole run is void.
"""

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Canaries", "write_canaries", "canary_problems"]


@dataclass(frozen=True)
class Canaries:
    path: Path  # the test file (pass it to pytest as one more target)
    expected: Mapping[str, str]  # test function name -> the status it must have

    def is_canary(self, node: str) -> bool:
        return node.rpartition("::")[2] in self.expected


def write_canaries(folder: Path) -> Canaries:
    """A canary test file in `folder` (a fresh folder of its own: pytest puts it on sys.path)."""
    tag = secrets.token_hex(5)
    names = {f"test_{tag}_passes": "passed", f"test_{tag}_fails": "failed", f"test_{tag}_skips": "skipped"}
    source = f'''"""The judge's canary tests (harness/judge/canary.py): each must come out exactly as written."""

import pytest


def test_{tag}_passes():
    assert sum([1, 1]) == 2


def test_{tag}_fails():
    assert sum([1, 1]) == 3, "the judge's canary: this test must fail"


def test_{tag}_skips():
    pytest.skip("the judge's canary: this test must skip")
'''
    path = folder / f"test_{tag}.py"
    path.write_text(source, encoding="utf-8")
    return Canaries(path=path, expected=names)


def canary_problems(canaries: Canaries, statuses: Mapping[str, object]) -> list[str]:
    """Why the run's outcomes cannot be trusted ([] when every canary came out as written). `statuses`: node id ->
    an object with `.status` (harness.judge.pytest_report.TestOutcome)."""
    seen = {node.rpartition("::")[2]: getattr(outcome, "status", "?") for node, outcome in statuses.items()
            if canaries.is_canary(node)}
    problems = []
    for name, want in canaries.expected.items():
        got = seen.get(name)
        if got != want:
            problems.append(f"the judge's canary test {name} came out {got or 'not run'}, it must be {want}: the test "
                            "process's reporting was altered by code running inside it")
    return problems
