"""Helpers for the guards tests (a plainly named module: tests/ folders have no __init__.py).

Fixture files mark each line that must produce a finding with a comment `# expect: <rule>[, <rule>]`.
Those markers, written by hand, are the reference the tests compare against; the comparison is a
multiset equality, so a missed finding and an extra one both fail.
"""

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from guards.config import load_config
from guards.findings import Finding
from guards.runner import check_paths

__all__ = ["REPO", "FIXTURES", "check_fixture", "expected_findings", "actual_findings", "run_cli", "line_of"]

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
_MARKER = re.compile(r"#.*?\bexpect:\s*([a-z-]+(?:\s*,\s*[a-z-]+)*)")


def check_fixture(name: str, rules: list[str] | None = None) -> list[Finding]:
    root = FIXTURES / name
    return check_paths([root], load_config(root / "guards.toml"), rules, cwd=root).findings


def expected_findings(name: str) -> Counter:
    """(path, line, rule) for every `# expect:` marker under the fixture."""
    root = FIXTURES / name
    expected: Counter = Counter()
    for file in sorted(root.rglob("*.py")):
        # latin-1 reads every byte, so files that are broken on purpose still yield their markers
        for lineno, line in enumerate(file.read_bytes().decode("latin-1").splitlines(), start=1):
            match = _MARKER.search(line)
            if match:
                for rule in match.group(1).split(","):
                    expected[(file.relative_to(root).as_posix(), lineno, rule.strip())] += 1
    return expected


def actual_findings(findings: list[Finding]) -> Counter:
    return Counter((f.path, f.line, f.rule) for f in findings)


def run_cli(args: list[str], cwd: Path, module: str = "guards") -> subprocess.CompletedProcess:
    """`python -m guards ...` as a real subprocess, with this checkout importable from any folder."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def line_of(path: Path, needle: str) -> int:
    """1-based number of the first line containing `needle` (so tests do not hard-code line numbers)."""
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if needle in line:
            return lineno
    raise AssertionError(f"{needle!r} not in {path}")
