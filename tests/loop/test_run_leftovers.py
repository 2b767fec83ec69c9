"""What runs leave in the user's repository: a run refused or failed before it did any work leaves nothing
(no `temper/<id>` branch, no worktree, no row in `temper runs`); `temper runs --prune` removes the worktrees and
branches of finished runs and says so. Real git, real `temper` processes."""

import socket
import stat
from pathlib import Path

from tests.loop.loop_helpers import events, git, run_dirs, temper, turn, write_trajectory

__all__: list[str] = []

GPU_MILESTONE = """\
id = "gpu-tiny"
title = "Needs a GPU this machine lacks"
goal = "Nothing: the judge refuses before any gate runs."
editable = ["engine/**"]

[requires]
device = "cuda"
gpus = 8

[[gates]]
kind = "protected"

[budget]
max_turns = 2
max_tokens = 1000
max_cost_usd = 0.1
max_wall_s = 60
max_attempts = 1
"""


def leftovers(home: Path) -> tuple[str, str, list[Path]]:
    """The temper/* branches, the registered worktrees besides the checkout, and the run records."""
    branches = git(home, "branch", "--list", "temper/*").strip()
    trees = [line for line in git(home, "worktree", "list", "--porcelain").splitlines() if line.startswith("worktree ")]
    return branches, "\n".join(trees[1:]), run_dirs(home) if (home / "runs").exists() else []


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_refused_and_failed_runs_that_did_no_work_leave_nothing(home: Path, tmp_path: Path) -> None:
    missing = temper(home, "run", "loop-tiny", "--agent", "cli:claude-code", "--agent-option",
                     f"executable={tmp_path / 'no-such-claude'}")
    assert missing.returncode == 2 and "not found; install it" in missing.stderr, missing.stderr
    assert leftovers(home) == ("", "", [])

    url = f"http://127.0.0.1:{closed_port()}/v1"
    unreachable = temper(home, "run", "loop-tiny", "--agent", f"openai-compatible:{url}#m",
                         "--agent-option", "max_retries=0", "--agent-option", "timeout_s=5")
    assert unreachable.returncode == 1 and "error" in unreachable.stdout, unreachable.stdout + unreachable.stderr
    assert "did no work" in unreachable.stdout and "Traceback" not in unreachable.stderr
    assert leftovers(home) == ("", "", [])

    (home / "milestones" / "gpu-tiny.toml").write_text(GPU_MILESTONE)
    git(home, "add", "-A")
    git(home, "commit", "-q", "-m", "a GPU milestone")
    for argv in (("gate", "gpu-tiny", "--patch", str(tmp_path / "none.diff")), ("run", "gpu-tiny", "--agent", "cli:codex")):
        (tmp_path / "none.diff").write_text("")
        refused = temper(home, *argv)
        assert refused.returncode == 3 and "needs 8 x" in refused.stderr, (argv, refused.stderr)
        assert leftovers(home) == ("", "", []), argv


def test_prune_removes_what_finished_runs_left_and_says_what(home: Path, tmp_path: Path) -> None:
    trajectory = write_trajectory(tmp_path / "t.jsonl", [
        turn(f"Reading {i}.", (f"r{i}", "run", {"command": "sed -n 1,3p engine/config.py"}))
        for i in range(3)
    ])
    proc = temper(home, "run", "loop-tiny", "--agent", f"replay:{trajectory}", "--max-turns", "2")
    assert proc.returncode == 1 and "budget_exhausted" in proc.stdout
    [run_dir] = run_dirs(home)
    branches, trees, _ = leftovers(home)
    assert branches.endswith(f"temper/{run_dir.name}") and str(run_dir / "worktree") in trees
    pruned = temper(home, "runs", "--prune")
    assert pruned.returncode == 0, pruned.stderr
    assert f"{run_dir.name} (budget_exhausted): removed worktree {run_dir / 'worktree'} and branch temper/{run_dir.name}" \
        in pruned.stdout
    assert leftovers(home) == ("", "", [run_dir])  # the records stay
    assert events(run_dir)[-1]["type"] == "run_finished"
    again = temper(home, "runs", "--prune")
    assert again.returncode == 0 and again.stdout.startswith("nothing to prune"), again.stdout
