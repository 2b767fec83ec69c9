"""Local launcher: one subprocess (or torchrun) in its own process group, output streamed to a log.

Processes are run by harness.jobs.process (the harness's one runner):
- The child starts a new session, so its process group id is its pid and every signal goes to the
  whole group: torchrun's workers and any grandchildren die with it, and Ctrl-C in the terminal
  reaches only the harness (which then cancels the job itself).
- stdout and stderr share one pipe the harness owns; a pump thread appends each chunk to the log and
  flushes it at once (the log is readable while the job runs, partial lines included). For each
  finished line it also writes the line's arrival time to `<log>.times` (row i = line i of the log,
  seconds since launch on the harness's monotonic clock): a clock the job cannot fake, against
  which the judge can hold claimed step times. PYTHONUNBUFFERED=1 is set unless overridden, so
  Python children write lines as they happen. The judge keeps the log where the job cannot reach it
  (a sandboxed job cannot see or write the log's folder unless it is made writable).
- timeout_s -> SIGTERM to the job's processes, up to kill_grace_s for them to exit, then SIGKILL.
  The job's processes are its group plus the leader's descendants (torchrun starts its workers in
  sessions of their own); SIGTERM skips the launcher's own processes (bwrap, torchrun's agent),
  which exit when the job's code does. Processes still alive after the leader exits are stopped the
  same way and named in `detail`.
- spec.sandbox: the command runs inside bubblewrap (harness.jobs.sandbox), torchrun included. bwrap
  exits with 128 + N when the job dies of signal N; the result reports that as signal N.
- spec.kill_pattern: the first output line that matches the regex makes the launcher send
  spec.kill_signal to the job's group, once ("kill at step N, then resume"); the result says
  which line and when. Under torchrun (and bwrap) the launcher's own processes are spared, so the
  workers end as they choose and torchrun reports their exit status.
- spec.on_line: each finished line, decoded, after it is in the log (a progress view).
"""

import re
import threading

from harness import settings
from harness.jobs.process import LineLog, Process, ProcessResult, group_members, parse_signal
from harness.jobs.jobspec import Job, JobError, JobResult, JobSpec, JobState

__all__ = ["LocalJob", "local_command", "live_group_members"]

live_group_members = group_members  # the old name, still used by callers and tests


def local_command(spec: JobSpec) -> list[str]:
    """The argv the local launcher executes for `spec` (inside the sandbox's bwrap when it has one)."""
    if spec.torchrun:
        argv = [spec.python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={spec.nproc}", *spec.argv]
    else:
        argv = list(spec.argv)
    if spec.sandbox is not None:
        return spec.sandbox.wrap(argv, cwd=spec.cwd)
    return argv


class LocalJob(Job):
    """A job running on this host. Create it with harness.jobs.launch(spec)."""

    def __init__(self, spec: JobSpec):
        self.spec = spec
        self.result: JobResult | None = None
        self._lock = threading.RLock()
        try:
            self.command = local_command(spec)
        except Exception as err:  # guard: allow fail-fast -- re-raised as the launcher's error with the job named
            raise JobError(f"job {spec.name!r}: cannot build its sandbox: {err}") from err
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.line_times_path = spec.log_path.with_name(spec.log_path.name + ".times")
        self._kill_re = re.compile(spec.kill_pattern) if spec.kill_pattern else None
        self._kill_sig = parse_signal(spec.kill_signal)
        self._kill_sent: tuple[int, float] | None = None  # (line number, seconds since launch)
        self._started = threading.Event()
        # The launcher's own processes (bwrap and its init, torchrun's agent) get no SIGTERM: it is
        # meant for the job's code, bwrap would die of it and SIGKILL the job, and torchrun would die
        # of it and fail a job whose workers checkpointed and exited 0. SIGKILL reaches everything.
        self._spare = (2 if spec.sandbox is not None else 0) + (1 if spec.torchrun else 0)
        env = settings.child_env({"PYTHONUNBUFFERED": "1", **spec.env})
        watched = self._kill_re is not None or spec.on_line is not None
        log = LineLog(spec.log_path, self.line_times_path, on_line=self._on_line if watched else None)
        try:
            self._process = Process(self.command, cwd=spec.cwd, env=env, stdout=log, timeout_s=spec.timeout_s,
                                    grace_s=spec.kill_grace_s, spare_depth=self._spare)
        except OSError as err:
            log.close()
            raise JobError(f"job {spec.name!r}: cannot start {self.command[0]!r}: {err}") from err
        finally:
            self._started.set()
        self.job_id = f"local-{self._process.pid}"

    def _on_line(self, line: bytes, number: int, t: float) -> None:
        """Pump thread: the first line matching kill_pattern sends kill_signal to the group; then the line goes to
        spec.on_line (display)."""
        text = line.decode("utf-8", errors="replace")
        if self._kill_re is not None and self._kill_sent is None and self._kill_re.search(text):
            self._started.wait()
            process = getattr(self, "_process", None)
            if process is not None:  # None: Popen failed, nothing to signal
                self._kill_sent = (number, process.elapsed_s)
                process.send_signal(self._kill_sig)
        if self.spec.on_line is not None:
            self.spec.on_line(text)

    @property
    def pid(self) -> int:
        return self._process.pid

    def member_pids(self) -> set[int]:
        """Host pids of the job's live processes (its group and the leader's descendants)."""
        return set(self._process.members())

    def poll(self) -> JobResult | None:
        with self._lock:
            if self.result is not None:
                return self.result
            res = self._process.poll()
            return None if res is None else self._result(res)

    def cancel(self) -> JobResult:
        with self._lock:
            if self.result is not None:
                return self.result
            return self._result(self._process.stop("cancelled"))

    def _result(self, res: ProcessResult) -> JobResult:
        code = res.returncode
        state: JobState
        if res.reason == "timeout":
            state, detail = "timeout", f"timed out after {self.spec.timeout_s:g} s"
        elif res.reason == "cancelled":
            state, detail = "cancelled", "cancelled by the harness"
        else:
            state, detail = ("completed" if code == 0 else "failed"), ""
        parts = [detail] if detail else []
        if res.leftovers:
            parts.append(f"stopped {len(res.leftovers)} process(es) left in the job's group after it exited: "
                         f"{list(res.leftovers)}")
        if res.survived_kill:
            parts.append(f"pid {self._process.pid} survived SIGKILL")
        if res.pipe_held:
            # Only a process outside the group (one that called setsid) can still hold the pipe.
            parts.append("the log is still held open by a process that left the job's group")
        sig = -code if code is not None and code < 0 else None
        if sig is None and self.spec.sandbox is not None and code is not None and 128 < code < 128 + 65:
            sig = code - 128  # bwrap reports a child killed by signal N as 128 + N
        sent = self._kill_sent
        if sent is not None:
            parts.append(f"sent {self._kill_sig.name} at log line {sent[0]} ({sent[1]:.2f} s after launch), "
                         f"which matched {self.spec.kill_pattern!r}")
        self.result = JobResult(
            name=self.spec.name, state=state, exit_code=128 + sig if sig else code, signal=sig,
            log_path=self.spec.log_path, elapsed_s=res.elapsed_s, job_id=self.job_id, launcher="local",
            detail="; ".join(parts), line_times_path=self.line_times_path,
            signal_sent=self._kill_sig.name if sent else None, signal_line=sent[0] if sent else None,
            signal_at_s=sent[1] if sent else None, sandboxed=self.spec.sandbox is not None,
        )
        return self.result

