"""The diff policy on real git patches: what a candidate may touch is decided before its code runs.

Each patch is made by `git diff --binary` of an edit in a real repository and read by the judge's
`read_patch` (git's own parser) plus a walk of the checkout after `git apply`, the way the runner does.
"""

import subprocess
from pathlib import Path

import pytest

from harness.judge.policy import changed_files, check_policy, read_patch
from harness.judge.manifests import tree_manifest
from harness.spec import Milestone

__all__: list[str] = []


def git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, capture_output=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.decode("utf-8", "surrogateescape")


MILESTONE = Milestone.model_validate({
    "id": "m", "title": "t", "goal": "g", "editable": ["engine/**"], "binary": ["engine/assets/*.bin"],
    "gates": [{"kind": "protected", "name": "protected"}],
    "budget": {"max_turns": 1, "max_tokens": 1, "max_wall_s": 1, "max_attempts": 1},
})


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for path, text in {"engine/a.py": "A = 1\n", "tests/test_a.py": "def test_a():\n    pass\n", "pyproject.toml": "[x]\n",
                       "engine/assets/keep.txt": "k\n"}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    return root


def judge(repo: Path, tmp_path: Path, edit) -> list[str]:  # noqa: ANN001 -- edit(tree) changes files
    edit(repo)
    git(repo, "add", "-A")
    patch = tmp_path / "c.patch"
    patch.write_bytes(git(repo, "diff", "--cached", "--binary").encode("utf-8", "surrogateescape"))
    git(repo, "reset", "-q", "--hard")
    git(repo, "clean", "-qfdx")
    view = read_patch(repo, patch)
    before = tree_manifest(repo)
    git(repo, "apply", str(patch))
    result = check_policy(MILESTONE, view, changed_files(before, tree_manifest(repo)), repo)
    git(repo, "reset", "-q", "--hard")
    git(repo, "clean", "-qfdx")
    return list(result.violations) + [f"NEW {p}" for p in result.new_tests]


def test_editable_change_passes_and_honest_new_test_is_allowed(repo: Path, tmp_path: Path) -> None:
    def edit(t: Path) -> None:
        (t / "engine/a.py").write_text("A = 2\n")
        (t / "engine/b.py").write_text("B = 1\n")
        (t / "tests/engine").mkdir()
        (t / "tests/engine/test_b.py").write_text("def test_b():\n    pass\n")
    assert judge(repo, tmp_path, edit) == ["NEW tests/engine/test_b.py"]


@pytest.mark.parametrize("path", ["pytest.ini", "conftest.py", "tests/conftest.py", "sitecustomize.py", ".gitattributes",
                                  "tests/helpers.py", "harness/x.py", "engine.pth", "json.py"])
def test_every_new_file_outside_editable_is_refused_by_name(repo: Path, tmp_path: Path, path: str) -> None:
    def edit(t: Path) -> None:
        (t / path).parent.mkdir(parents=True, exist_ok=True)
        (t / path).write_text("x = 1\n")
    [violation] = judge(repo, tmp_path, edit)
    assert violation.startswith(f"{path}: added") and "outside the editable globs" in violation


def test_edits_deletes_and_renames_of_protected_files(repo: Path, tmp_path: Path) -> None:
    found = judge(repo, tmp_path, lambda t: (t / "tests/test_a.py").write_text("def test_a():\n    assert 1\n"))
    assert len(found) == 1 and "tests/test_a.py: changed, a protected file" in found[0]
    found = judge(repo, tmp_path, lambda t: (t / "pyproject.toml").unlink())
    assert len(found) == 1 and found[0].startswith("pyproject.toml: deleted, a protected file")
    found = judge(repo, tmp_path, lambda t: (t / "tests/test_a.py").rename(t / "engine/test_moved.py"))
    assert any(v.startswith("tests/test_a.py: deleted") for v in found)  # the rename's source is named


def test_binary_content_needs_a_binary_glob_and_symlinks_are_refused(repo: Path, tmp_path: Path) -> None:
    found = judge(repo, tmp_path, lambda t: (t / "engine/blob.so").write_bytes(b"\x7fELF\x00\x01\x02"))
    assert len(found) == 1 and "engine/blob.so: binary content" in found[0]
    assert judge(repo, tmp_path, lambda t: (t / "engine/assets/w.bin").write_bytes(b"\x00\x01")) == []
    found = judge(repo, tmp_path, lambda t: (t / "engine/link.py").symlink_to("../tests/test_a.py"))
    assert any("engine/link.py: a symlink" in v for v in found)
    found = judge(repo, tmp_path, lambda t: (t / "tests/engine_test_bin.py").write_bytes(b"\x00"))
    assert any("tests/engine_test_bin.py" in v for v in found)  # not a test_*.py name and binary: refused


def test_a_new_test_file_may_not_be_a_conftest_or_binary(repo: Path, tmp_path: Path) -> None:
    def edit(t: Path) -> None:
        (t / "tests/sub").mkdir()
        (t / "tests/sub/conftest.py").write_text("x = 1\n")
        (t / "tests/sub/test_ok.py").write_text("def test_ok():\n    pass\n")
    found = judge(repo, tmp_path, edit)
    assert "NEW tests/sub/test_ok.py" in found and any(v.startswith("tests/sub/conftest.py: added") for v in found)


def test_a_submodule_entry_is_refused(repo: Path, tmp_path: Path) -> None:
    """A gitlink (mode 160000) under an editable glob names another repository's commit: nothing of it is in the
    patch to judge. git applies it without complaint (an empty folder), so the policy refuses it by its mode."""
    patch = tmp_path / "gitlink.patch"
    patch.write_text("diff --git a/engine/vendored b/engine/vendored\nnew file mode 160000\nindex 0000000..1234567\n"
                     "--- /dev/null\n+++ b/engine/vendored\n@@ -0,0 +1 @@\n"
                     "+Subproject commit 1234567890123456789012345678901234567890\n")
    view = read_patch(repo, patch)
    before = tree_manifest(repo)
    git(repo, "apply", str(patch))
    result = check_policy(MILESTONE, view, changed_files(before, tree_manifest(repo)), repo)
    assert any("submodules are refused" in v and "engine/vendored" in v for v in result.violations), result.violations
