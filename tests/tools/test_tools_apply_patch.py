"""apply_patch: unified diffs, search/replace blocks and the OpenAI envelope; fuzz tolerance;
all-or-nothing failures that show the closest real lines."""

import random
import subprocess
from pathlib import Path

import pytest

from harness.tools import ToolContext
from tests.tools.tools_helpers import MODEL_PY, call, snapshot


def _git_diff(old: str, new: str, tmp: Path, name: str = "f.txt") -> str:
    """The reference: git's own diff between two versions, with a/ b/ paths of `name`."""
    a, b = tmp / "ref_a", tmp / "ref_b"
    a.mkdir(exist_ok=True)
    b.mkdir(exist_ok=True)
    (a / "x").write_text(old)
    (b / "x").write_text(new)
    proc = subprocess.run(
        ["git", "diff", "--no-index", "--no-color", "-U2", str(a / "x"), str(b / "x")], capture_output=True, text=True
    )
    assert proc.returncode in (0, 1), proc.stderr
    lines = proc.stdout.splitlines(keepends=True)
    body = "".join(line for line in lines if line.startswith(("@@", " ", "+", "-", "\\")) and not line.startswith(("---", "+++")))
    return f"--- a/{name}\n+++ b/{name}\n" + body


def test_unified_multi_file_with_new_and_deleted_files(ctx: ToolContext, tree: Path) -> None:
    patch = """Here is my change:
```diff
diff --git a/engine/model.py b/engine/model.py
index 1111111..2222222 100644
--- a/engine/model.py
+++ b/engine/model.py
@@ -3,5 +3,5 @@ import math
 
 def area(r):
-    return math.pi * r * r
+    return math.pi * r ** 2
 
 
@@ -13,2 +13,2 @@ class Shape:
     def describe(self):
-        return f"shape {self.name}"
+        return f"Shape({self.name!r})"
diff --git a/engine/ops.py b/engine/ops.py
new file mode 100644
--- /dev/null
+++ b/engine/ops.py
@@ -0,0 +1,2 @@
+def double(x):
+    return 2 * x
diff --git a/README.md b/README.md
deleted file mode 100644
--- a/README.md
+++ /dev/null
@@ -1 +0,0 @@
-hello
```
"""
    res = call(ctx, "apply_patch", patch=patch)
    assert not res.is_error, res.content
    expected = MODEL_PY.replace("r * r", "r ** 2").replace('f"shape {self.name}"', 'f"Shape({self.name!r})"')
    assert (tree / "engine" / "model.py").read_text() == expected
    assert (tree / "engine" / "ops.py").read_text() == "def double(x):\n    return 2 * x\n"
    assert not (tree / "README.md").exists()
    assert "M engine/model.py" in res.content and "A engine/ops.py" in res.content and "D README.md" in res.content


def test_git_style_pure_delete_and_rename_without_hunks(ctx: ToolContext, tree: Path) -> None:
    patch = (
        "diff --git a/README.md b/README.md\ndeleted file mode 100644\nindex e69de29..0000000\n"
        "diff --git a/engine/model.py b/engine/shapes.py\nsimilarity index 100%\n"
        "rename from engine/model.py\nrename to engine/shapes.py\n"
    )
    res = call(ctx, "apply_patch", patch=patch)
    assert not res.is_error, res.content
    assert not (tree / "README.md").exists()
    assert not (tree / "engine" / "model.py").exists()
    assert (tree / "engine" / "shapes.py").read_text() == MODEL_PY


