"""The judge compiles the judged checkout itself (harness/judge/bytecode.py): what stood in `__pycache__` before is
gone, every module gets the bytecode Python would write for it, and a module that does not compile stops nothing."""

import importlib.util
import marshal
import subprocess
import sys
from pathlib import Path

from harness.judge.bytecode import precompile

__all__: list[str] = []


def test_precompile_replaces_planted_bytecode_and_compiles_every_module(tmp_path: Path) -> None:
    tree = tmp_path / "repo"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "__init__.py").write_text("")
    (tree / "pkg" / "mod.py").write_text("VALUE = 'source'\n")
    (tree / "pkg" / "broken.py").write_text("def (:\n")
    (tree / ".git" / "x").mkdir(parents=True)
    (tree / ".git" / "x" / "hook.py").write_text("A = 1\n")
    planted = Path(importlib.util.cache_from_source(str(tree / "pkg" / "mod.py")))
    planted.parent.mkdir()
    # A .pyc whose header matches the source (mtime and size) but whose code says otherwise: Python would load it.
    source = (tree / "pkg" / "mod.py").stat()
    header = importlib.util.MAGIC_NUMBER + b"\0\0\0\0" + int(source.st_mtime).to_bytes(4, "little") + \
        (source.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    planted.write_bytes(header + marshal.dumps(compile("VALUE = 'planted'\n", str(tree / "pkg" / "mod.py"), "exec")))
    stray = tree / "pkg" / "__pycache__" / "gone.cpython-311.pyc"
    stray.write_bytes(b"stray")

    folders = precompile(tree)

    assert folders == (tree / "pkg" / "__pycache__",)
    assert not stray.exists() and planted.is_file()
    assert not Path(importlib.util.cache_from_source(str(tree / "pkg" / "broken.py"))).exists()
    assert not (tree / ".git" / "x" / "__pycache__").exists()
    loaded = subprocess.run([sys.executable, "-c", "import pkg.mod; print(pkg.mod.VALUE)"], cwd=tree, capture_output=True,
                            text=True, env={"PATH": "/usr/bin:/bin"}, check=True)
    assert loaded.stdout.strip() == "source"
