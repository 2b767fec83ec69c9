"""Workspace: one worktree and branch per run, one commit per attempt with trailers, diffs that
include untracked files, merges only into a clean checkout, scratch worktrees that always go away.
Everything runs real git in tmp dirs."""

import os
import re
import subprocess
from pathlib import Path

import pytest

from harness.workspace import TRAILER_KEYS, Workspace, WorkspaceError
from tests.workspace.workspace_helpers import fingerprint, git, make_dirty, write


def changed(diff: str) -> list[str]:
    """The paths a diff touches (its `diff --git a/P b/P` headers)."""
    return sorted(re.findall(r"^diff --git a/(\S+) b/", diff, flags=re.M))


def _attempt(ws: Workspace, n: int, verdict: str = "rejected", mfu: float | None = 0.41234) -> str:
    return ws.commit_attempt(n, milestone="m01-norm", run_id=ws.run_id, verdict=verdict, mfu=mfu, message=f"attempt {n}")


@pytest.mark.parametrize("inside", [False, True], ids=["runs-outside", "runs-inside-ignored"])
def test_the_users_checkout_is_untouched_by_a_whole_run(user_repo: Path, tmp_path: Path, inside: bool) -> None:
    make_dirty(user_repo)
    before = fingerprint(user_repo)
    root = user_repo / "runs" if inside else tmp_path / "runs"  # runs/ is git-ignored, as in Temper
    ws = Workspace.create(user_repo, base="HEAD", run_id="r1", root=root)
    write(ws.worktree / "engine" / "model.py", "def f():\n    return 2\n")
    write(ws.worktree / "engine" / "new_op.py", "Y = 1\n")
    (ws.worktree / "README.md").unlink()
    _attempt(ws, 1)
    ws.diff()
    _attempt(ws, 2, verdict="accepted")
    ws.history()
    with Workspace.scratch(user_repo, "HEAD") as scratch:
        write(scratch.worktree / "x.txt", "x\n")
    ws.remove()
    assert fingerprint(user_repo) == before
    assert git(user_repo, "rev-parse", "temper/r1")  # the run's history stays on its branch


def test_create_makes_branch_and_worktree_at_base(user_repo: Path, tmp_path: Path) -> None:
    first = git(user_repo, "rev-parse", "HEAD~1").strip()
    ws = Workspace.create(user_repo, base="HEAD~1", run_id="r1", root=tmp_path / "runs")
    assert ws.worktree == (tmp_path / "runs" / "r1" / "worktree").resolve()
    assert ws.base == first and ws.branch == "temper/r1" and ws.head() == first
    assert git(ws.worktree, "symbolic-ref", "HEAD").strip() == "refs/heads/temper/r1"
    assert (ws.worktree / "engine" / "model.py").exists() and not (ws.worktree / "engine" / "util.py").exists()
    assert str(ws.worktree) in git(user_repo, "worktree", "list")


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        ({"base": "no-such-branch", "run_id": "r2"}, "is not a commit"),
        ({"base": "HEAD", "run_id": "a/b"}, "one non-empty path segment"),
        ({"base": "HEAD", "run_id": "bad..name"}, "cannot be part of a git branch name"),
        ({"base": "HEAD", "run_id": "r1"}, "already exists"),
    ],
)
def test_create_refuses_bad_input(user_repo: Path, tmp_path: Path, kwargs: dict, fragment: str) -> None:
    Workspace.create(user_repo, base="HEAD", run_id="r1", root=tmp_path / "runs")
    with pytest.raises(WorkspaceError, match=fragment):
        Workspace.create(user_repo, root=tmp_path / "runs", **kwargs)


def test_not_a_repository(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceError, match="not inside a git repository"):
        Workspace.create(tmp_path, base="HEAD", run_id="r1", root=tmp_path / "runs")