@pytest.mark.parametrize("seed", range(6))
def test_random_edits_match_git_diff_reference_even_with_wrong_line_numbers(
    ctx: ToolContext, tree: Path, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    old_lines = [f"line {i} value {rng.randint(0, 9)}" for i in range(120)]
    new_lines = list(old_lines)
    for _ in range(5):
        at = rng.randrange(len(new_lines))
        choice = rng.random()
        if choice < 0.4:
            new_lines[at] = new_lines[at] + " changed"
        elif choice < 0.7:
            new_lines.insert(at, f"inserted {rng.random():.6f}")
        else:
            del new_lines[at]
    old, new = "\n".join(old_lines) + "\n", "\n".join(new_lines) + "\n"
    (tree / "engine" / "data.txt").write_text(old)
    patch = _git_diff(old, new, tmp_path, "engine/data.txt")
    if seed % 2:  # models get hunk positions wrong: shift every header by a few lines
        patch = "\n".join(
            line.replace("@@ -", f"@@ -{rng.randint(1, 9)}", 1) if line.startswith("@@") else line
            for line in patch.split("\n")
        )
    res = call(ctx, "apply_patch", patch=patch)
    assert not res.is_error, res.content
    assert (tree / "engine" / "data.txt").read_text() == new


def test_trailing_whitespace_and_indentation_drift_are_tolerated(ctx: ToolContext, tree: Path) -> None:
    # The model dropped the method's indentation and added trailing spaces; the file keeps its own.
    patch = (
        "--- a/engine/model.py\n+++ b/engine/model.py\n@@ -12,2 +12,3 @@\n"
        "-def describe(self):   \n"
        "-    return f\"shape {self.name}\"\n"
        "+def describe(self):\n"
        "+    text = f\"shape {self.name}\"\n"
        "+    return text.upper()\n"
    )
    res = call(ctx, "apply_patch", patch=patch)
    assert not res.is_error, res.content
    assert "ignoring whitespace" in res.content
    expected = MODEL_PY.replace(
        '        return f"shape {self.name}"\n',
        '        text = f"shape {self.name}"\n        return text.upper()\n',
    )
    assert (tree / "engine" / "model.py").read_text() == expected


def test_blank_context_lines_without_their_space_still_match(ctx: ToolContext, tree: Path) -> None:
    # Editors strip the lone space of blank context lines; trailing blank lines are patch spacing.
    patch = "--- a/engine/model.py\n+++ b/engine/model.py\n@@ -1,4 +1,4 @@\n-import math\n+import math as m\n\n\n def area(r):\n\n\n"
    res = call(ctx, "apply_patch", patch=patch)
    assert not res.is_error, res.content
    assert (tree / "engine" / "model.py").read_text() == MODEL_PY.replace("import math\n", "import math as m\n", 1)


def test_crlf_file_keeps_its_line_endings(ctx: ToolContext, tree: Path) -> None:
    (tree / "win.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    res = call(ctx, "apply_patch", patch="--- a/win.txt\n+++ b/win.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n")
    assert not res.is_error, res.content
    assert (tree / "win.txt").read_bytes() == b"one\r\nTWO\r\nthree\r\n"


def test_no_newline_at_end_of_file_markers(ctx: ToolContext, tree: Path, tmp_path: Path) -> None:
    (tree / "n.txt").write_text("a\nb")
    patch = _git_diff("a\nb", "a\nc\n", tmp_path, "n.txt")
    assert "\\ No newline" in patch
    res = call(ctx, "apply_patch", patch=patch)
    assert not res.is_error, res.content
    assert (tree / "n.txt").read_text() == "a\nc\n"
    patch = _git_diff("a\nc\n", "a\nd", tmp_path, "n.txt")
    assert not call(ctx, "apply_patch", patch=patch).is_error
    assert (tree / "n.txt").read_text() == "a\nd"


def test_failed_hunk_changes_nothing_and_shows_closest_lines(ctx: ToolContext, tree: Path) -> None:
    before = snapshot(tree)
    patch = (
        "--- /dev/null\n+++ b/engine/new.py\n@@ -0,0 +1 @@\n+x = 1\n"
        "--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-hello\n+goodbye\n"
        "--- a/engine/model.py\n+++ b/engine/model.py\n@@ -8,3 +8,3 @@\n"
        " class Shape:\n"
        "     def __init__(self, title):\n"
        "-        self.title = title\n"
        "+        self.title = title.strip()\n"
    )
    res = call(ctx, "apply_patch", patch=patch)
    assert res.is_error
    assert snapshot(tree) == before  # the first two files were fine, yet nothing was written
    text = res.content
    assert "no file was changed" in text
    assert "engine/model.py: hunk 1" in text
    # the closest real lines of the file, with their line numbers, as difflib ranks them
    assert "closest lines in the file are 8-10" in text
    assert "9\t    def __init__(self, name):" in text
    assert "10\t        self.name = name" in text


def test_line_numbers_copied_from_read_file_get_a_hint(ctx: ToolContext) -> None:
    patch = "engine/model.py\n<<<<<<< SEARCH\n 4\tdef area(r):\n 5\t    return 1\n=======\ndef area(r):\n    return 2\n>>>>>>> REPLACE\n"
    res = call(ctx, "apply_patch", patch=patch)
    assert res.is_error and "line numbers copied from read_file" in res.content


def test_search_replace_blocks(ctx: ToolContext, tree: Path) -> None:
    patch = """engine/model.py
```python
<<<<<<< SEARCH
def area(r):
    return math.pi * r * r
=======
def area(r):
    return math.pi * r**2
>>>>>>> REPLACE
```

```python
<<<<<<< SEARCH
        return f"shape {self.name}"
=======
        return self.name
>>>>>>> REPLACE
```

engine/util.py
```python
<<<<<<< SEARCH
=======
def clamp(x, lo, hi):
    return max(lo, min(hi, x))
>>>>>>> REPLACE
```
"""
    res = call(ctx, "apply_patch", patch=patch)
    assert not res.is_error, res.content
    expected = MODEL_PY.replace("r * r", "r**2").replace('f"shape {self.name}"', "self.name")
    assert (tree / "engine" / "model.py").read_text() == expected
    assert (tree / "engine" / "util.py").read_text() == "def clamp(x, lo, hi):\n    return max(lo, min(hi, x))\n"


def test_search_replace_with_indentation_drift(ctx: ToolContext, tree: Path) -> None:
    patch = "engine/model.py\n<<<<<<< SEARCH\ndef describe(self):\n    return f\"shape {self.name}\"\n=======\ndef describe(self):\n    return self.name\n>>>>>>> REPLACE\n"
    res = call(ctx, "apply_patch", patch=patch)
    assert not res.is_error, res.content
    assert "    def describe(self):\n        return self.name\n" in (tree / "engine" / "model.py").read_text()


def test_ambiguous_search_is_refused(ctx: ToolContext, tree: Path) -> None:
    (tree / "dup.py").write_text("x = 1\ny = 2\nx = 1\n")
    res = call(ctx, "apply_patch", patch="dup.py\n<<<<<<< SEARCH\nx = 1\n=======\nx = 3\n>>>>>>> REPLACE\n")
    assert res.is_error and "2 times" in res.content and "lines 1, 3" in res.content
    assert (tree / "dup.py").read_text() == "x = 1\ny = 2\nx = 1\n"


def test_malformed_search_replace_blocks(ctx: ToolContext) -> None:
    res = call(ctx, "apply_patch", patch="<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n")
    assert res.is_error and "no file path" in res.content
    res = call(ctx, "apply_patch", patch="README.md\n<<<<<<< SEARCH\nhello\n>>>>>>> REPLACE\n")
    assert res.is_error and "=======" in res.content
    res = call(ctx, "apply_patch", patch="README.md\n<<<<<<< SEARCH\nhello\n=======\nbye\n")
    assert res.is_error and "REPLACE" in res.content


def test_openai_envelope(ctx: ToolContext, tree: Path) -> None:
    patch = """*** Begin Patch
*** Update File: engine/model.py
@@ class Shape:
     def describe(self):
-        return f"shape {self.name}"
+        return self.name
*** Add File: engine/extra.py
+VALUE = 3
*** Delete File: README.md
*** End Patch"""
    res = call(ctx, "apply_patch", patch=patch)
    assert not res.is_error, res.content
    assert (tree / "engine" / "model.py").read_text() == MODEL_PY.replace('f"shape {self.name}"', "self.name")
    assert (tree / "engine" / "extra.py").read_text() == "VALUE = 3\n"
    assert not (tree / "README.md").exists()


def test_create_over_existing_and_delete_missing_are_errors(ctx: ToolContext, tree: Path) -> None:
    res = call(ctx, "apply_patch", patch="--- /dev/null\n+++ b/README.md\n@@ -0,0 +1 @@\n+x\n")
    assert res.is_error and "already exists" in res.content
    res = call(ctx, "apply_patch", patch="--- a/nope.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n")
    assert res.is_error and "no such file" in res.content
    res = call(ctx, "apply_patch", patch="--- a/nope.txt\n+++ b/nope.txt\n@@ -1 +1 @@\n-x\n+y\n")
    assert res.is_error and "no such file" in res.content


@pytest.mark.parametrize("junk", ["", "   ", "just some prose", "@@ -1 +1 @@\n-a\n+b\n"])
def test_unusable_patches_are_errors(ctx: ToolContext, tree: Path, junk: str) -> None:
    before = snapshot(tree)
    res = call(ctx, "apply_patch", patch=junk)
    assert res.is_error
    assert snapshot(tree) == before


def test_two_hunks_in_one_file_apply_in_order(ctx: ToolContext, tree: Path, tmp_path: Path) -> None:
    old = "".join(f"{i}\n" for i in range(40))
    new = old.replace("5\n", "five\n", 1).replace("30\n", "thirty\nthirty-one\n", 1)
    (tree / "nums.txt").write_text(old)
    patch = _git_diff(old, new, tmp_path, "nums.txt")
    assert patch.count("@@ -") == 2
    assert not call(ctx, "apply_patch", patch=patch).is_error
    assert (tree / "nums.txt").read_text() == new


def test_executable_bit_survives_a_patch(ctx: ToolContext, tree: Path) -> None:
    script = tree / "run.sh"
    script.write_text("#!/bin/sh\necho a\n")
    script.chmod(0o755)
    assert not call(ctx, "apply_patch", patch="run.sh\n<<<<<<< SEARCH\necho a\n=======\necho b\n>>>>>>> REPLACE\n").is_error
    assert script.stat().st_mode & 0o777 == 0o755
    assert script.read_text() == "#!/bin/sh\necho b\n"


@pytest.mark.parametrize(
    "old_header,new_header",
    [("a/README.md", "b/README.md"), ("README.md", "README.md"), ("a/README.md", "README.md"), ("README.md", "b/README.md")],
)
def test_header_path_prefixes(ctx: ToolContext, tree: Path, old_header: str, new_header: str) -> None:
    patch = f"--- {old_header}\t2024-01-01 10:00:00\n+++ {new_header}\n@@ -1 +1 @@\n-hello\n+bye\n"
    res = call(ctx, "apply_patch", patch=patch)
    assert not res.is_error, res.content
    assert (tree / "README.md").read_text() == "bye\n"
