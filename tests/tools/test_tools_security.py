"""Path confinement: nothing outside the worktree, nothing in .git, no writes to protected paths."""

import os
from pathlib import Path

import pytest

from harness.tools import ToolContext, matches_glob
from tests.tools.tools_helpers import call, snapshot


@pytest.mark.parametrize(
    "path,pattern,expected",
    [
        ("tests/a/b.py", "tests/**", True),
        ("tests", "tests/**", True),
        ("tests/a.py", "tests", True),
        ("tests/a.py", "tests/", True),
        ("testsx/a.py", "tests/**", False),
        ("engine/ops/rms.py", "engine/**/*.py", True),
        ("engine/rms.py", "engine/**/*.py", True),
        ("engine/rms.txt", "engine/**/*.py", False),
        ("a.py", "*.py", True),
        ("sub/a.py", "*.py", False),
        ("sub/a.py", "**/*.py", True),
        ("guards.toml", "guards.toml", True),
        ("guards.toml.bak", "guards.toml", False),
        ("engine/op1.py", "engine/op?.py", True),
        ("engine/op12.py", "engine/op?.py", False),
        ("engine/opb.py", "engine/op[ab].py", True),
    ],
)
def test_glob_semantics(path: str, pattern: str, expected: bool) -> None:
    assert matches_glob(path, pattern) is expected


@pytest.mark.parametrize("bad", ["../outside.txt", "engine/../../outside.txt", "/etc/passwd", "/tmp"])
def test_escapes_are_refused_for_read_and_write(ctx: ToolContext, tree: Path, bad: str) -> None:
    (tree.parent / "outside.txt").write_text("secret\n")
    before = snapshot(tree.parent)
    for name, args in [
        ("read_file", {"path": bad}),
        ("list_dir", {"path": bad}),
        ("search", {"pattern": "secret", "path": bad}),
        ("write_file", {"path": bad, "content": "pwned"}),
    ]:
        res = call(ctx, name, **args)
        assert res.is_error, (name, bad, res.content)
        assert "outside" in res.content or "escapes" in res.content
        assert "secret" not in res.content
    patch = f"--- a/{bad}\n+++ b/{bad}\n@@ -1 +1 @@\n-secret\n+pwned\n"
    res = call(ctx, "apply_patch", patch=patch)
    assert res.is_error and "no file was changed" in res.content
    assert snapshot(tree.parent) == before


def test_absolute_path_inside_the_worktree_is_accepted(ctx: ToolContext, tree: Path) -> None:
    res = call(ctx, "read_file", path=str(tree / "README.md"))
    assert not res.is_error and "hello" in res.content
    lexical_dotdot = call(ctx, "read_file", path="engine/../README.md")
    assert not lexical_dotdot.is_error and "hello" in lexical_dotdot.content


def test_symlink_to_a_file_outside_is_refused(ctx: ToolContext, tree: Path) -> None:
    outside = tree.parent / "secret.txt"
    outside.write_text("secret\n")
    (tree / "engine" / "link.txt").symlink_to(outside)
    assert call(ctx, "read_file", path="engine/link.txt").is_error
    res = call(ctx, "write_file", path="engine/link.txt", content="pwned")
    assert res.is_error and "symlink" in res.content
    res = call(ctx, "apply_patch", patch="engine/link.txt\n<<<<<<< SEARCH\nsecret\n=======\npwned\n>>>>>>> REPLACE\n")
    assert res.is_error
    assert outside.read_text() == "secret\n"
    # search does not follow it either, and list_dir says where it points
    assert "secret" not in call(ctx, "search", pattern="secret").content
    assert "[outside the worktree]" in call(ctx, "list_dir", path="engine").content


def test_dangling_symlink_outside_cannot_be_created_through(ctx: ToolContext, tree: Path) -> None:
    target = tree.parent / "created-by-agent.txt"
    (tree / "engine" / "dangling").symlink_to(target)
    assert call(ctx, "write_file", path="engine/dangling", content="x").is_error
    assert not target.exists()


def test_symlinked_directory_escape_is_refused(ctx: ToolContext, tree: Path) -> None:
    outside_dir = tree.parent / "elsewhere"
    outside_dir.mkdir()
    (outside_dir / "data.txt").write_text("secret\n")
    (tree / "engine" / "sub").symlink_to(outside_dir, target_is_directory=True)
    assert call(ctx, "read_file", path="engine/sub/data.txt").is_error
    assert call(ctx, "list_dir", path="engine/sub").is_error
    for new in ("engine/sub/new.txt", "engine/sub/deeper/new.txt"):
        res = call(ctx, "write_file", path=new, content="x")
        assert res.is_error, new
    patch = "--- /dev/null\n+++ b/engine/sub/new.py\n@@ -0,0 +1 @@\n+x = 1\n"
    assert call(ctx, "apply_patch", patch=patch).is_error
    assert sorted(p.name for p in outside_dir.iterdir()) == ["data.txt"]


