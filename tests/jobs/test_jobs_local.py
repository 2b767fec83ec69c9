"""Local launcher against real subprocesses: exit codes, live logs, process-group kills, env, torchrun.

No test asserts on wall time; waits for a condition use generous deadlines (2 shared CPU cores)."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.jobs import JobSpec, launch
from harness.jobs.local import live_group_members
from tests.proc_helpers import alive, needs_ctrl_c

__all__: list[str] = []

WORKER = Path(__file__).with_name("fixtures") / "rank_worker.py"
PY = sys.executable
REPO = Path(__file__).resolve().parents[2]




def _until(predicate, what: str, limit_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def _spec(tmp_path: Path, name: str, argv: list[str], **kw) -> JobSpec:  # type: ignore[no-untyped-def]
    return JobSpec(name=name, argv=argv, log_path=tmp_path / f"{name}.log", cwd=tmp_path, **kw)


def test_success_writes_log_and_line_times(tmp_path: Path) -> None:
    job = launch(_spec(tmp_path, "ok", [PY, "-c", "print('hello'); print('world')"]))
    result = job.wait(poll_s=0.05)
    assert (result.state, result.exit_code, result.signal) == ("completed", 0, None)
    assert result.ok and result.launcher == "local" and result.job_id == f"local-{job.pid}"  # type: ignore[attr-defined]
    assert result.read_log() == "hello\nworld\n"
    times = [float(t) for t in result.line_times_path.read_text().split()]  # type: ignore[union-attr]
    assert len(times) == 2 and 0 <= times[0] <= times[1] <= result.elapsed_s


def test_failure_reports_exit_code_and_stderr(tmp_path: Path) -> None:
    code = "import sys; print('to stderr', file=sys.stderr); sys.exit(7)"
    result = launch(_spec(tmp_path, "fail", [PY, "-c", code])).wait(poll_s=0.05)
    assert (result.state, result.exit_code) == ("failed", 7)
    assert "to stderr" in result.read_log()


def test_log_is_readable_while_running(tmp_path: Path) -> None:
    go = tmp_path / "go"
    code = (f"import os, time\nprint('first line')\n"
            f"while not os.path.exists({str(go)!r}): time.sleep(0.02)\nprint('second line')")
    spec = _spec(tmp_path, "live", [PY, "-c", code], timeout_s=120)
    job = launch(spec)
    _until(lambda: "first line" in spec.log_path.read_text(), "the first line in the log")
    assert job.poll() is None, "the job must still be running: it waits for the go file"
    assert "second line" not in spec.log_path.read_text()
    go.touch()
    result = job.wait(poll_s=0.05)
    assert result.state == "completed" and result.read_log() == "first line\nsecond line\n"


GROUP_SCRIPT = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # forces the launcher to escalate to SIGKILL
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
open(sys.argv[1], "w").write(str(child.pid))
print("ready", flush=True)
time.sleep(300)
"""