def test_commit_per_attempt_with_parseable_trailers(user_repo: Path, tmp_path: Path) -> None:
    ws = Workspace.create(user_repo, base="HEAD", run_id="r1", root=tmp_path / "runs")
    write(ws.worktree / "engine" / "new_op.py", "Y = 1\n")
    write(ws.worktree / "__pycache__" / "junk.pyc", "ignored\n")
    sha1 = ws.commit_attempt(1, milestone="m01-norm", run_id="r1", verdict="rejected", mfu=0.412345,
                             message="Fuse the norm\n\n# Why\nfewer launches")
    sha2 = ws.commit_attempt(2, milestone="m01-norm", run_id="r1", verdict="accepted", mfu=None, message="")
    assert git(ws.worktree, "rev-list", "--count", f"{ws.base}..HEAD").strip() == "2"
    assert git(ws.worktree, "rev-parse", "HEAD~1").strip() == sha1 and ws.head() == sha2
    assert git(ws.worktree, "show", "--name-only", "--format=", sha1).split() == ["engine/new_op.py"]
    assert git(ws.worktree, "show", "--name-only", "--format=", sha2).split() == []  # empty attempt
    # git's own trailer parser reads them back
    raw = git(ws.worktree, "log", "-1", "--format=%(trailers:only,unfold)", sha1)
    parsed = dict(line.split(": ", 1) for line in raw.strip().splitlines())
    assert parsed == {"Milestone": "m01-norm", "Run": "r1", "Attempt": "1", "Verdict": "rejected", "MFU": "0.4123"}
    assert list(parsed) == list(TRAILER_KEYS)
    assert git(ws.worktree, "log", "-1", "--format=%(trailers:key=Verdict,valueonly)", sha2).strip() == "accepted"
    assert git(ws.worktree, "log", "-1", "--format=%(trailers:key=MFU,valueonly)", sha2).strip() == "n/a"
    assert "# Why" in git(ws.worktree, "log", "-1", "--format=%B", sha1)  # '#' lines are not comments here
    assert [t["Attempt"] for _, t in ws.history()] == ["1", "2"]
    assert [s for s, _ in ws.history()] == [sha1, sha2]


def test_trailer_values_must_be_one_line(user_repo: Path, tmp_path: Path) -> None:
    ws = Workspace.create(user_repo, base="HEAD", run_id="r1", root=tmp_path / "runs")
    with pytest.raises(ValueError, match="verdict"):
        ws.commit_attempt(1, milestone="m", run_id="r1", verdict="accepted\nVerdict: forged", mfu=None, message="x")


def test_user_hooks_do_not_run(user_repo: Path, tmp_path: Path) -> None:
    hook = user_repo / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\necho ran > \"$(git rev-parse --show-toplevel)/hook-ran\"\nexit 1\n")
    hook.chmod(0o755)
    ws = Workspace.create(user_repo, base="HEAD", run_id="r1", root=tmp_path / "runs")
    _attempt(ws, 1)
    assert not (ws.worktree / "hook-ran").exists()


def test_diff_includes_untracked_files_and_round_trips(user_repo: Path, tmp_path: Path) -> None:
    ws = Workspace.create(user_repo, base="HEAD", run_id="r1", root=tmp_path / "runs")
    write(ws.worktree / "engine" / "model.py", "def f():\n    return 2\n")
    _attempt(ws, 1)
    write(ws.worktree / "engine" / "brand_new.py", "Z = 3\n")  # untracked, never committed
    (ws.worktree / "blob.bin").write_bytes(bytes(range(256)))
    (ws.worktree / "README.md").unlink()
    write(ws.worktree / "__pycache__" / "c.pyc", "ignored\n")
    index_before = git(ws.worktree, "ls-files", "-s")
    diff = ws.diff()
    assert "+++ b/engine/brand_new.py" in diff and "+Z = 3" in diff
    assert "-    return 1" in diff and "+    return 2" in diff
    assert "+++ /dev/null" in diff and "GIT binary patch" in diff and "__pycache__" not in diff
    assert changed(diff) == ["README.md", "blob.bin", "engine/brand_new.py", "engine/model.py"]
    assert git(ws.worktree, "ls-files", "-s") == index_before  # the real index was not used
    assert "engine/brand_new.py" in git(ws.worktree, "status", "--porcelain")  # still untracked
    # Reference: the diff applied to a fresh copy of the base reproduces the worktree exactly.
    patch = tmp_path / "attempt.diff"
    patch.write_text(diff)
    with Workspace.scratch(user_repo, ws.base) as scratch:
        scratch.apply_patch_file(patch)
        for rel in ("engine/model.py", "engine/brand_new.py", "blob.bin"):
            assert (scratch.worktree / rel).read_bytes() == (ws.worktree / rel).read_bytes(), rel
        assert not (scratch.worktree / "README.md").exists()
    assert ws.diff(base="HEAD").count("diff --git ") == 3  # vs the last attempt: model.py is committed


