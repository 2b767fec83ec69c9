"""Helpers for the workspace tests: a user's repository in a tmp dir and a way to fingerprint its
checkout (HEAD, branch, index, status, every file) to prove it was not touched."""

import hashlib
import subprocess
from pathlib import Path

import pytest

__all__ = ["git", "user_repo", "make_dirty", "fingerprint", "write"]


def git(cwd: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(
        ["git", "-c", "user.name=User", "-c", "user.email=user@example.com", *args],
        cwd=cwd, capture_output=True, text=True,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"git {args} failed: {proc.stderr}")
    return proc.stdout


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def user_repo(tmp_path: Path) -> Path:
    """A checkout on branch 'main' with two commits, a .gitignore, and (like a real user's) an
    uncommitted edit, a staged edit and an untracked file."""
    repo = tmp_path / "user"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write(repo / ".gitignore", "runs/\n__pycache__/\n")
    write(repo / "engine" / "model.py", "def f():\n    return 1\n")
    write(repo / "tests" / "test_f.py", "def test_f():\n    assert True\n")
    write(repo / "README.md", "readme\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    write(repo / "engine" / "util.py", "X = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "second")
    return repo


def make_dirty(repo: Path) -> None:
    write(repo / "README.md", "readme edited by the user\n")
    write(repo / "engine" / "util.py", "X = 2\n")
    git(repo, "add", "engine/util.py")
    write(repo / "notes.txt", "user's scratch notes\n")


def fingerprint(repo: Path) -> dict[str, object]:
    files = {}
    for p in sorted(repo.rglob("*")):
        rel = p.relative_to(repo)
        if rel.parts[0] in (".git", "runs") or not p.is_file():  # runs/ holds the harness's records
            continue
        files[rel.as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return {
        "head": git(repo, "rev-parse", "HEAD"),
        "branch": git(repo, "symbolic-ref", "HEAD"),
        "status": git(repo, "status", "--porcelain=v1", "--untracked-files=all"),
        "index": git(repo, "ls-files", "-s"),
        "staged": git(repo, "diff", "--cached"),
        "unstaged": git(repo, "diff"),
        "files": files,
    }
