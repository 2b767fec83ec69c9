"""list_dir, read_file, search and write_file: happy paths and the errors a model can cause."""

import re
from pathlib import Path

from harness.tools import ToolContext
from tests.tools.tools_helpers import MODEL_PY, call, git


def test_list_dir_tree_and_depth(ctx: ToolContext, tree: Path) -> None:
    (tree / "engine" / "ops").mkdir()
    (tree / "engine" / "ops" / "rms.py").write_text("x\n")
    (tree / "engine" / "__pycache__").mkdir()
    (tree / "engine" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    shallow = call(ctx, "list_dir", path=".", depth=1).content
    assert "engine/  (4 entries)" in shallow and "model.py" not in shallow
    deep = call(ctx, "list_dir", path=".", depth=3).content
    assert "  model.py  (185 bytes)" in deep  # len(MODEL_PY) bytes
    assert len(MODEL_PY.encode()) == 185
    assert "    rms.py  (2 bytes)" in deep
    assert "__pycache__/  [not expanded]" in deep and ".pyc" not in deep
    assert "tests/  [read-only]" in deep and "test_model.py  (" in deep
    sub = call(ctx, "list_dir", path="engine/ops")
    assert not sub.is_error and sub.content.splitlines() == ["engine/ops/", "rms.py  (2 bytes)"]


def test_list_dir_errors(ctx: ToolContext) -> None:
    assert "no such directory" in call(ctx, "list_dir", path="nope").content
    assert "is a file" in call(ctx, "list_dir", path="README.md").content


def test_read_file_numbers_lines_and_ranges(ctx: ToolContext, tree: Path) -> None:
    full = call(ctx, "read_file", path="engine/model.py").content
    lines = MODEL_PY.splitlines()
    assert full.splitlines() == [f"{i + 1:>2}\t{line}" for i, line in enumerate(lines)]
    part = call(ctx, "read_file", path="engine/model.py", start_line=4, end_line=5).content
    assert part.splitlines() == [f"4\t{lines[3]}", f"5\t{lines[4]}", f"[lines 4-5 of {len(lines)}]"]
    assert call(ctx, "read_file", path="engine/model.py", start_line=99).is_error
    assert call(ctx, "read_file", path="engine/model.py", start_line=5, end_line=3).is_error


def test_read_file_truncates_with_a_continuation_note(tree: Path) -> None:
    ctx = ToolContext(root=tree, output_limit=2000)
    (tree / "big.txt").write_text("".join(f"row {i:05d} " + "x" * 40 + "\n" for i in range(1000)))
    res = call(ctx, "read_file", path="big.txt")
    assert not res.is_error and len(res.content) <= 2000
    m = re.search(r"showing lines 1-(\d+) of 1000; call read_file with start_line=(\d+)", res.content)
    assert m and int(m.group(2)) == int(m.group(1)) + 1
    nxt = call(ctx, "read_file", path="big.txt", start_line=int(m.group(2))).content
    assert nxt.lstrip().startswith(f"{int(m.group(2))}\trow {int(m.group(2)) - 1:05d}")


def test_read_file_errors(ctx: ToolContext, tree: Path) -> None:
    (tree / "blob.bin").write_bytes(b"\x89PNG\r\n\x00\x00")
    (tree / "latin.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    (tree / "empty.txt").write_text("")
    assert "binary" in call(ctx, "read_file", path="blob.bin").content
    assert "not UTF-8" in call(ctx, "read_file", path="latin.txt").content
    assert "no such file" in call(ctx, "read_file", path="missing.py").content
    assert "is a directory" in call(ctx, "read_file", path="engine").content
    assert call(ctx, "read_file", path="empty.txt").content == "empty.txt is empty."


def test_search_like_ripgrep(ctx: ToolContext, tree: Path) -> None:
    res = call(ctx, "search", pattern=r"def \w+\(", path="engine")
    assert res.content.splitlines() == [
        "engine/model.py:4:def area(r):",
        "engine/model.py:9:    def __init__(self, name):",
        "engine/model.py:12:    def describe(self):",
        "[3 matches in 1 files]",
    ]
    assert "tests/test_model.py:1:def test_x():" in call(ctx, "search", pattern="def", glob="*.py").content
    only_tests = call(ctx, "search", pattern="def", path="tests/**").content
    assert "tests/test_model.py:1:" in only_tests and "engine/" not in only_tests
    assert call(ctx, "search", pattern="DEF AREA", ignore_case=True).content.startswith("engine/model.py:4:")
    assert call(ctx, "search", pattern="zzz_no_match").content == "No matches."
    one_file = call(ctx, "search", pattern="self", path="engine/model.py").content
    assert one_file.count("engine/model.py:") == 4  # lines 9, 10, 12, 13


def test_search_limits_binary_and_bad_regex(ctx: ToolContext, tree: Path) -> None:
    (tree / "many.txt").write_text("hit\n" * 50)
    (tree / "blob.bin").write_bytes(b"hit\x00hit")
    res = call(ctx, "search", pattern="hit", max_results=5).content
    assert res.count("many.txt:") == 5 and "stopped at max_results=5" in res and "1 binary files skipped" in res
    bad = call(ctx, "search", pattern="([unclosed")
    assert bad.is_error and "not a valid Python regular expression" in bad.content


def test_search_respects_gitignore_in_a_git_checkout(ctx: ToolContext, tree: Path) -> None:
    git(tree, "init", "-q")
    (tree / ".gitignore").write_text("outputs/\n")
    (tree / "outputs").mkdir()
    (tree / "outputs" / "log.txt").write_text("needle\n")
    (tree / "engine" / "untracked.py").write_text("needle = 1\n")
    res = call(ctx, "search", pattern="needle").content
    assert "engine/untracked.py:1:needle = 1" in res and "outputs/" not in res


def test_write_file_creates_parents_and_overwrites(ctx: ToolContext, tree: Path) -> None:
    res = call(ctx, "write_file", path="engine/ops/new/op.py", content="a = 1\nb = 2\n")
    assert not res.is_error and res.content == "Created engine/ops/new/op.py (12 bytes, 2 lines)."
    assert (tree / "engine" / "ops" / "new" / "op.py").read_text() == "a = 1\nb = 2\n"
    res = call(ctx, "write_file", path="engine/ops/new/op.py", content="c = 3")
    assert res.content.startswith("Overwrote") and (tree / "engine" / "ops" / "new" / "op.py").read_text() == "c = 3"
    assert not [p for p in (tree / "engine" / "ops" / "new").iterdir() if p.name.endswith(".tmp")]
    assert "is a directory" in call(ctx, "write_file", path="engine", content="x").content
