"""Helpers for the agent-tool tests: a small worktree in a tmp dir, calling a tool."""

from pathlib import Path

import pytest

from harness.protocol import ToolCall, ToolResult
from harness.tools import ToolContext, execute

__all__ = ["MODEL_PY", "tree", "ctx", "call"]

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
    return ToolContext(root=tree, output_limit=20_000)


def call(ctx: ToolContext, name: str, **arguments: object) -> ToolResult:
    return execute(ToolCall(id="c1", name=name, arguments=dict(arguments)), ctx)