def test_patch_that_does_not_apply_is_a_clear_error_and_changes_nothing(user_repo: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.diff"
    bad.write_text(
        "--- a/engine/model.py\n+++ b/engine/model.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 99\n+    return 3\n"
        "--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-readme\n+changed\n"
    )
    with Workspace.scratch(user_repo, "HEAD") as scratch:
        with pytest.raises(WorkspaceError, match="does not apply") as err:
            scratch.apply_patch_file(bad)
        assert "engine/model.py" in str(err.value)
        assert (scratch.worktree / "README.md").read_text() == "readme\n"  # all or nothing
        with pytest.raises(WorkspaceError, match="does not exist"):
            scratch.apply_patch_file(tmp_path / "missing.diff")
        empty = tmp_path / "empty.diff"
        empty.write_text("")
        with pytest.raises(WorkspaceError, match="does not apply"):
            scratch.apply_patch_file(empty)


def test_scratch_cleans_up_even_when_the_body_raises(user_repo: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with Workspace.scratch(user_repo, "HEAD~1") as scratch:
            path = scratch.worktree
            assert scratch.branch is None and (path / "engine" / "model.py").exists()
            write(path / "dirty.txt", "uncommitted\n")
            raise RuntimeError("boom")
    assert not path.exists() and not path.parent.exists()
    assert str(path) not in git(user_repo, "worktree", "list")
    assert git(user_repo, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_scratch_removes_a_worktree_whose_add_was_cut_short(user_repo: Path) -> None:
    # A signal while `git worktree add` runs kills git (subprocess.run does) and leaves the entry locked
    # ("initializing"), which `git worktree prune` skips: the CI run of the SIGTERM test in tests/loop/test_loop_gates.py
    # left one so. The lock git leaves is planted here, deterministically.
    with pytest.raises(KeyboardInterrupt):
        with Workspace.scratch(user_repo, "HEAD") as scratch:
            path = scratch.worktree
            git(user_repo, "worktree", "lock", "--reason", "initializing", str(path))
            raise KeyboardInterrupt
    assert not path.parent.exists()
    assert git(user_repo, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_open_resumes_and_recreates_a_deleted_worktree(user_repo: Path, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    ws = Workspace.create(user_repo, base="HEAD", run_id="r1", root=root)
    write(ws.worktree / "a.txt", "kept\n")
    sha = _attempt(ws, 1)
    again = Workspace.open(user_repo, run_id="r1", root=root)
    assert again == ws
    ws.remove()
    assert not ws.worktree.exists()
    revived = Workspace.open(user_repo, run_id="r1", root=root)
    assert revived.head() == sha and (revived.worktree / "a.txt").read_text() == "kept\n"
    assert revived.base == ws.base
    with pytest.raises(WorkspaceError, match="no workspace record"):
        Workspace.open(user_repo, run_id="r9", root=root)


def test_remove_keeps_the_branch_unless_asked(user_repo: Path, tmp_path: Path) -> None:
    ws = Workspace.create(user_repo, base="HEAD", run_id="r1", root=tmp_path / "runs")
    write(ws.worktree / "dirty.txt", "x\n")
    ws.remove()
    assert not ws.worktree.exists() and git(user_repo, "branch", "--list", "temper/r1").strip()
    ws2 = Workspace.create(user_repo, base="HEAD", run_id="r2", root=tmp_path / "runs")
    ws2.remove(delete_branch=True)
    assert not git(user_repo, "branch", "--list", "temper/r2").strip()


def test_merge_fast_forwards_a_clean_checkout(user_repo: Path, tmp_path: Path) -> None:
    ws = Workspace.create(user_repo, base="HEAD", run_id="r1", root=tmp_path / "runs")
    write(ws.worktree / "engine" / "model.py", "def f():\n    return 2\n")
    sha = _attempt(ws, 1, verdict="accepted")
    new_head = ws.merge_into_user(user_repo)
    assert new_head == sha == git(user_repo, "rev-parse", "main").strip()
    assert (user_repo / "engine" / "model.py").read_text() == "def f():\n    return 2\n"
    assert git(user_repo, "status", "--porcelain") == ""


def test_merge_makes_a_merge_commit_when_the_user_moved_on(user_repo: Path, tmp_path: Path) -> None:
    ws = Workspace.create(user_repo, base="HEAD", run_id="r1", root=tmp_path / "runs")
    write(ws.worktree / "engine" / "model.py", "def f():\n    return 2\n")
    sha = _attempt(ws, 1, verdict="accepted")
    write(user_repo / "docs.md", "user work\n")
    git(user_repo, "add", "docs.md")
    git(user_repo, "commit", "-q", "-m", "user commit")
    user_tip = git(user_repo, "rev-parse", "HEAD").strip()
    merged = ws.merge_into_user(user_repo)
    parents = git(user_repo, "rev-list", "--parents", "-n1", merged).split()[1:]
    assert parents == [user_tip, sha]
    assert (user_repo / "docs.md").exists() and "return 2" in (user_repo / "engine" / "model.py").read_text()


def test_merge_refuses_a_dirty_checkout_and_changes_nothing(user_repo: Path, tmp_path: Path) -> None:
    ws = Workspace.create(user_repo, base="HEAD", run_id="r1", root=tmp_path / "runs")
    write(ws.worktree / "engine" / "model.py", "def f():\n    return 2\n")
    _attempt(ws, 1, verdict="accepted")
    make_dirty(user_repo)
    before = fingerprint(user_repo)
    with pytest.raises(WorkspaceError, match="uncommitted changes") as err:
        ws.merge_into_user(user_repo)
    assert "README.md" in str(err.value) and "commit or stash" in str(err.value)
    assert fingerprint(user_repo) == before


def test_merge_conflict_is_aborted(user_repo: Path, tmp_path: Path) -> None:
    ws = Workspace.create(user_repo, base="HEAD", run_id="r1", root=tmp_path / "runs")
    write(ws.worktree / "engine" / "model.py", "def f():\n    return 2\n")
    _attempt(ws, 1, verdict="accepted")
    write(user_repo / "engine" / "model.py", "def f():\n    return 3\n")
    git(user_repo, "commit", "-q", "-am", "user edit")
    before = fingerprint(user_repo)
    with pytest.raises(WorkspaceError, match="conflicts in engine/model.py"):
        ws.merge_into_user(user_repo)
    assert fingerprint(user_repo) == before
    assert not (user_repo / ".git" / "MERGE_HEAD").exists()


def test_merge_refuses_detached_head_and_foreign_repos(user_repo: Path, tmp_path: Path) -> None:
    ws = Workspace.create(user_repo, base="HEAD", run_id="r1", root=tmp_path / "runs")
    _attempt(ws, 1, verdict="accepted")
    git(user_repo, "checkout", "-q", "--detach")
    with pytest.raises(WorkspaceError, match="detached HEAD"):
        ws.merge_into_user(user_repo)
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q")
    git(other, "commit", "-q", "--allow-empty", "-m", "x")
    with pytest.raises(WorkspaceError, match="not a checkout of the repository"):
        ws.merge_into_user(other)


def test_git_version_is_recent_enough_for_trailer_formats() -> None:
    out = subprocess.run(["git", "--version"], capture_output=True, text=True, check=True).stdout
    major, minor = (int(x) for x in out.split()[2].split(".")[:2])
    assert (major, minor) >= (2, 22)  # %(trailers:key=...,valueonly) in these tests


def test_merge_commit_without_a_configured_identity(user_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A CI box with no git identity at all: the merge still works, signed by Temper.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(var, raising=False)
    ws = Workspace.create(user_repo, base="HEAD", run_id="r1", root=tmp_path / "runs")
    write(ws.worktree / "new.txt", "agent\n")
    _attempt(ws, 1, verdict="accepted")
    write(user_repo / "docs.md", "user work\n")
    git(user_repo, "add", "docs.md")
    git(user_repo, "commit", "-q", "-m", "user commit")
    merged = ws.merge_into_user(user_repo)
    assert git(user_repo, "log", "-1", "--format=%an <%ae>|%s", merged).strip() == (
        "Temper <temper@localhost>|Merge temper/r1 (Temper run r1)"
    )
    git(user_repo, "config", "user.email", "me@example.com")
    git(user_repo, "config", "user.name", "Me")
    ws2 = Workspace.create(user_repo, base="HEAD~1", run_id="r2", root=tmp_path / "runs")
    write(ws2.worktree / "other.txt", "agent\n")
    _attempt(ws2, 1, verdict="accepted")
    merged2 = ws2.merge_into_user(user_repo)
    assert git(user_repo, "log", "-1", "--format=%an <%ae>", merged2).strip() == "Me <me@example.com>"


def test_a_same_size_edit_in_the_checkouts_clock_tick_is_in_the_diff(user_repo: Path, tmp_path: Path) -> None:
    """An edit that keeps a file's size, made within the clock tick in which the checkout wrote it, leaves the stat
    data git recorded; only git's racy-entry rule (an entry not older than the index file means: compare content)
    tells it apart. The diff's private copy of the index must keep the index's mtime for that rule to hold. Here
    the tick is an hour ago and exact (file, entry and index share one mtime; ctime, which utime cannot set, is not
    trusted); a loaded machine hit it by chance about 1 run in 150 (CI of stop 40)."""
    git(user_repo, "config", "core.trustctime", "false")
    ws = Workspace.create(user_repo, base="HEAD", run_id="r1", root=tmp_path / "runs")
    target = ws.worktree / "engine" / "model.py"
    tick = target.stat().st_mtime_ns - 3600 * 10**9
    os.utime(target, ns=(tick, tick))
    git(ws.worktree, "update-index", "--refresh")  # the entry now records the tick
    write(target, target.read_text().replace("1", "7"))  # same size, same inode
    os.utime(target, ns=(tick, tick))
    index = Path(git(ws.worktree, "rev-parse", "--path-format=absolute", "--git-path", "index").strip())
    os.utime(index, ns=(tick, tick))  # the index was written in that tick too
    assert changed(ws.diff()) == ["engine/model.py"] and "+    return 7" in ws.diff()
    assert git(ws.worktree, "status", "--porcelain").split() == ["M", "engine/model.py"]  # as git itself sees it


def test_held_out_milestone_material_never_reaches_the_agents_worktree(user_repo: Path, tmp_path: Path) -> None:
    """milestones/<id>/hidden/ (held-out acceptance tests) is left out of the agent's worktree by a sparse
    checkout of that worktree alone: not on disk, not 'deleted' in the agent's diff, still in the user's checkout."""
    write(user_repo / "milestones" / "m" / "hidden" / "tests" / "test_secret.py", "def test_s():\n    assert 1\n")
    write(user_repo / "milestones" / "m.toml", "id = 'm'\n")
    git(user_repo, "add", "-A")
    git(user_repo, "commit", "-q", "-m", "held-out test")
    ws = Workspace.create(user_repo, base="HEAD", run_id="r1", root=tmp_path / "runs")
    assert not (ws.worktree / "milestones" / "m" / "hidden").exists()
    assert (ws.worktree / "milestones" / "m.toml").is_file() and (ws.worktree / "engine" / "model.py").is_file()
    write(ws.worktree / "engine" / "model.py", "def f():\n    return 3\n")
    assert changed(ws.diff()) == ["engine/model.py"] and "test_secret" not in ws.diff()
    assert (user_repo / "milestones" / "m" / "hidden" / "tests" / "test_secret.py").is_file()
    ws.remove()
    reopened = Workspace.open(user_repo, run_id="r1", root=tmp_path / "runs")  # re-created from the branch
    assert not (reopened.worktree / "milestones" / "m" / "hidden").exists()
