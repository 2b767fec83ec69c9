"""The judge imports nothing an agent can edit (docs/architecture.md): a candidate's code must never run inside the
process that decides its verdict. Every import of every module under harness/judge/ and, transitively, of every
harness module those import, read with `ast` (function-local imports and `importlib` calls with a literal name
included), against the packages a milestone can make editable."""

import ast
import os
import subprocess
import sys
from pathlib import Path

__all__: list[str] = []

REPO = Path(__file__).resolve().parents[2]
EDITABLE_PACKAGES = ("engine", "tests", "bench")  # engine/** and new tests/**; bench/ is not the judge's either


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))  # `from harness import settings` also reaches harness.settings:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            found.append((node.lineno, str(node.args[0].value)))
    return found


def _module_file(name: str) -> Path | None:
    base = REPO.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def test_no_judge_module_imports_agent_editable_code() -> None:
    todo = sorted((REPO / "harness" / "judge").rglob("*.py"))
    assert len(todo) > 10
    seen: set[Path] = set()
    bad = []
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for line, name in _imports(path):
            if name.split(".")[0] in EDITABLE_PACKAGES:
                bad.append(f"{path.relative_to(REPO)}:{line}: imports {name}")
            elif name.startswith(("harness.", "guards.")) and (target := _module_file(name)) is not None:
                todo.append(target)
    assert bad == []
    assert REPO / "harness" / "jobs" / "process.py" in seen  # the walk does follow the judge's own imports


def test_the_check_sees_a_function_local_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import os\n\ndef f():\n    from engine import config\n    import importlib\n"
                      "    return importlib.import_module('tests.x')\n")
    assert [name for _, name in _imports(sample)] == ["os", "engine", "engine.config", "importlib", "tests.x"]


def test_a_judging_imports_torch_only_when_it_runs_a_job() -> None:
    """The judge's pipeline (harness/judge/gates/__init__.py) imports the job and metrics gates, the train-claim checks
    and torch (2 s) when a job first runs: a judging that ends before its jobs (a refused patch, a failed test) never
    pays for it. Both gates still run: `RUNS` holds each kind."""
    code = ("import sys; import harness.gate, harness.judge.runner, harness.report; "
            "from harness.judge.gates import RUNS; "
            "print(sorted(RUNS), sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split("\n")[0] == "['guards', 'job', 'metrics', 'protected', 'pytest'] []", out.stdout + out.stderr
