"""The one process runner (harness.jobs.process) and what the local launcher builds on it: group
kills of grandchildren, line arrival times, and kill_pattern (signal the group at a matching line)."""

import signal
import sys
import time
from pathlib import Path

import pytest

from harness.jobs import JobSpec, launch
from harness.jobs.process import LineLog, Lines, Process, group_members, parse_signal
from tests.proc_helpers import alive

__all__: list[str] = []

PY = sys.executable
STEPPER = Path(__file__).with_name("fixtures") / "stepper.py"




GRANDCHILDREN = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
    "g = subprocess.Popen(['sleep', '300']); print(g.pid, flush=True); time.sleep(300)"])
print(child.pid, flush=True)
time.sleep(300)
"""


def test_timeout_kills_children_and_grandchildren(tmp_path: Path) -> None:
    out = Lines()
    proc = Process([PY, "-c", GRANDCHILDREN], cwd=tmp_path, stdout=out, timeout_s=3, grace_s=0.5)
    deadline = time.monotonic() + 60
    while len(out.lines) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [int(line) for line in out.lines[:2]]
    assert len(pids) == 2 and all(alive(p) for p in pids)
    result = proc.wait()
    assert result is not None and result.timed_out and result.reason == "timeout"
    assert not any(alive(p) for p in pids), "the child ignored SIGTERM, so SIGKILL must have reached the group"
    assert group_members(proc.pgid) == []


def test_leftovers_after_a_normal_exit_are_stopped_and_reported(tmp_path: Path) -> None:
    out = Lines()
    code = "import subprocess; p = subprocess.Popen(['sleep', '300']); print(p.pid, flush=True)"
    result = Process([PY, "-c", code], cwd=tmp_path, stdout=out, grace_s=2).wait()
    assert result is not None and result.returncode == 0 and result.reason == "exited"
    assert list(result.leftovers) == [int(out.lines[0])] and not alive(int(out.lines[0]))


def test_stderr_apart_stdin_fed_and_lines_timed(tmp_path: Path) -> None:
    out, err = LineLog(tmp_path / "out.log", tmp_path / "out.log.times"), Lines()
    code = "import sys; data = sys.stdin.read(); print(data.upper()); print('two'); print('oops', file=sys.stderr)"
    result = Process([PY, "-c", code], stdout=out, stderr=err, stdin=b"prompt").wait()
    assert result is not None and result.returncode == 0
    assert (tmp_path / "out.log").read_text() == "PROMPT\ntwo\n" and err.lines == ["oops\n"]
    times = [float(t) for t in (tmp_path / "out.log.times").read_text().split()]
    assert len(times) == 2 and 0 <= times[0] <= times[1] <= result.elapsed_s


def test_parse_signal() -> None:
    assert parse_signal("SIGTERM") is signal.SIGTERM and parse_signal("kill") is signal.SIGKILL
    with pytest.raises(ValueError, match="not a signal name"):
        parse_signal("SIGNOPE")


def _stepper(tmp_path: Path, name: str, **kw) -> JobSpec:  # type: ignore[no-untyped-def]
    return JobSpec(name=name, argv=[PY, str(STEPPER), "50"], cwd=tmp_path, log_path=tmp_path / f"{name}.log",
                   timeout_s=120, **kw)


def test_kill_pattern_sigterm_lets_the_job_checkpoint_and_exit(tmp_path: Path) -> None:
    result = launch(_stepper(tmp_path, "term", kill_pattern=r"^step 3\b")).wait(poll_s=0.05)
    log = result.read_log()
    assert (result.state, result.exit_code, result.signal) == ("completed", 0, None), log
    assert (result.signal_sent, result.signal_line) == ("SIGTERM", 3)
    assert result.signal_at_s is not None and 0 < result.signal_at_s <= result.elapsed_s
    assert log.splitlines()[2] == "step 3 loss=1.0" and "checkpoint at step" in log and "finished" not in log
    assert "sent SIGTERM at log line 3" in result.detail
    assert result.to_json()["signal_line"] == 3


def test_kill_pattern_sigkill_kills_the_job(tmp_path: Path) -> None:
    result = launch(_stepper(tmp_path, "kill", kill_pattern=r"step 2 ", kill_signal="SIGKILL")).wait(poll_s=0.05)
    log = result.read_log()
    assert (result.state, result.signal, result.exit_code) == ("failed", 9, 137), log
    assert (result.signal_sent, result.signal_line) == ("SIGKILL", 2)
    assert "checkpoint" not in log and "finished" not in log


def test_kill_pattern_that_never_matches_sends_nothing(tmp_path: Path) -> None:
    spec = JobSpec(name="quiet", argv=[PY, str(STEPPER), "3"], cwd=tmp_path, log_path=tmp_path / "q.log",
                   kill_pattern="never printed")
    result = launch(spec).wait(poll_s=0.05)
    assert result.ok and result.signal_sent is None and result.signal_line is None and "finished" in result.read_log()


@pytest.mark.parametrize(("kw", "message"), [
    ({"kill_pattern": "("}, "kill_pattern"),
    ({"kill_signal": "SIGNOPE"}, "kill_signal"),
    ({"launcher": "slurm", "kill_pattern": "x"}, "kill_pattern"),
])
def test_kill_fields_are_validated(tmp_path: Path, kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        JobSpec(name="v", argv=["true"], log_path=tmp_path / "x.log", **kw)


def test_file_tail_stamps_lines_another_process_writes(tmp_path: Path) -> None:
    from harness.jobs.process import FileTail

    log = tmp_path / "slurm.log"
    t0 = time.monotonic()
    seen: list[str] = []
    tail = FileTail(log, tmp_path / "slurm.log.times", t0=t0, interval_s=0.05, on_line=seen.append)
    time.sleep(0.2)  # not there yet: nothing to stamp
    with log.open("ab") as fh:
        fh.write(b"one\ntw")
        fh.flush()
        deadline = time.monotonic() + 30
        while tail.lines < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)
        fh.write(b"o\nthree\n")
    tail.close()
    times = [float(t) for t in (tmp_path / "slurm.log.times").read_text().split()]
    assert len(times) == 3 and 0.2 <= times[0] and times[0] + 0.25 <= times[1] <= times[2] <= time.monotonic() - t0
    assert tail.restarts == 0
    assert seen == ["one", "two", "three"]  # whole lines only, a line written in two pieces once (progress view)


def test_kill_pattern_under_torchrun_reaches_the_workers_not_the_agent(tmp_path: Path) -> None:
    # torchrun starts each worker in a session of its own, and dies of SIGTERM itself: the signal
    # must reach the workers (outside the job's group) and spare torchrun, which then exits 0.
    spec = JobSpec(name="trkill", argv=[str(STEPPER), "100"], torchrun=True, nproc=2, cwd=tmp_path,
                   log_path=tmp_path / "t.log", timeout_s=240, kill_pattern=r"^step 3\b")
    result = launch(spec).wait(poll_s=0.1)
    log = result.read_log()
    assert (result.state, result.exit_code) == ("completed", 0), log
    assert log.count("checkpoint at step") == 2 and "finished" not in log


IGNORE_TERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("worker up", flush=True)
time.sleep(300)
"""


def test_timeout_kills_torchrun_workers_outside_the_group(tmp_path: Path) -> None:
    worker = tmp_path / "stubborn.py"
    worker.write_text(IGNORE_TERM)
    spec = JobSpec(name="trhang", argv=[str(worker)], torchrun=True, nproc=2, cwd=tmp_path,
                   log_path=tmp_path / "h.log", timeout_s=12, kill_grace_s=1)  # both workers up first (~3-6 s loaded)
    job = launch(spec)
    deadline = time.monotonic() + 120
    while spec.log_path.read_text().count("worker up") < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    workers = [pid for pid in job._process.members() if pid != job.pid]  # type: ignore[attr-defined]
    assert len(workers) == 2, workers
    result = job.wait(poll_s=0.1)
    assert result.state == "timeout"
    assert not any(alive(pid) for pid in workers), "torchrun's workers must not outlive the job"
