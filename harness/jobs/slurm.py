"""SLURM launcher: sbatch a script rendered from templates/sbatch.sh.j2, watch it, collect its log.

Submitting: the script is written (atomically) beside the log as `<log>.sbatch` and submitted with
`sbatch --parsable` in the job's environment (the harness's, minus API keys, plus overrides); sbatch
exports that environment to the job, so override values never land in the script.
Watching: `squeue -h -j ID -o %T` while the job is queued or running; when squeue no longer lists it
as active, `scontrol show job -o ID` gives the final JobState and ExitCode. SLURM forgets a job
MinJobAge (300 s by default) after it ends; after that only accounting (sacct) knows, and it is
asked only when configured (detected once from `scontrol show config`; never required).
Clock: slurmd writes the log, not the harness; a FileTail thread (harness.jobs.process) polls it
every 0.2 s and writes the arrival time of each new line to `<log>.times` (seconds since submission
on the harness's monotonic clock), so the judge has its own clock for SLURM jobs too, at the
resolution of the poll. Not sandboxed: a JobSpec with a sandbox is refused for SLURM (srun would
signal bwrap rather than the job, and the tasks run on nodes the judge does not control).
Stopping: `scancel ID` on the harness's timeout or on Ctrl-C; SLURM sends SIGTERM and SIGKILLs after
its KillWait. The job's own `--time` limit (derived from timeout_s when not given) is the backstop
if the harness itself dies.
Preemption: `--signal=B:USR1@120` has SLURM signal the batch shell 120 s before the time limit; the
script forwards it to the job step (srun passes USR1 to its tasks; torchrun is told to pass it on
to its workers), the engine checkpoints at its next step boundary and exits, and with requeue the
script requeues the job, whose log then continues (--open-mode=append). A requeued job is pending
again, not finished: wait() keeps watching.
"""

import functools
import math
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import jinja2

from harness import settings
from harness.atomic import write_atomic
from harness.jobs.process import FileTail
from harness.jobs.jobspec import Job, JobError, JobResult, JobSpec, JobState, SubmitError

__all__ = ["SlurmJob", "SlurmInfo", "render_sbatch", "accounting_enabled", "slurm_time_seconds"]

TEMPLATES = Path(__file__).with_name("templates")
_CMD_TIMEOUT_S = 60.0  # slurmctld answers in milliseconds; a minute means it is down
_STOP_WAIT_S = 120.0  # after scancel: KillWait (30 s default) plus epilog and margin
_TRANSIENT_FAILURES = 5  # consecutive squeue/scontrol failures tolerated (slurmctld restarting)

# Job states of `squeue -o %T` / scontrol JobState. Anything not in _FINAL is still going (a
# requeued job is PENDING again); _FINAL maps to ours.
_FINAL: dict[str, JobState] = {
    "COMPLETED": "completed",
    "CANCELLED": "cancelled",
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "FAILED": "failed",
    "NODE_FAIL": "failed",
    "OUT_OF_MEMORY": "failed",
    "BOOT_FAIL": "failed",
    "PREEMPTED": "failed",
}


def slurm_time_seconds(value: str) -> int | None:
    """Seconds of an sbatch --time value ("M", "M:S", "H:M:S", "D-H", "D-H:M", "D-H:M:S");
    None for UNLIMITED / INFINITE."""
    text = value.strip().upper()
    if text in ("UNLIMITED", "INFINITE", "-1"):
        return None
    days = 0
    if "-" in text:
        day_part, _, text = text.partition("-")
        days = int(day_part)
        parts = [int(p) for p in text.split(":")] + [0, 0]
        h, m, s = parts[:3]
    else:
        parts = [int(p) for p in text.split(":")]
        if len(parts) == 1:
            h, m, s = 0, parts[0], 0
        elif len(parts) == 2:
            h, m, s = 0, parts[0], parts[1]
        elif len(parts) == 3:
            h, m, s = parts
        else:
            raise ValueError(f"time limit {value!r} is not an sbatch --time value")
    return ((days * 24 + h) * 60 + m) * 60 + s


def _time_limit(spec: JobSpec) -> str:
    if spec.time_limit:
        return spec.time_limit
    if spec.timeout_s is None:
        return ""  # the partition's default
    # A minute more than the harness waits: the harness's scancel comes first, this is the backstop.
    return str(math.ceil(spec.timeout_s / 60) + 1)


