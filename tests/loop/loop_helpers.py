"""Helpers for the loop tests: a small Temper project in a git repo, trajectories, and `temper` as a
real subprocess.

The project is a copy of the real engine, guards config, prompts and pyproject, with one milestone
(`loop-tiny`: add `inverse_sqrt` to the engine's schedule names) whose gates are protected + guards
+ two pytest tests that import only engine.config, so every judged attempt takes seconds. The harness
that judges is this checkout's (the subprocess runs here), exactly as an installed `temper` would.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.protocol import AgentTurn, ToolCall, Usage

__all__ = [
    "REPO",
    "MILESTONE",
    "edit",
    "GOOD_EDIT",
    "ENV_EDIT",
    "FIX_ENV_EDIT",
    "project_template",
    "home",
    "git",
    "temper",
    "temper_env",
    "turn",
    "write_trajectory",
    "events",
    "run_dirs",
    "tree_fingerprint",
]

REPO = Path(__file__).resolve().parents[2]

MILESTONE = """\
id = "loop-tiny"
title = "Add inverse_sqrt to the engine's schedule names"
goal = "Make `inverse_sqrt` one of `engine.config.LR_SCHEDULES`; keep the other names."
context = [{ path = "engine/config.py", include = true, lines = [33, 33], why = "the schedule names" }]
editable = ["engine/**"]
protected = ["engine/model_spec.toml"]

[[gates]]
kind = "protected"

[[gates]]
kind = "guards"
paths = ["engine"]

[[gates]]
kind = "pytest"
selectors = ["tests/test_names.py"]
min_collected = 2
timeout_s = 120

[budget]
max_turns = 12
max_tokens = 200000
max_cost_usd = 1.0
max_wall_s = 900
max_attempts = 3
"""

# The judge's test process never imports the engine (harness/judge/barrier.py): the test asks a child for the value.
TEST_NAMES = """\
from pathlib import Path

import pytest

from harness.judge.candidate import Candidate


@pytest.fixture(scope="module")
def schedules():
    with Candidate(Path(__file__).resolve().parents[1]) as engine:
        return engine.value("engine.config:LR_SCHEDULES")


def test_inverse_sqrt_is_a_schedule(schedules):
    assert "inverse_sqrt" in schedules


def test_the_old_schedules_stay(schedules):
    assert {"cosine", "wsd", "constant", "linear"} <= set(schedules)
"""

def edit(path: str, *pairs: tuple[str, str]) -> dict[str, str]:
    """`run` arguments that replace each old text of `path` by its new one, as a model edits with the shell."""
    body = "".join(f"assert {old!r} in t\nt = t.replace({old!r}, {new!r}, 1)\n" for old, new in pairs)
    return {"command": f"python - <<'EOF'\nimport pathlib\np = pathlib.Path({path!r})\nt = p.read_text()\n{body}"
                       "p.write_text(t)\nEOF"}


OLD = 'LR_SCHEDULES = ("cosine", "wsd", "constant", "linear")'
NEW = 'LR_SCHEDULES = ("cosine", "wsd", "constant", "linear", "inverse_sqrt")'
ENV = 'LR_SCHEDULES = ("cosine", "wsd", "constant", "linear", os.environ.get("TEMPER_EXTRA_SCHEDULE", "inverse_sqrt"))'
GOOD_EDIT = edit("engine/config.py", (OLD, NEW))
# Attempt that passes the tests but reads the environment outside engine/env.py: the guards gate fails it.
ENV_EDIT = edit("engine/config.py", (OLD, ENV), ("import tomllib\n", "import os\nimport tomllib\n"))
FIX_ENV_EDIT = edit("engine/config.py", (ENV, NEW), ("import os\nimport tomllib\n", "import tomllib\n"))


def git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-c", "user.name=User", "-c", "user.email=user@example.com", *args],
                          cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, f"git {args} failed: {proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="session")
def project_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A committed mini project: the real engine and judge config, the loop-tiny milestone, two tests."""
    root = tmp_path_factory.mktemp("project") / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "engine", root / "engine", ignore=ignore)
    shutil.copytree(REPO / "prompts", root / "prompts", ignore=ignore)
    for name in ("guards.toml", "ENV_WHITELIST.md", "pyproject.toml", "docs/CONVENTIONS.md"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, root / name)
    (root / "milestones").mkdir()
    (root / "milestones" / "loop-tiny.toml").write_text(MILESTONE)
    (root / "tests").mkdir()
    (root / "tests" / "__init__.py").write_text("")
    (root / "tests" / "test_names.py").write_text(TEST_NAMES)
    (root / ".gitignore").write_text("/runs/\n__pycache__/\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "mini project")
    return root


@pytest.fixture
def home(project_template: Path, tmp_path: Path) -> Path:
    """A fresh clone of the mini project: TEMPER_HOME of one test (its runs go to <home>/runs)."""
    target = tmp_path / "home"
    git(tmp_path, "clone", "-q", str(project_template), str(target))
    return target


def temper_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL",
                                                            "OPENAI_BASE_URL", "TEMPER_RUNS_DIR")}
    env.update(TEMPER_HOME=str(home), NO_COLOR="1", **extra)
    return env


def temper(home: Path, *args: str, timeout: float = 300, **extra_env: str) -> subprocess.CompletedProcess[str]:
    """`temper ARGS` as a real process (python -m harness from this checkout), TEMPER_HOME=home."""
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO, env=temper_env(home, **extra_env),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def turn(text: str, *calls: tuple[str, str, dict], stop: str = "tool_use", usage: Usage | None = None) -> AgentTurn:
    return AgentTurn(text=text, tool_calls=tuple(ToolCall(id=i, name=n, arguments=a) for i, n, a in calls),
                     stop_reason=stop, usage=usage or Usage(input_tokens=100, output_tokens=20, cost_usd=0.001),
                     model="scripted")


def write_trajectory(path: Path, turns: list[AgentTurn]) -> Path:
    path.write_text("".join(json.dumps({"type": "turn", **t.to_json()}) + "\n" for t in turns))
    return path


def run_dirs(home: Path) -> list[Path]:
    return sorted(p for p in (home / "runs").iterdir() if (p / "run.json").is_file())


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


def tree_fingerprint(repo: Path) -> dict[str, object]:
    """HEAD, branch, index, status and every file outside .git and runs/: proof the checkout was not touched."""
    files = {p.relative_to(repo).as_posix(): p.read_bytes() for p in sorted(repo.rglob("*"))
             if p.is_file() and p.relative_to(repo).parts[0] not in (".git", "runs")}
    return {"head": git(repo, "rev-parse", "HEAD"), "branch": git(repo, "symbolic-ref", "HEAD"),
            "status": git(repo, "status", "--porcelain", "--untracked-files=all"), "index": git(repo, "ls-files", "-s"),
            "files": files}
