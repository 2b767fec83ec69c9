"""Local launcher: one subprocess (or torchrun) in its own process group, output streamed to a log.

- The child starts a new session, so its process group id is its pid and every signal goes to the
  whole group: torchrun's workers and any grandchildren die with it, and Ctrl-C in the terminal
  reaches only the harness (which then cancels the job itself).
- stdout and stderr share one pipe to a pump thread that appends each chunk to the log and flushes
  it at once (the log is readable while the job runs, partial lines included). For each finished
  line it also writes the line's arrival time to `<log>.times` (row i = line i of the log, seconds
  since launch): a clock the job cannot fake, against which the judge can hold claimed step times.
  PYTHONUNBUFFERED=1 is set unless overridden, so Python children write lines as they happen.
- timeout_s -> SIGTERM to the group, up to kill_grace_s for it to exit, then SIGKILL. Processes
  still in the group after the leader exits are stopped the same way and named in `detail`.
"""

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import BinaryIO, TextIO

from harness import settings
from harness.jobs.spec import Job, JobError, JobResult, JobSpec, JobState

__all__ = ["LocalJob", "local_command", "live_group_members"]

_PUMP_JOIN_S = 5.0  # after the job ends, how long the log may take to drain
_KILL_WAIT_S = 5.0  # after SIGKILL, how long the kernel may take to reap


def local_command(spec: JobSpec) -> list[str]:
    """The argv the local launcher executes for `spec`."""
    if spec.torchrun:
        return [spec.python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={spec.nproc}", *spec.argv]
    return list(spec.argv)


def live_group_members(pgid: int) -> list[int]:
    """Pids of processes in group `pgid` that are not zombies.

    A zombie cannot do anything, but it stays in its group until reaped, and orphans are reaped by
    pid 1, which in a container may never do it; so `killpg(pgid, 0)` alone would wait forever.
    """
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):  # exited while we looked
            continue
        # "pid (comm) state ppid pgrp ...": comm may contain spaces and parentheses.
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the group is already empty
        pass


class LocalJob(Job):
    """A job running on this host. Create it with harness.jobs.launch(spec)."""

    def __init__(self, spec: JobSpec):
        self.spec = spec
        self.result: JobResult | None = None
        self._lock = threading.RLock()
        self.command = local_command(spec)
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.line_times_path = spec.log_path.with_name(spec.log_path.name + ".times")
        env = settings.child_env({"PYTHONUNBUFFERED": "1", **spec.env})
        read_fd, write_fd = os.pipe()
        log = open(spec.log_path, "wb")
        times = open(self.line_times_path, "w")
        self._t0 = time.monotonic()
        try:
            self._proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=write_fd, stderr=write_fd,
                                          cwd=spec.cwd, env=env, start_new_session=True)
        except OSError as err:
            os.close(read_fd)
            log.close()
            times.close()
            raise JobError(f"job {spec.name!r}: cannot start {self.command[0]!r}: {err}") from err
        finally:
            os.close(write_fd)  # the child holds its own copy; ours would keep the pipe open forever
        self.job_id = f"local-{self._proc.pid}"
        self._pgid = self._proc.pid
        self._pump = threading.Thread(target=self._copy_output, args=(read_fd, log, times),
                                      name=f"job-log-{spec.name}", daemon=True)
        self._pump.start()

    def _copy_output(self, fd: int, log: BinaryIO, times: TextIO) -> None:
        try:
            while chunk := os.read(fd, 1 << 16):
                log.write(chunk)
                log.flush()
                if lines := chunk.count(b"\n"):
                    times.write(f"{time.monotonic() - self._t0:.6f}\n" * lines)
                    times.flush()
        finally:
            os.close(fd)
            log.close()
            times.close()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def poll(self) -> JobResult | None:
        with self._lock:
            if self.result is not None:
                return self.result
            code = self._proc.poll()
            if code is None:
                if self.spec.timeout_s is not None and time.monotonic() - self._t0 > self.spec.timeout_s:
                    return self._stop("timeout", f"timed out after {self.spec.timeout_s:g} s")
                return None
            detail = ""
            if leftovers := live_group_members(self._pgid):
                self._kill_group()
                detail = f"stopped {len(leftovers)} process(es) left in the job's group after it exited: {leftovers}"
            return self._finish("completed" if code == 0 else "failed", code, detail)

    def cancel(self) -> JobResult:
        with self._lock:
            if self.result is not None:
                return self.result
            return self._stop("cancelled", "cancelled by the harness")

    def _stop(self, state: JobState, detail: str) -> JobResult:
        self._kill_group()
        try:
            code: int | None = self._proc.wait(timeout=_KILL_WAIT_S)
        except subprocess.TimeoutExpired:  # unkillable (e.g. stuck in the kernel): say so, do not hang
            code = None
            detail += f"; pid {self._proc.pid} survived SIGKILL"
        return self._finish(state, code, detail)

    def _kill_group(self) -> None:
        """SIGTERM the group, give it kill_grace_s, then SIGKILL whatever is left."""
        _signal_group(self._pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.spec.kill_grace_s
        while time.monotonic() < deadline:
            self._proc.poll()  # reap the leader as soon as it exits
            if not live_group_members(self._pgid):
                return
            time.sleep(0.05)
        _signal_group(self._pgid, signal.SIGKILL)
        deadline = time.monotonic() + _KILL_WAIT_S
        while live_group_members(self._pgid) and time.monotonic() < deadline:
            self._proc.poll()
            time.sleep(0.02)

    def _finish(self, state: JobState, code: int | None, detail: str) -> JobResult:
        elapsed = time.monotonic() - self._t0
        self._pump.join(_PUMP_JOIN_S)
        if self._pump.is_alive():
            # Only a process outside the group (one that called setsid) can still hold the pipe.
            detail = "; ".join(filter(None, [detail, "the log is still held open by a process that left the job's group"]))
        sig = -code if code is not None and code < 0 else None
        self.result = JobResult(
            name=self.spec.name, state=state, exit_code=128 + sig if sig else code, signal=sig,
            log_path=self.spec.log_path, elapsed_s=elapsed, job_id=self.job_id, launcher="local",
            detail=detail, line_times_path=self.line_times_path,
        )
        return self.result
