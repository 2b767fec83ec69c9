"""What a job is (JobSpec), how it ended (JobResult), and the handle both launchers return (Job).

A JobSpec is launcher-neutral: the same spec runs locally (subprocess / torchrun) or under SLURM
(sbatch). `argv` means one of two things, chosen by `torchrun`:
- torchrun=False: the full command, `["python", "-m", "engine", "pretrain", ...]` or `["bash", "x.sh"]`;
- torchrun=True: what torchrun takes after its own options, `["-m", "engine", "pretrain", ...]` or
  `["train.py", "--flag"]`; the launcher supplies `<python> -m torch.distributed.run ...`.
"""

import abc
import re
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.jobs.process import parse_signal
from harness.jobs.sandbox import Sandbox

__all__ = [
    "JobSpec",
    "JobResult",
    "JobState",
    "Job",
    "JobError",
    "SubmitError",
    "LAUNCHERS",
    "TERMINAL_STATES",
]

LAUNCHERS = ("local", "slurm")
JobState = Literal["completed", "failed", "timeout", "cancelled"]
TERMINAL_STATES: tuple[JobState, ...] = ("completed", "failed", "timeout", "cancelled")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SIGNAL = re.compile(r"(?:R:|B:|RB:)?(?:SIG)?([A-Z0-9]+)@\d+")


class JobError(RuntimeError):
    """A launcher could not do what was asked (not: the job itself failed; that is a JobResult)."""


class SubmitError(JobError):
    """The scheduler refused the job (sbatch's stderr is in the message)."""


