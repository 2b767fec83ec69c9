"""Robustness: the whole installed torch package is checked without a crash (findings are expected)."""

import ast
import json
import os
from pathlib import Path

import pytest
import torch
from guards_testkit import REPO, run_cli


@pytest.mark.slow
def test_whole_torch_package_does_not_crash():
    torch_dir = Path(os.path.dirname(torch.__file__))
    proc = run_cli(["check", str(torch_dir), "--format", "json", "--config", str(REPO / "guards.toml")], cwd=REPO)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 1, proc.stderr[-3000:]
    findings = json.loads(proc.stdout)
    rules = {f["rule"] for f in findings}
    # torch reads its environment everywhere, swallows exceptions in places, and has no __all__ in many modules
    assert {"ssot", "fail-fast", "public-surface", "dag"} <= rules
    # Every parse-error must be a file the interpreter's own parser rejects too (independent check).
    for finding in (f for f in findings if f["rule"] == "parse-error"):
        with pytest.raises((SyntaxError, ValueError)):
            ast.parse(Path(finding["path"]).read_bytes())
    assert all(f["line"] >= 1 and f["col"] >= 1 and f["message"] for f in findings)