def render_sbatch(spec: JobSpec) -> str:
    """The batch script for `spec` (StrictUndefined: a missing template variable is an error)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)
    env.filters["q"] = shlex.quote
    time_limit = _time_limit(spec)
    signal, dropped, signal_name = spec.preempt_signal, "", spec.preempt_signal_name
    lead_s = int(signal.rpartition("@")[2]) if signal else 0
    limit_s = slurm_time_seconds(time_limit) if time_limit else None
    # SLURM may send the signal up to 60 s early; a limit shorter than that would signal at start.
    if signal and limit_s is not None and limit_s <= lead_s + 60:
        signal, dropped, signal_name = "", signal, ""
    return env.get_template("sbatch.sh.j2").render(
        name=spec.name, nodes=spec.nodes, nproc=spec.nproc, ntasks_per_node=1 if spec.torchrun else spec.nproc,
        gpus_per_node=spec.gpus_per_node, time_limit=time_limit, output=str(spec.log_path).replace("%", "%%"),
        partition=spec.partition, signal=signal, signal_dropped=dropped, signal_name=signal_name,
        shutdown_timeout=max(30, lead_s - 20), requeue=spec.requeue, extra_lines=list(spec.sbatch_extra),
        cwd=str(spec.cwd), torchrun=spec.torchrun, python=spec.python, argv=list(spec.argv),
        rdzv_port=spec.rdzv_port, env_names=sorted(spec.env),
    )


def _run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=_CMD_TIMEOUT_S, **kwargs)  # type: ignore[call-overload]
    except FileNotFoundError as err:
        raise JobError(f"{argv[0]} not found: is SLURM installed and on PATH? ({err})") from err
    except subprocess.TimeoutExpired as err:
        raise JobError(f"{shlex.join(argv)} did not answer in {_CMD_TIMEOUT_S:g} s: is slurmctld up?") from err


@functools.cache
def accounting_enabled() -> bool:
    """Whether sacct can answer: AccountingStorageType is set and not accounting_storage/none."""
    out = _run(["scontrol", "show", "config"])
    m = re.search(r"^AccountingStorageType\s*=\s*(\S+)", out.stdout, re.MULTILINE)
    return out.returncode == 0 and m is not None and m.group(1) != "accounting_storage/none"


@dataclass(kw_only=True, frozen=True)
class SlurmInfo:
    """What SLURM says about a job: state (e.g. COMPLETED), exit status and signal, reason, log path."""

    state: str
    exit_status: int | None
    signal: int
    reason: str = ""
    stdout_path: str = ""
    restarts: int = 0


def _field(text: str, key: str) -> str:
    m = re.search(rf"(?:^|\s){re.escape(key)}=(\S*)", text)
    return m.group(1) if m else ""


def _exit_code(value: str) -> tuple[int | None, int]:
    m = re.fullmatch(r"(\d+):(\d+)", value)
    return (int(m.group(1)), int(m.group(2))) if m else (None, 0)


class SlurmJob(Job):
    """A job submitted with sbatch. Create it with harness.jobs.launch(spec)."""

    def __init__(self, spec: JobSpec):
        self.spec = spec
        self.result: JobResult | None = None
        self.script_path = spec.log_path.with_name(spec.log_path.name + ".sbatch")
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.script_path, render_sbatch(spec))
        # slurmd writes the log; the harness stamps its lines as they appear (see FileTail). An old
        # log at the same path would have its lines stamped as new, so it goes first.
        spec.log_path.unlink(missing_ok=True)
        self.line_times_path = spec.log_path.with_name(spec.log_path.name + ".times")
        self._t0 = time.monotonic()
        self._failures = 0
        out = _run(["sbatch", "--parsable", str(self.script_path)], env=settings.child_env(spec.env), cwd=spec.cwd)
        if out.returncode != 0:
            why = (out.stderr.strip() or out.stdout.strip() or "no message").replace("\n", " | ")
            raise SubmitError(f"sbatch refused job {spec.name!r} (exit {out.returncode}): {why}")
        job_id = out.stdout.strip().split(";")[0]  # --parsable: "ID" or "ID;cluster"
        if not job_id.isdigit():
            raise SubmitError(f"sbatch accepted job {spec.name!r} but printed {out.stdout!r}, not a job id")
        self.job_id = job_id
        self._tail = FileTail(spec.log_path, self.line_times_path, t0=self._t0, on_line=spec.on_line)

    # --- queries ----------------------------------------------------------------------------

    def _transient(self, what: str, out: subprocess.CompletedProcess[str]) -> None:
        self._failures += 1
        if self._failures >= _TRANSIENT_FAILURES:
            raise JobError(f"{what} for job {self.job_id} failed {self._failures} times in a row: {out.stderr.strip()}")

    def queue_state(self) -> str:
        """squeue's state of the job ("" when squeue no longer lists it)."""
        out = _run(["squeue", "-h", "-j", self.job_id, "-o", "%T"])
        if out.returncode != 0:
            if "Invalid job id" in out.stderr:
                return ""
            self._transient("squeue", out)
            return "UNKNOWN"
        self._failures = 0
        return out.stdout.strip()

    def info(self) -> SlurmInfo | None:
        """scontrol's view of the job, else sacct's; None when SLURM has forgotten it."""
        out = _run(["scontrol", "show", "job", "-o", self.job_id])
        if out.returncode == 0 and out.stdout.strip():
            text = out.stdout
            status, sig = _exit_code(_field(text, "ExitCode"))
            return SlurmInfo(state=_field(text, "JobState"), exit_status=status, signal=sig,
                             reason=_field(text, "Reason"), stdout_path=_field(text, "StdOut"),
                             restarts=int(_field(text, "Restarts") or 0))
        if "Invalid job id" not in out.stderr:
            self._transient("scontrol show job", out)
            return SlurmInfo(state="UNKNOWN", exit_status=None, signal=0)
        if accounting_enabled():
            acct = _run(["sacct", "-n", "-X", "-P", "-j", self.job_id, "-o", "State,ExitCode"])
            rows = [r for r in acct.stdout.splitlines() if r.strip()]
            if acct.returncode == 0 and rows:
                state, _, code = rows[0].partition("|")
                status, sig = _exit_code(code.strip())
                return SlurmInfo(state=state.split()[0], exit_status=status, signal=sig, reason="from sacct")
        return None

    # --- Job ----------------------------------------------------------------------------------

    def poll(self) -> JobResult | None:
        if self.result is not None:
            return self.result
        queued = self.queue_state()
        if queued and queued not in _FINAL:
            return self._check_timeout()
        info = self.info()
        if info is None:
            return self._finish(None, None, "SLURM no longer knows the job and has no accounting: exit status unknown")
        if info.state not in _FINAL:
            return self._check_timeout()  # e.g. COMPLETING, or requeued and PENDING again
        return self._finish(None, info)

    def _check_timeout(self) -> JobResult | None:
        if self.spec.timeout_s is not None and time.monotonic() - self._t0 > self.spec.timeout_s:
            return self._stop("timeout", f"timed out after {self.spec.timeout_s:g} s; scancel'ed")
        return None

    def cancel(self) -> JobResult:
        if self.result is not None:
            return self.result
        return self._stop("cancelled", "cancelled by the harness (scancel)")

    def _stop(self, state: JobState, why: str) -> JobResult:
        out = _run(["scancel", self.job_id])
        if out.returncode != 0:
            why += f"; scancel said: {out.stderr.strip()}"
        deadline = time.monotonic() + _STOP_WAIT_S
        info = self.info()
        while info is not None and info.state not in _FINAL and time.monotonic() < deadline:
            time.sleep(0.2)
            info = self.info()
        if info is not None and info.state == "COMPLETED":
            return self._finish(None, info)  # it ended on its own before scancel landed
        if info is not None and info.state not in _FINAL:
            why += f"; SLURM still reports {info.state} {_STOP_WAIT_S:g} s after scancel"
        return self._finish(state, info, why)

    def _finish(self, state: JobState | None, info: SlurmInfo | None, detail: str = "") -> JobResult:
        parts = [detail] if detail else []
        self._tail.close()
        if self._tail.restarts:
            parts.append(f"the log was rewritten from its start {self._tail.restarts} time(s) while the job ran")
        exit_code = sig = None
        if info is not None:
            if state is None:
                state = _FINAL[info.state]
            exit_code, sig = info.exit_status, info.signal or None
            if sig and not exit_code:
                exit_code = 128 + sig
            parts.append(f"SLURM state {info.state}" + (f" ({info.reason})" if info.reason not in ("", "None") else ""))
            if info.restarts:
                parts.append(f"requeued {info.restarts} time(s)")
            if info.stdout_path and Path(info.stdout_path) != self.spec.log_path:
                parts.append(f"SLURM wrote the log to {info.stdout_path}")
        self.result = JobResult(
            name=self.spec.name, state=state or "failed", exit_code=exit_code, signal=sig,
            log_path=self.spec.log_path, elapsed_s=time.monotonic() - self._t0, job_id=self.job_id,
            launcher="slurm", detail="; ".join(parts), script_path=self.script_path,
            line_times_path=self.line_times_path,
        )
        return self.result