def test_symlink_inside_the_worktree_to_a_protected_file_is_not_writable(ctx: ToolContext, tree: Path) -> None:
    (tree / "engine" / "alias.py").symlink_to(tree / "tests" / "test_model.py")
    res = call(ctx, "read_file", path="engine/alias.py")
    assert not res.is_error and "test_x" in res.content
    res = call(ctx, "write_file", path="engine/alias.py", content="def test_x(): pass\n")
    assert res.is_error and "protected" in res.content
    assert "assert True" in (tree / "tests" / "test_model.py").read_text()


def test_protected_paths_are_read_only(ctx: ToolContext, tree: Path) -> None:
    assert not call(ctx, "read_file", path="tests/test_model.py").is_error
    before = snapshot(tree)
    for path in ("tests/test_model.py", "tests/new_test.py", "guards/rules.py", "guards.toml"):
        res = call(ctx, "write_file", path=path, content="x\n")
        assert res.is_error and "protected" in res.content, path
    # a patch touching one protected file fails whole, although its first file is editable
    patch = (
        "--- a/engine/model.py\n+++ b/engine/model.py\n@@ -1,3 +1,3 @@\n-import math\n+import cmath\n \n \n"
        "--- a/tests/test_model.py\n+++ b/tests/test_model.py\n@@ -1,2 +1,2 @@\n def test_x():\n-    assert True\n+    pass\n"
    )
    res = call(ctx, "apply_patch", patch=patch)
    assert res.is_error and "protected" in res.content and "no file was changed" in res.content
    deletion = "--- a/guards.toml\n+++ /dev/null\n@@ -1 +0,0 @@\n-[dag]\n"
    assert call(ctx, "apply_patch", patch=deletion).is_error
    assert snapshot(tree) == before


def test_editable_globs_limit_writes(tree: Path) -> None:
    ctx = ToolContext(root=tree, editable=["engine/**"], protected=["engine/__init__.py"])
    assert not call(ctx, "write_file", path="engine/ops/new.py", content="x = 1\n").is_error
    res = call(ctx, "write_file", path="README.md", content="changed\n")
    assert res.is_error and "editable" in res.content
    res = call(ctx, "write_file", path="engine/__init__.py", content="x\n")  # protected beats editable
    assert res.is_error and "protected" in res.content
    assert (tree / "README.md").read_text() == "hello\n"


def test_dot_git_is_invisible_and_untouchable(ctx: ToolContext, tree: Path) -> None:
    (tree / ".git").mkdir()
    (tree / ".git" / "config").write_text("[core]\nsecretword = 1\n")
    (tree / "engine" / "gitlink").symlink_to(tree / ".git", target_is_directory=True)
    assert ".git" not in call(ctx, "list_dir", depth=3).content
    for path in (".git/config", "./.git/config", "engine/gitlink/config"):
        assert call(ctx, "read_file", path=path).is_error, path
        assert call(ctx, "write_file", path=path, content="x").is_error, path
    assert call(ctx, "list_dir", path=".git").is_error
    assert "secretword" not in call(ctx, "search", pattern="secretword").content
    assert "secretword" not in call(ctx, "search", pattern="secretword", path="**").content
    patch = "--- a/.git/config\n+++ b/.git/config\n@@ -1 +1 @@\n-[core]\n+[corex]\n"
    assert call(ctx, "apply_patch", patch=patch).is_error
    assert (tree / ".git" / "config").read_text().startswith("[core]")


def test_write_through_a_symlink_inside_the_worktree_writes_its_target(ctx: ToolContext, tree: Path) -> None:
    (tree / "engine" / "alias.md").symlink_to(tree / "README.md")
    assert not call(ctx, "write_file", path="engine/alias.md", content="new\n").is_error
    assert (tree / "engine" / "alias.md").is_symlink()
    assert (tree / "README.md").read_text() == "new\n"


def test_nul_and_empty_paths_are_errors(ctx: ToolContext) -> None:
    assert call(ctx, "read_file", path="").is_error
    assert call(ctx, "read_file", path="a\x00b").is_error
    assert os.sep == "/"  # the confinement is written for POSIX paths