def test_timeout_kills_the_whole_group_including_a_grandchild(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    # 5 s leaves the job ample time to start its grandchild before the timeout fires.
    spec = _spec(tmp_path, "hang", [PY, "-c", GROUP_SCRIPT, str(pid_file)], timeout_s=5, kill_grace_s=0.5)
    job = launch(spec)
    _until(lambda: "ready" in spec.log_path.read_text() or job.poll() is not None, "the job to start its grandchild")
    assert job.result is None, f"the job ended before it was ready: {job.result}"
    grandchild = int(pid_file.read_text())
    assert alive(grandchild)
    result = job.wait(poll_s=0.1)
    assert result.state == "timeout"
    assert result.signal == 9 and result.exit_code == 137, "SIGTERM was ignored, so SIGKILL must have ended it"
    assert not alive(grandchild), "the grandchild must die with its group"
    assert live_group_members(job.pid) == []  # type: ignore[attr-defined]


def test_leftover_group_members_are_stopped_after_a_normal_exit(tmp_path: Path) -> None:
    pid_file = tmp_path / "orphan.pid"
    code = (f"import subprocess, sys\np = subprocess.Popen(['sleep', '300'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))")
    result = launch(_spec(tmp_path, "orphan", [PY, "-c", code], kill_grace_s=2)).wait(poll_s=0.05)
    assert result.state == "completed" and result.exit_code == 0
    assert "stopped 1 process" in result.detail
    assert not alive(int(pid_file.read_text()))


def test_env_overrides_reach_the_child_and_api_keys_do_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-must-not-leak")
    monkeypatch.setenv("TEMPER_TEST_INHERITED", "from-parent")
    code = ("import os; print(os.environ.get('TEMPER_TEST_OVERRIDE'), os.environ.get('TEMPER_TEST_INHERITED'), "
            "os.environ.get('ANTHROPIC_API_KEY'), os.environ.get('PYTHONUNBUFFERED'))")
    spec = _spec(tmp_path, "env", [PY, "-c", code], env={"TEMPER_TEST_OVERRIDE": "xyz"})
    result = launch(spec).wait(poll_s=0.05)
    assert result.read_log().split() == ["xyz", "from-parent", "None", "1"]


def test_torchrun_runs_two_ranks_on_cpu(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "torchrun", [str(WORKER)], torchrun=True, nproc=2, timeout_s=240)
    result = launch(spec).wait(poll_s=0.1)
    log = result.read_log()
    assert result.state == "completed", log
    assert "rank=0 world=2" in log and "rank=1 world=2" in log


def test_cancel_stops_the_job(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "cancel", [PY, "-c", "print('up', flush=True); import time; time.sleep(300)"], kill_grace_s=5)
    job = launch(spec)
    _until(lambda: "up" in spec.log_path.read_text(), "the job to start")
    result = job.cancel()
    assert result.state == "cancelled" and result.signal == 15  # python dies of the default SIGTERM action
    assert job.cancel() is result and job.wait() is result  # idempotent
    assert not alive(job.pid)  # type: ignore[attr-defined]


@needs_ctrl_c
def test_ctrl_c_in_wait_cancels_the_job_and_propagates(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "ctrlc", [PY, "-c", "print('up', flush=True); import time; time.sleep(300)"], kill_grace_s=5)
    job = launch(spec)
    _until(lambda: "up" in spec.log_path.read_text(), "the job to start")
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))  # what Ctrl-C in a terminal does
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        job.wait(poll_s=0.05)
    timer.join()
    assert job.result is not None and job.result.state == "cancelled"
    assert not alive(job.pid)  # type: ignore[attr-defined]


def test_ctrl_c_test_skips_with_its_reason_when_sigint_is_ignored() -> None:
    """Under `nohup ... &` SIGINT is ignored: the Ctrl-C test above must skip and say why, not wait 300 s for a
    KeyboardInterrupt that never comes."""
    node = f"{Path(__file__).relative_to(REPO)}::test_ctrl_c_in_wait_cancels_the_job_and_propagates"
    proc = subprocess.run([PY, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", node], cwd=REPO, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.returncode == 0 and "1 skipped" in proc.stdout, proc.stdout + proc.stderr
    assert "SIGINT is ignored in this test process" in proc.stdout


def test_missing_executable_is_a_clear_error(tmp_path: Path) -> None:
    from harness.jobs import JobError

    with pytest.raises(JobError, match="cannot start 'no-such-program-xyz'"):
        launch(_spec(tmp_path, "missing", ["no-such-program-xyz"]))


@pytest.mark.parametrize(("kw", "message"), [
    ({"name": "bad name"}, "job name"),
    ({"argv": []}, "argv"),
    ({"nproc": 2}, "needs torchrun=True"),
    ({"nodes": 2}, "needs launcher='slurm'"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"env": {"BAD-NAME": "x"}}, "env override"),
    ({"launcher": "k8s"}, "launcher"),
    ({"launcher": "slurm", "preempt_signal": "USR1"}, "preempt_signal"),
    ({"launcher": "slurm", "partition": "a b"}, "partition"),
    ({"launcher": "slurm", "sbatch_extra": ["exclusive"]}, "sbatch_extra"),
])
def test_spec_validation_names_the_field(tmp_path: Path, kw: dict, message: str) -> None:
    args = {"name": "ok", "argv": ["true"], "log_path": tmp_path / "x.log"} | kw
    with pytest.raises(ValueError, match=message):
        JobSpec(**args)
