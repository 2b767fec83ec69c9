"""Build every adversarial case's patch (each cheat and each honest twin) against this checkout, apply it to a fresh
clone of the base and py_compile the .py files it touches; no judging. Run after moving or rewriting engine files:
a case whose anchor is gone fails here in minutes, not in the slow judged suite.

    PYTHONPATH=$PWD python scripts/adversarial_builds.py [SUBSTRING]   # only the cases whose id contains it

Prints one line per failure and a count; exit 1 if any failed.
"""

import py_compile
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tests.adversarial.test_adversarial as ta  # noqa: E402
from tests.adversarial.cases import build_patch, git  # noqa: E402


class _TempFactory:  # what the `home` fixture asks of pytest's tmp_path_factory
    def __init__(self, root: Path):
        self.root = root

    def mktemp(self, name: str) -> Path:
        path = self.root / name
        path.mkdir()
        return path


def main() -> int:
    only = sys.argv[1] if len(sys.argv) > 1 else ""
    work = Path(tempfile.mkdtemp(prefix="adversarial-builds-"))
    try:
        home = ta.home.__wrapped__(_TempFactory(work))
        items = [(f"cheat:{c.id}", c.cheat, c.milestone, c.diff_args) for c in ta.ALL_CASES]
        items += [(f"twin:{t}@{m}", ta.TWIN_EDITS[t], m, ()) for t, m in ta.TWINS]
        items = [item for item in items if only in item[0]]
        failures = 0
        for i, (name, edit, milestone, diff_args) in enumerate(items):
            setup = ta._setup(home, milestone)
            try:
                patch = build_patch(home, work / "clones", edit, diff_args=diff_args, setup=setup)
            except AssertionError as e:
                failures += 1
                print(f"BUILD {name}: {str(e)[:300]}")
                continue
            target = work / f"apply-{i}"
            git(work, "clone", "-q", str(home), str(target))
            if setup:
                git(target, "apply", setup)
                git(target, "commit", "-qam", "setup")
            patch_file = work / f"{i}.patch"
            patch_file.write_text(patch, encoding="utf-8", errors="surrogateescape")
            applied = subprocess.run(["git", "apply", str(patch_file)], cwd=target, capture_output=True, text=True)
            if applied.returncode:
                failures += 1
                print(f"APPLY {name}: {applied.stderr[:300]}")
                continue
            for path in sorted(set(re.findall(r"^\+\+\+ b/(\S+\.py)$", patch, re.M))):
                if (target / path).is_file():  # a rename's old side, a planted symlink: nothing to compile
                    try:
                        py_compile.compile(str(target / path), doraise=True)
                    except py_compile.PyCompileError as e:
                        failures += 1
                        print(f"COMPILE {name} {path}: {str(e)[:300]}")
            shutil.rmtree(target)
        print(f"{len(items)} patches built, {failures} failures")
        return 1 if failures else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
