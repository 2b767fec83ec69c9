"""The agent loop end to end with the replay backend: `temper run` as a real process, real tools, real
git worktrees, real gates (guards in-process, pytest as a subprocess).

What is asserted comes from the records and git, not from the progress output: the events in order,
the verdict of each attempt, the feedback the agent received, the commits and their trailers, and
that the user's checkout is exactly as before.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.judge.draws import PUBLIC_SEED
from harness.records import list_runs, read_events
from harness.report import render_report
from harness.workspace import Workspace
from tests.loop.loop_helpers import (
    ENV_EDIT,
    FIX_ENV_EDIT,
    GOOD_EDIT,
    NEW,
    OLD,
    edit,
    REPO,
    events,
    git,
    run_dirs,
    temper,
    temper_env,
    tree_fingerprint,
    turn,
    write_trajectory,
)

__all__: list[str] = []


def assert_readable(run_dir: Path) -> None:
    """Every run folder stays readable: the events parse, the listing has it, the report renders."""
    read = read_events(run_dir / "events.jsonl")
    assert read.truncated_tail is None and read.events[0]["type"] == "run_started"
    assert any(s.id == run_dir.name and not s.problem for s in list_runs(run_dir.parent))
    page = render_report(run_dir)
    assert page.startswith("<!DOCTYPE html>") and run_dir.name in page


def test_guard_failure_feedback_then_acceptance_with_tool_mistakes_on_the_way(home: Path, tmp_path: Path) -> None:
    """Attempt 1 reads the environment outside engine/env.py (guards fail); the gate report reaches the
    agent as a user message; attempt 2 passes. On the way the model makes the mistakes a real one
    makes, and each comes back as a tool error or a failed command, never a crash: a tool call cut off at
    max_tokens, an edit whose old text is not in the file, a file tool the harness does not offer, a wrong
    argument name."""
    before = tree_fingerprint(home)
    trajectory = write_trajectory(tmp_path / "t.jsonl", [
        turn("Let me edit.", ("c1", "run", {}), stop="max_tokens"),  # cut off: arguments never arrived
        turn("Retrying with the wrong context.", ("c2", "run", edit("engine/config.py", (OLD.replace('"linear")', '"x")'), NEW)))),
        turn("Looking around.", ("c3", "read_file", {"path": "engine/config.py"}), ("c4", "run", {"cmd": "ls"})),
        turn("Now the real change.", ("c7", "run", ENV_EDIT), ("c8", "run", {"command": "git diff --stat"})),
        turn("Done.", ("c9", "submit", {"message": "Add inverse_sqrt"})),
        turn("Fixing the guard finding.", ("c10", "run", FIX_ENV_EDIT)),
        turn("The schedule name is a plain constant now; that is my change."),  # end_turn without tools: a submission
    ])
    proc = temper(home, "run", "loop-tiny", "--agent", f"replay:{trajectory}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [run_dir] = run_dirs(home)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "accepted" and run["totals"]["attempts"] == 2 and run["totals"]["turns"] == 7

    ev = events(run_dir)
    results = {e["result"]["call_id"]: e["result"] for e in ev if e["type"] == "tool_result"}
    assert results["c1"]["is_error"] and "max_tokens" in results["c1"]["content"]
    assert "AssertionError" in results["c2"]["content"] and "[exit code 1;" in results["c2"]["content"]
    assert results["c3"]["is_error"] and "Available tools: run, run_gates, read_log, submit" in results["c3"]["content"]
    assert results["c4"]["is_error"] and "no argument(s) 'cmd'" in results["c4"]["content"]
    assert not results["c7"]["is_error"] and "engine/config.py" in results["c8"]["content"] and results["c9"]["submitted"]

    kinds = [e["type"] for e in ev]
    first_attempt = kinds.index("attempt")
    feedback = next(e for e in ev[first_attempt:] if e["type"] == "user_message")
    assert "Attempt 1 was rejected: gate `guards`" in feedback["text"] and "TEMPER_EXTRA_SCHEDULE" in feedback["text"]
    verdict1 = json.loads((run_dir / "attempts/1/verdict.json").read_text())
    assert verdict1["failed_gate"] == "guards" and [g["skipped"] for g in verdict1["gates"]] == [False, False, True]
    verdict2 = json.loads((run_dir / "attempts/2/verdict.json").read_text())
    assert verdict2["accepted"] and [g["passed"] for g in verdict2["gates"]] == [True, True, True]
    assert "os.environ" in (run_dir / "attempts/1/diff.patch").read_text()
    assert "+LR_SCHEDULES = (\"cosine\", \"wsd\", \"constant\", \"linear\", \"inverse_sqrt\")" in (run_dir / "attempts/2/diff.patch").read_text()

    # One commit per attempt on the run's branch, the verdict in its trailers; the checkout untouched.
    history = Workspace(repo=home, worktree=run_dir / "worktree", base=run["base_commit"], branch=f"temper/{run_dir.name}",
                        run_id=run_dir.name).history()
    assert [(t["Attempt"], t["Verdict"]) for _, t in history] == [("1", "rejected"), ("2", "accepted")]
    assert history[-1][0] == verdict2["commit"]
    assert git(home, "branch", "--show-current").strip() == "main"
    assert tree_fingerprint(home) == before
    assert (run_dir / "report.html").is_file()
    assert_readable(run_dir)


def test_budget_exhaustion_ends_the_run_with_a_clear_status(home: Path, tmp_path: Path) -> None:
    trajectory = write_trajectory(tmp_path / "t.jsonl", [
        turn(f"Reading {i}.", (f"r{i}", "run", {"command": "sed -n 1,3p engine/config.py"}))
        for i in range(6)
    ])
    proc = temper(home, "run", "loop-tiny", "--agent", f"replay:{trajectory}", "--max-turns", "3")
    assert proc.returncode == 1
    assert "budget_exhausted" in proc.stdout and "turn budget spent: 3 of 3 turns" in proc.stdout
    [run_dir] = run_dirs(home)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "budget_exhausted" and run["totals"]["turns"] == 3 and run["totals"]["attempts"] == 0
    assert events(run_dir)[-1]["type"] == "run_finished"
    assert_readable(run_dir)
    listing = temper(home, "runs")
    assert listing.returncode == 0 and run_dir.name in listing.stdout and "budget_exhausted" in listing.stdout
    (run_dir / "report.html").unlink()
    report = temper(home, "report", run_dir.name)
    assert report.returncode == 0 and report.stdout.strip() == str(run_dir / "report.html")
    assert "budget_exhausted" in (run_dir / "report.html").read_text()


def test_protected_edits_through_the_shell_are_rejected_even_when_hidden_from_git(home: Path, tmp_path: Path) -> None:
    """The shell cannot be confined, so the protected gate hashes the files itself: a test edited and then hidden from git (assume-unchanged), and a conftest.py
    added under an exclude rule, both fail the attempt, and the agent's dry run before it (run_gates: the public
    gates, on the public draw)."""
    sneaky = ("echo 'def test_extra(): pass' >> tests/test_names.py && git update-index --assume-unchanged tests/test_names.py"
              " && printf 'collect_ignore = []\\n' > tests/conftest.py"
              " && echo tests/conftest.py >> \"$(git rev-parse --git-common-dir)/info/exclude\"")
    trajectory = write_trajectory(tmp_path / "t.jsonl", [
        turn("Patch and adjust the tests.", ("c1", "run", GOOD_EDIT), ("c2", "run", {"command": sneaky})),
        turn("Check, then submit.", ("g1", "run_gates", {}), ("c3", "submit", {"message": "done"})),
    ])
    proc = temper(home, "run", "loop-tiny", "--agent", f"replay:{trajectory}", "--max-attempts", "1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [run_dir] = run_dirs(home)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "rejected"
    verdict = json.loads((run_dir / "attempts/1/verdict.json").read_text())
    protected = verdict["gates"][0]
    assert verdict["failed_gate"] == "protected" and not protected["passed"]
    assert any(v.startswith("changed: tests/test_names.py") and "hidden from git" in v for v in protected["violations"])
    assert any(v.startswith("added: tests/conftest.py") and "hidden from git" in v for v in protected["violations"])
    # git itself sees nothing: the hiding worked, the hashing did not care.
    assert "tests/" not in (run_dir / "attempts/1/diff.patch").read_text()
    dry = next(e["result"]["content"] for e in events(run_dir) if e["type"] == "tool_result" and e["result"]["call_id"] == "g1")
    assert dry.startswith("Dry run of the public gates (nothing recorded as an attempt; held-out tests run only when you "
                          "submit, and a submission is judged on a secret draw of the configurations, not this public one):\n"
                          "FAILED: gate protected failed"), dry
    assert f"the public draw (seed {PUBLIC_SEED}, the same at every dry run" in dry
    assert not verdict["draw"]["public"] and verdict["seed"] != PUBLIC_SEED
    assert_readable(run_dir)


@pytest.mark.slow  # ~56 s on 2 cores: a whole run killed and resumed; the records it resumes from: tests/harness/test_records_store.py
def test_a_killed_run_resumes_from_its_records(home: Path, tmp_path: Path) -> None:
    """SIGKILL `temper run` while a tool call is running; `temper resume` re-runs the unfinished call,
    judges, and ends exactly as an uninterrupted run would (accepted on attempt 1)."""
    marker, pidfile, resumed = tmp_path / "started", tmp_path / "shell.pid", tmp_path / "resumed"
    trajectory = write_trajectory(tmp_path / "t.jsonl", [
        turn("Patch, then a dry run of the gates and a look at the pytest log.", ("c1", "run", GOOD_EDIT),
             ("g1", "run_gates", {}), ("g2", "read_log", {"job_id": "dry1-pytest", "tail": 5})),
        turn("Slow check.", ("c2", "run", {"command": f"echo $$ > {pidfile}; touch {marker}; test -e {resumed} || sleep 60"})),
        turn("Submit.", ("c3", "submit", {"message": "Add inverse_sqrt"})),
    ])
    runner = subprocess.Popen([sys.executable, "-m", "harness", "run", "loop-tiny", "--agent", f"replay:{trajectory}"],
                              cwd=REPO, env=temper_env(home), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert runner.poll() is None and time.monotonic() < deadline, "the run ended or stalled before the slow call"
            time.sleep(0.1)
    finally:
        os.killpg(runner.pid, signal.SIGKILL)  # the harness: a power cut
        runner.wait()
        if pidfile.is_file():  # the tool's shell runs in a session of its own
            try:
                os.killpg(int(pidfile.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass  # already gone
    [run_dir] = run_dirs(home)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"
    assert [e["type"] for e in events(run_dir)][-1] == "tool_call"
    results = {e["result"]["call_id"]: e["result"] for e in events(run_dir) if e["type"] == "tool_result"}
    assert results["g1"]["content"].startswith("Dry run of the public gates (nothing recorded as an attempt; ")
    assert "\nPASSED: every gate passed (protected, guards, pytest)\n" in results["g1"]["content"]
    assert "2 passed" in results["g2"]["content"] and not results["g2"]["is_error"]
    assert not any(e["type"] == "attempt" for e in events(run_dir))
    assert_readable(run_dir)

    marker.unlink()
    resumed.touch()
    proc = temper(home, "resume", run_dir.name, "--merge")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "merged into your checkout" in proc.stdout and '"inverse_sqrt")' in (home / "engine/config.py").read_text()
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "accepted" and run["totals"]["attempts"] == 1 and run["totals"]["turns"] == 3
    ev = events(run_dir)
    assert [e["call"]["id"] for e in ev if e["type"] == "tool_call"] == ["c1", "g1", "g2", "c2", "c2", "c3"]
    assert marker.exists()  # the interrupted call ran again
    assert any(e["type"] == "resumed" for e in ev)
    assert_readable(run_dir)
    again = temper(home, "resume", run_dir.name)
    assert again.returncode == 2 and "already ended as accepted" in again.stderr
