"""Helpers for the agent-tool tests: a small worktree in a tmp dir, calling a tool, snapshots."""

import subprocess
from pathlib import Path

import pytest

from harness.protocol import ToolCall, ToolResult
from harness.tools import ToolContext, execute

__all__ = ["MODEL_PY", "tree", "ctx", "call", "git", "snapshot"]

MODEL_PY = """\
import math


def area(r):
    return math.pi * r * r


class Shape:
    def __init__(self, name):
        self.name = name

    def describe(self):
        return f"shape {self.name}"
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "wt"
    (root / "engine").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "guards").mkdir()
    (root / "engine" / "model.py").write_text(MODEL_PY)
    (root / "engine" / "__init__.py").write_text("")
    (root / "tests" / "test_model.py").write_text("def test_x():\n    assert True\n")
    (root / "guards" / "rules.py").write_text("RULES = []\n")
    (root / "guards.toml").write_text("[dag]\n")
    (root / "README.md").write_text("hello\n")
    return root


@pytest.fixture
def ctx(tree: Path) -> ToolContext:
    return ToolContext(root=tree, protected=["tests/**", "guards/**", "guards.toml"], output_limit=20_000)


def call(ctx: ToolContext, name: str, **arguments: object) -> ToolResult:
    return execute(ToolCall(id="c1", name=name, arguments=dict(arguments)), ctx)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=T", "-c", "user.email=t@t", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root (symlinks as their target text), for all-or-nothing checks."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = b"->" + str(p.readlink()).encode()
        elif p.is_file():
            out[rel] = p.read_bytes()
    return out