@dataclass(kw_only=True, frozen=True)
class JobSpec:
    """Everything needed to run one job, on either launcher. Validated on construction.

    nproc: processes per node (GPUs per node for training). nodes > 1 needs SLURM.
    timeout_s: the harness's wall-clock limit from launch (None: none); on expiry the job's whole
        process group (local) or allocation (SLURM, scancel) is terminated, SIGTERM then SIGKILL
        after kill_grace_s.
    env: overrides on top of the harness's environment (see harness.settings.child_env).
    log_path: stdout + stderr of the whole job, written while it runs.
    sandbox: run the job inside this OS sandbox (harness.jobs.sandbox; local launcher only: SLURM
        jobs are not sandboxed, and a SLURM spec with a sandbox is refused).
    kill_pattern: a regex; when a line of the job's output matches it (searched, not anchored), the
        launcher sends kill_signal ("SIGTERM", "SIGKILL", "SIGUSR1", ...) to the job's whole process
        group, once (local launcher only). The job then ends as it ends; the result says when.
    on_line: called with each output line (decoded, without its newline) as it reaches the log: on the
        pump thread that writes it (local) or the thread that follows it (SLURM). For a progress view:
        it must return quickly and never raise; nothing the launcher decides depends on it.
    SLURM only: partition, time_limit ("" = from timeout_s), gpus_per_node, preempt_signal
        (sbatch --signal, "" = none), requeue (requeue itself after the preemption signal),
        sbatch_extra (more "#SBATCH" option lines, e.g. "--exclusive"), rdzv_port (0 = from job id).
    """

    name: str
    argv: tuple[str, ...]
    launcher: Literal["local", "slurm"] = "local"
    nproc: int = 1
    nodes: int = 1
    timeout_s: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path = field(default_factory=Path.cwd)
    log_path: Path
    torchrun: bool = False
    python: str = sys.executable
    kill_grace_s: float = 10.0
    partition: str = ""
    time_limit: str = ""
    gpus_per_node: int = 0
    preempt_signal: str = "B:USR1@120"
    requeue: bool = False
    sbatch_extra: tuple[str, ...] = ()
    rdzv_port: int = 0
    sandbox: Sandbox | None = None
    kill_pattern: str = ""
    kill_signal: str = "SIGTERM"
    on_line: Callable[[str], None] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Accept lists and str paths from callers; store immutable / absolute forms.
        object.__setattr__(self, "argv", tuple(self.argv))
        object.__setattr__(self, "sbatch_extra", tuple(self.sbatch_extra))
        object.__setattr__(self, "env", dict(self.env))
        object.__setattr__(self, "cwd", Path(self.cwd).resolve())
        log = Path(self.log_path)
        object.__setattr__(self, "log_path", log if log.is_absolute() else self.cwd / log)
        self._validate()

    def _validate(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"job {self.name!r}: {name} = {getattr(self, name)!r} {why}")

        if not _NAME.fullmatch(self.name):
            raise ValueError(f"job name {self.name!r}: use letters, digits, '.', '_' or '-' (at most 128)")
        if not self.argv or not all(isinstance(a, str) for a in self.argv):
            raise bad("argv", "must be a non-empty list of strings")
        if self.launcher not in LAUNCHERS:
            raise bad("launcher", f"is not one of {LAUNCHERS}")
        for name in ("nproc", "nodes"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise bad(name, "must be a positive integer")
        if self.gpus_per_node < 0:
            raise bad("gpus_per_node", "must be 0 or more")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise bad("timeout_s", "must be positive (or None for no limit)")
        if self.kill_grace_s < 0:
            raise bad("kill_grace_s", "must be 0 or more")
        for key, value in self.env.items():
            if not _ENV_NAME.fullmatch(key) or not isinstance(value, str) or "\0" in value:
                raise ValueError(f"job {self.name!r}: env override {key!r}={value!r} is not NAME=string")
        if self.launcher == "local":
            if self.nodes > 1:
                raise bad("nodes", "needs launcher='slurm' (the local launcher runs on this host only)")
            if self.nproc > 1 and not self.torchrun:
                raise bad("nproc", "needs torchrun=True (local multi-process jobs run under torchrun; argv then "
                                   "starts with the script or '-m module')")
        if self.kill_pattern:
            try:
                re.compile(self.kill_pattern)
            except re.error as err:
                raise bad("kill_pattern", f"is not a regular expression: {err}") from None
        try:
            parse_signal(self.kill_signal)
        except ValueError as err:
            raise bad("kill_signal", str(err)) from None
        if self.sandbox is not None and not isinstance(self.sandbox, Sandbox):
            raise bad("sandbox", "must be a harness.jobs.sandbox.Sandbox or None")
        if self.launcher == "slurm":
            if self.sandbox is not None:
                raise bad("sandbox", "is not supported under SLURM (SLURM jobs are not sandboxed: srun would signal "
                                     "bwrap, not the job); run sandboxed jobs with launcher='local'")
            if self.kill_pattern:
                raise bad("kill_pattern", "needs launcher='local' (the SLURM launcher does not watch lines live)")
            for name in ("partition", "time_limit"):
                if re.search(r"\s", getattr(self, name)):
                    raise bad(name, "must not contain whitespace")
            if re.search(r"\s", str(self.log_path)):
                raise bad("log_path", "must not contain whitespace (it goes into an #SBATCH line)")
            if any("\n" in line or not line.strip().startswith("-") for line in self.sbatch_extra):
                raise bad("sbatch_extra", "must be single-line sbatch options such as '--exclusive'")
            if self.preempt_signal and not _SIGNAL.fullmatch(self.preempt_signal):
                raise bad("preempt_signal", "is not an sbatch --signal value like 'B:USR1@120'")
            if self.nodes > 1 and not self.torchrun:
                raise bad("nodes", "needs torchrun=True (multi-node jobs rendezvous through torchrun)")
            if not 0 <= self.rdzv_port < 65536:
                raise bad("rdzv_port", "must be a TCP port (0: derived from the job id)")

    @property
    def preempt_signal_name(self) -> str:
        """'USR1' for 'B:USR1@120'; '' when no preemption signal is requested."""
        m = _SIGNAL.fullmatch(self.preempt_signal)
        return m.group(1) if m else ""

    def command_line(self) -> str:
        return shlex.join(self.argv)

    def to_json(self) -> dict[str, Any]:
        """For run records: paths as strings; env as names only (values may be secrets)."""
        return {
            "name": self.name, "argv": list(self.argv), "launcher": self.launcher, "nproc": self.nproc,
            "nodes": self.nodes, "timeout_s": self.timeout_s, "env_overrides": sorted(self.env),
            "cwd": str(self.cwd), "log_path": str(self.log_path), "torchrun": self.torchrun,
            "partition": self.partition, "time_limit": self.time_limit, "gpus_per_node": self.gpus_per_node,
            "preempt_signal": self.preempt_signal, "requeue": self.requeue, "sbatch_extra": list(self.sbatch_extra),
            "sandbox": self.sandbox.describe() if self.sandbox is not None else None,
            "kill_pattern": self.kill_pattern, "kill_signal": self.kill_signal,
        }


@dataclass(kw_only=True, frozen=True)
class JobResult:
    """How a job ended.

    exit_code follows the shell: 128 + N when killed by signal N (then `signal` is N). None when the
    launcher never saw the job end (e.g. SLURM forgot it). `detail` says more in words: the
    scheduler's own state and reason, leftover processes that had to be killed, and so on.
    `line_times_path`: arrival time of each log line on the harness's clock (seconds since launch),
    see harness/jobs/local.py and harness/jobs/slurm.py.
    `signal_sent` / `signal_line` / `signal_at_s`: the kill_pattern signal ("SIGTERM"), the log line
    (numbered from 1) that triggered it and when it was sent; None when none was sent.
    `sandboxed`: the job ran inside a harness.jobs.sandbox.Sandbox.
    """

    name: str
    state: JobState
    exit_code: int | None
    log_path: Path
    elapsed_s: float
    job_id: str
    launcher: str
    signal: int | None = None
    detail: str = ""
    line_times_path: Path | None = None
    script_path: Path | None = None
    signal_sent: str | None = None
    signal_line: int | None = None
    signal_at_s: float | None = None
    sandboxed: bool = False

    @property
    def ok(self) -> bool:
        return self.state == "completed"

    def read_log(self) -> str:
        """The job's log as text (undecodable bytes replaced; a crashed job may leave any)."""
        return self.log_path.read_bytes().decode("utf-8", errors="replace") if self.log_path.exists() else ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "state": self.state, "exit_code": self.exit_code, "signal": self.signal,
            "log_path": str(self.log_path), "elapsed_s": self.elapsed_s, "job_id": self.job_id,
            "launcher": self.launcher, "detail": self.detail,
            "line_times_path": str(self.line_times_path) if self.line_times_path else None,
            "script_path": str(self.script_path) if self.script_path else None,
            "signal_sent": self.signal_sent, "signal_line": self.signal_line, "signal_at_s": self.signal_at_s,
            "sandboxed": self.sandboxed,
        }


class Job(abc.ABC):
    """A launched job. `wait` blocks until it ends; Ctrl-C during `wait` cancels it, records the
    result in `result`, and re-raises KeyboardInterrupt so the caller unwinds (records in `finally`)."""

    spec: JobSpec
    job_id: str
    result: JobResult | None

    @abc.abstractmethod
    def poll(self) -> JobResult | None:
        """The result if the job has ended (enforcing the timeout), else None. Never blocks long."""

    @abc.abstractmethod
    def cancel(self) -> JobResult:
        """Stop the job (SIGTERM, grace, SIGKILL / scancel) and return its result; idempotent."""

    def wait(self, poll_s: float = 1.0) -> JobResult:
        try:
            while True:
                result = self.poll()
                if result is not None:
                    return result
                time.sleep(poll_s)
        except KeyboardInterrupt:
            self.cancel()
            raise
