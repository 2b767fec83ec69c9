"""`temper demo`, the README's first command, end to end on a copy of this checkout.

It replays milestones/demo/trajectory.jsonl through the real loop, tools, workspace, gates and a real
20-step CPU training job. Expected outcome, from the recording itself: attempt 1 reads an environment
variable outside engine/env.py and the guards gate rejects it, the gate report reaches the agent,
attempt 2 passes every gate; the checkout the demo ran from is unchanged.
"""

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.loop.loop_helpers import REPO, events, git, run_dirs, temper_env, tree_fingerprint

__all__: list[str] = []


def checkout_copy(target: Path) -> Path:
    """This checkout as it is (tracked and untracked, not ignored files), committed in a new repository."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO, capture_output=True)
    if listed.returncode == 0:
        for name in filter(None, listed.stdout.decode().split("\0")):
            if (REPO / name).is_file():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, target / name)
    else:  # not a git checkout (an unpacked archive): everything but caches and records
        shutil.copytree(REPO, target, ignore=shutil.ignore_patterns("__pycache__", ".git", "runs", ".pytest_cache"))
    git(target, "init", "-q", "-b", "main")
    git(target, "add", "-A")
    git(target, "commit", "-q", "-m", "checkout copy")
    return target


@pytest.mark.slow
def test_temper_demo_fails_a_guard_then_passes_every_gate(tmp_path: Path) -> None:
    home = checkout_copy(tmp_path / "checkout")
    before = tree_fingerprint(home)
    proc = subprocess.run([sys.executable, "-m", "harness", "demo"], cwd=REPO, env=temper_env(home),
                          capture_output=True, text=True, timeout=1200, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "attempt 1: rejected by gate guards" in proc.stdout and "attempt 2: accepted" in proc.stdout
    # The progress view: one line per step with the elapsed time, no colour codes (NO_COLOR, and not a tty).
    progress = proc.stderr.splitlines()
    assert all(re.match(r"\[ *\d+\.\ds\] ", line) or line.startswith(" ") for line in progress)
    assert "\033[" not in proc.stderr
    assert any("guards FAIL" in line for line in progress) and any("a2-train started" in line for line in progress)
    # The long silences have live lines: each test file of the pytest gate, each step of the training job.
    assert any(line.endswith("tests    tests/milestones/test_demo_tiny.py: 4 passed") for line in progress), proc.stderr
    [run_dir] = run_dirs(home)
    verdict = json.loads((run_dir / "attempts/2/verdict.json").read_text())
    steps = verdict["draw"]["values"]["steps"]  # drawn per judging (milestones/demo-tiny.toml [draw])
    assert 21 <= steps <= 26
    assert [line.split("step     ", 1)[1].split(" loss")[0] for line in progress if "step     a2-train" in line] == \
        [f"a2-train step {s}/{steps}" for s in range(1, steps + 1)]
    ev = events(run_dir)
    attempts = [e for e in ev if e["type"] == "attempt"]
    assert [(a["attempt"], a["accepted"], a["failed_gate"]) for a in attempts] == [(1, False, "guards"), (2, True, None)]
    feedback = [e["text"] for e in ev if e["type"] == "user_message"][1]
    assert feedback.startswith("Attempt 1 was rejected: gate `guards`") and "TEMPER_INVSQRT_WARMUP" in feedback
    assert [(g["name"], g["passed"]) for g in verdict["gates"]] == [
        ("protected", True), ("guards", True), ("pytest", True), ("train", True), ("wide", True), ("metrics", True)]
    metrics = verdict["gates"][5]["metrics"]
    assert metrics["train.steps"] == steps and metrics["train.final_loss"] <= 5.0
    log = (run_dir / "jobs/a2-train/log").read_text()
    assert len(re.findall(r"^\[LOSS\] step=\d+ .*lr=", log, re.MULTILINE)) == steps
    assert (run_dir / "report.html").is_file()
    assert tree_fingerprint(home) == before
    assert _demo_leftovers(home) == ([], 1) and not (run_dir / "worktree").exists()
    assert f"left:     only the run's records in {run_dir};" in proc.stdout


def _demo_leftovers(home: Path) -> tuple[list[str], int]:
    """(temper/* branches, registered worktrees) of the repository at `home`: the demo must leave ([], 1)."""
    branches = git(home, "branch", "--list", "temper/*").split()
    worktrees = git(home, "worktree", "list", "--porcelain").count("worktree ")
    return branches, worktrees


def _demo(home: Path) -> subprocess.Popen[str]:
    # Ctrl-C must work even when this suite runs with SIGINT ignored (nohup): the child starts with the default.
    return subprocess.Popen([sys.executable, "-m", "harness", "demo"], cwd=REPO, env=temper_env(home), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_the_demo_removes_its_worktree_and_branch_however_it_ends(tmp_path: Path) -> None:
    """`temper demo` says the checkout is not modified: it must not leave a branch or a registered worktree behind,
    when the recorded agent fails half-way and when the user presses Ctrl-C during judging. The records stay."""
    home = checkout_copy(tmp_path / "checkout")
    trajectory = home / "milestones/demo/trajectory.jsonl"
    full = trajectory.read_text()
    trajectory.write_text("".join(full.splitlines(keepends=True)[:2]))  # the meta line and one turn, then it runs out
    git(home, "commit", "-qam", "a recording that stops after one turn")
    proc = _demo(home)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "replay exhausted" in out, out + err
    assert _demo_leftovers(home) == ([], 1), out + err
    [first] = run_dirs(home)
    assert not (first / "worktree").exists() and (first / "events.jsonl").is_file()
    assert "removed the demo's worktree and branch" in err

    trajectory.write_text(full)
    git(home, "commit", "-qam", "the whole recording")
    proc = _demo(home)
    deadline = time.monotonic() + 300
    # a run's folder exists a moment before its events.jsonl does (seen on a loaded machine)
    while not any((d / "events.jsonl").is_file() and '"gate_started"' in (d / "events.jsonl").read_text()
                  for d in run_dirs(home) if d != first):
        assert proc.poll() is None and time.monotonic() < deadline, "the demo never reached its first gate"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal does
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "interrupted" in err, out + err
    assert _demo_leftovers(home) == ([], 1), out + err
    assert len(run_dirs(home)) == 2 and not any((d / "worktree").exists() for d in run_dirs(home))


@pytest.mark.slow  # ~49 s (two bitwise-single jobs judged); the default run keeps the setup patch as the judge's base
# (tests/loop/test_setup_base.py), a replayed agent's repair accepted (tests/loop/test_loop_replay.py) and bitwise-single
# accepted end to end with the judge's seed (tests/milestones/test_programme.py, PASS)
def test_a_replayed_agent_repairs_the_data_order_and_passes_a_programme_milestone(tmp_path: Path) -> None:
    """A growth milestone other than the demo, end to end: the setup patch plants the wall clock in the data
    order, the recorded agent finds and removes it, and bitwise-single's gates (two jobs with the judge's
    seed, claims checked against their weights) accept attempt 1. The checkout is unchanged."""
    home = checkout_copy(tmp_path / "checkout")
    before = tree_fingerprint(home)
    trajectory = home / "milestones/repair-data-order/trajectory.jsonl"
    proc = subprocess.run([sys.executable, "-m", "harness", "run", "repair-data-order", "--agent", f"replay:{trajectory}"],
                          cwd=REPO, env=temper_env(home), capture_output=True, text=True, timeout=1200,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [run_dir] = run_dirs(home)
    attempts = [e for e in events(run_dir) if e["type"] == "attempt"]
    assert [(a["attempt"], a["accepted"]) for a in attempts] == [(1, True)]
    verdict = json.loads((run_dir / "attempts/1/verdict.json").read_text())
    assert [g["name"] for g in verdict["gates"] if g["passed"]] == ["protected", "guards", "first", "second", "metrics"]
    assert "time.time_ns" in (run_dir / "attempts/1/diff.patch").read_text()  # the fix removes the planted line
    assert tree_fingerprint(home) == before
