"""SLURM launcher against a real single-node SLURM (sbatch, squeue, scontrol, scancel; no fakes).

The session fixture starts it with shared/slurm/start-local-slurm (idempotent; needs root). Each test
takes a few seconds: jobs are tiny and the poll interval is short."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.jobs import JobSpec, SubmitError, launch
from tests.proc_helpers import needs_ctrl_c

__all__: list[str] = []

pytestmark = pytest.mark.slurm

WORKER = Path(__file__).with_name("fixtures") / "rank_worker.py"
PY = sys.executable
REPO = Path(__file__).resolve().parents[2]


def _spec(tmp_path: Path, name: str, argv: list[str], **kw) -> JobSpec:  # type: ignore[no-untyped-def]
    return JobSpec(name=name, argv=argv, launcher="slurm", log_path=tmp_path / f"{name}.log", cwd=tmp_path,
                   timeout_s=kw.pop("timeout_s", 120), **kw)


def _scontrol(job_id: str) -> str:
    return subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout


def _until(predicate, what: str, limit_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.1)


def _log_has(path: Path, text: str, count: int = 1) -> bool:
    return path.exists() and path.read_text().count(text) >= count


def test_success_collects_log_exit_code_and_env(slurm: None, tmp_path: Path) -> None:
    spec = _spec(tmp_path, "ok", ["bash", "-c", "echo hello $TEMPER_TEST_OVERRIDE from $SLURM_JOB_ID"],
                 env={"TEMPER_TEST_OVERRIDE": "xyz-override"})
    job = launch(spec)
    result = job.wait(poll_s=0.2)
    assert (result.state, result.exit_code, result.job_id) == ("completed", 0, job.job_id)
    assert f"hello xyz-override from {job.job_id}" in result.read_log()
    assert "JobState=COMPLETED" in _scontrol(job.job_id)
    script = result.script_path.read_text()  # type: ignore[union-attr]
    assert "xyz-override" not in script, "override values travel in sbatch's environment, not in the script"
    assert f"#SBATCH --output={spec.log_path}" in script
    # the harness's own clock for slurmd's log: one arrival time per line
    times = [float(t) for t in result.line_times_path.read_text().split()]  # type: ignore[union-attr]
    assert len(times) == len(result.read_log().splitlines()) >= 2
    assert times == sorted(times) and 0 < times[0] <= result.elapsed_s


def test_failure_reports_the_exit_code(slurm: None, tmp_path: Path) -> None:
    result = launch(_spec(tmp_path, "fail", ["bash", "-c", "echo failing; exit 3"])).wait(poll_s=0.2)
    assert (result.state, result.exit_code) == ("failed", 3)
    assert "FAILED" in result.detail and "failing" in result.read_log()


def test_timeout_scancels_the_job(slurm: None, tmp_path: Path) -> None:
    spec = _spec(tmp_path, "hang", ["bash", "-c", "echo started; sleep 300"], timeout_s=3)
    job = launch(spec)
    result = job.wait(poll_s=0.2)
    assert result.state == "timeout" and "scancel" in result.detail
    assert "JobState=CANCELLED" in _scontrol(job.job_id)
    queued = subprocess.run(["squeue", "-h", "-j", job.job_id, "-o", "%T"], capture_output=True, text=True).stdout
    assert queued.strip() == "", f"the job must have left the queue, squeue says {queued!r}"


def test_bad_partition_is_a_clear_error(slurm: None, tmp_path: Path) -> None:
    with pytest.raises(SubmitError, match="(?i)sbatch refused job 'badpart'.*invalid partition"):
        launch(_spec(tmp_path, "badpart", ["true"], partition="no-such-partition"))


def test_preemption_signal_reaches_the_task(slurm: None, tmp_path: Path) -> None:
    # --signal=B:USR1@120 signals the batch shell 120 s before the limit; `scancel --signal=USR1
    # --batch` delivers exactly that now. The script forwards it; the task exits 0 as the engine does.
    spec = _spec(tmp_path, "preempt", [PY, str(WORKER), "--wait-signal", "100"], time_limit="10")
    job = launch(spec)
    _until(lambda: _log_has(spec.log_path, "ready"), "the task to start")
    subprocess.run(["scancel", "--signal=USR1", "--batch", job.job_id], check=True)
    result = job.wait(poll_s=0.2)
    log = result.read_log()
    assert result.state == "completed", log
    assert "rank=0 got SIGUSR1" in log and "no signal" not in log


def test_preempted_job_requeues_itself(slurm: None, tmp_path: Path) -> None:
    spec = _spec(tmp_path, "requeue", [PY, str(WORKER), "--wait-signal", "100"], time_limit="10", requeue=True)
    job = launch(spec)
    _until(lambda: _log_has(spec.log_path, "ready"), "the task to start")
    subprocess.run(["scancel", "--signal=USR1", "--batch", job.job_id], check=True)
    _until(lambda: "Restarts=1" in _scontrol(job.job_id), "SLURM to requeue the job")
    assert job.poll() is None, "a requeued job is pending again, not finished"
    result = job.cancel()
    assert result.state == "cancelled" and "requeued 1 time" in result.detail
    assert "requeueing job" in result.read_log()


def test_torchrun_job_under_slurm(slurm: None, tmp_path: Path) -> None:
    spec = _spec(tmp_path, "torchrun", [str(WORKER)], torchrun=True, nproc=2, timeout_s=240)
    result = launch(spec).wait(poll_s=0.2)
    log = result.read_log()
    assert result.state == "completed", log
    assert "rank=0 world=2" in log and "rank=1 world=2" in log


@needs_ctrl_c
def test_ctrl_c_in_wait_scancels(slurm: None, tmp_path: Path) -> None:
    spec = _spec(tmp_path, "ctrlc", ["bash", "-c", "echo up; sleep 300"])
    job = launch(spec)
    _until(lambda: _log_has(spec.log_path, "up"), "the job to start")
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))  # what Ctrl-C in a terminal does
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        job.wait(poll_s=0.1)
    timer.join()
    assert job.result is not None and job.result.state == "cancelled"
    assert "JobState=CANCELLED" in _scontrol(job.job_id)
