"""Shared fixtures of the data tests: where ../shared/data is, and small real inputs from it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _shared_data() -> Path | None:
    """../shared/data beside the checkout (CI clones the repo with shared/ next to it). In a git
    worktree, also beside the main checkout the worktree belongs to."""
    candidates = [REPO / ".." / "shared" / "data"]
    git = REPO / ".git"
    if git.is_file() and git.read_text().startswith("gitdir:"):
        gitdir = Path(git.read_text().split(":", 1)[1].strip())  # <main>/.git/worktrees/<name>
        candidates.append(gitdir.parents[2] / ".." / "shared" / "data")
    for c in candidates:
        if (c / "corpus").is_dir() and (c / "tokenizers" / "minicpm4").is_dir():
            return c.resolve()
    return None


SHARED_DATA = _shared_data()
needs_shared = pytest.mark.skipif(SHARED_DATA is None, reason="../shared/data (MiniCPM4 tokenizer + corpus) is not beside this checkout")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if SHARED_DATA is None:
        pytest.skip("../shared/data (MiniCPM4 tokenizer + corpus) is not beside this checkout")
    return SHARED_DATA


@pytest.fixture(scope="session")
def minicpm_dir(shared_data: Path) -> Path:
    return shared_data / "tokenizers" / "minicpm4"


@pytest.fixture(scope="session")
def validation_records(shared_data: Path) -> list[dict]:
    pq = pytest.importorskip("pyarrow.parquet")
    return pq.read_table(shared_data / "corpus" / "validation-00000-of-00001.parquet").to_pylist()


@pytest.fixture(scope="session")
def validation_texts(validation_records: list[dict]) -> list[str]:
    """Whole validation records, in order, up to ~300 KB: both books (Doyle's stories first, then
    Darwin's short front matter), so prose, dialogue, quotes and dashes are all exercised."""
    texts, total = [], 0
    by_book: dict[str, list[str]] = {}
    for r in validation_records:
        by_book.setdefault(r["title"], []).append(r["text"])
    for book in by_book.values():
        used = 0
        for text in sorted(book, key=len):
            n = len(text.encode())
            if used + n > 150_000:
                break
            texts.append(text)
            used += n
        total += used
    assert 200_000 < total <= 300_000, total
    return texts


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path


@pytest.fixture
def write_jsonl():
    return _write_jsonl


@pytest.fixture
def jsonl_records() -> list[dict]:
    """Small records with a title and a body; one has a None body and one an empty body."""
    return [
        {"title": "One", "text": "The first document.\nIt has two lines.", "n": 1},
        {"title": "Two", "text": "Zweites Dokument — mit Umlauten: äöü, und “Anführungszeichen”.", "n": 2},
        {"title": "Three", "text": "", "n": 3},
        {"title": "Four", "text": None, "n": 4},
        {"title": "Five", "text": "🙂 emoji and CJK 中文 close the set.", "n": 5},
    ]


def _run_python(code: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """A fresh interpreter in the repo root (so `engine` imports from this checkout)."""
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def run_python():
    return _run_python
