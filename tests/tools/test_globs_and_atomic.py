"""The one glob matcher (harness.globs) as both users see it, and the one atomic writer (harness.atomic)."""

import os
import stat
from pathlib import Path

import pytest

from harness.atomic import write_atomic
from harness.globs import glob_match
from harness.spec import glob_match as spec_glob_match

__all__: list[str] = []

CASES = [  # (pattern, path, judge semantics, tools' directory reading)
    ("engine/**", "engine/a.py", True, True),
    ("engine/**", "engine/ops/attn/k.py", True, True),
    ("engine/**", "engine", False, True),  # "dir/**" names dir itself for the tools only
    ("engine/**", "engineX/a.py", False, False),
    ("engine/*.py", "engine/ops/a.py", False, False),
    ("**/conftest.py", "conftest.py", True, True),
    ("**/conftest.py", "a/b/conftest.py", True, True),
    ("**/conftest.py", "a/b/myconftest.py", False, False),
    ("tests", "tests/a/b.py", False, True),  # a folder glob covers what is below it (tools)
    ("tests/", "tests/a.py", False, True),
    ("engine/**/*.py", "engine/rms.py", True, True),
    ("engine/**/*.py", "engine", False, False),
    ("engine/[!ab].py", "engine/b.py", False, False),
    ("engine/[!ab].py", "engine/c.py", True, True),
    ("engine/[]].py", "engine/].py", True, True),
    ("a?b", "a/b", False, False),  # '?' stays in one segment
    ("a[!x]b", "a/b", False, False),  # so does a negated set
    ("a.b", "axb", False, False),
    ("engine/**", "engine/a\nb.py", True, True),
]


@pytest.mark.parametrize(("pattern", "path", "judge", "tools"), CASES)
def test_one_matcher_two_readings(pattern: str, path: str, judge: bool, tools: bool) -> None:
    assert glob_match(pattern, path) is judge
    assert spec_glob_match(pattern, path) is judge  # the spec's name is the same function
    assert glob_match(pattern, path, tree=True) is tools
    if judge:
        assert tools, "the tools' reading may only be wider than the judge's"


def test_spec_reexports_the_one_matcher() -> None:
    assert spec_glob_match is glob_match


def test_write_atomic_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    write_atomic(target, "one")
    write_atomic(target, b"two")
    assert target.read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 & ~_umask()


def test_write_atomic_keeps_mode_and_creates_parents(tmp_path: Path) -> None:
    script = tmp_path / "a" / "b" / "x.sh"
    write_atomic(script, "#!/bin/sh\n", mode=0o666, keep_mode=True, mkdir=True)
    assert stat.S_IMODE(script.stat().st_mode) == 0o666 & ~_umask()
    os.chmod(script, 0o751)
    write_atomic(script, "#!/bin/sh\necho\n", mode=0o666, keep_mode=True)
    assert stat.S_IMODE(script.stat().st_mode) == 0o751 and script.read_text().endswith("echo\n")


def test_write_atomic_failure_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "keep.txt"
    target.write_text("old")

    def boom(*_a: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, "new")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_every_user_of_the_writer_still_writes(tmp_path: Path) -> None:
    from harness.jobs.slurm import SlurmJob  # noqa: F401  (imports cleanly without its own writer)
    from harness.records import write_atomic as records_write_atomic

    assert records_write_atomic is write_atomic


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
