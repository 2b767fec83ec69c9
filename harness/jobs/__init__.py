"""Job launchers: run a JobSpec locally (subprocess / torchrun) or under SLURM (sbatch), wait for it,
stop it on timeout or Ctrl-C, and hand back a JobResult with its log.

    job = launch(JobSpec(name="train", argv=["-m", "engine", "pretrain"], torchrun=True, nproc=8,
                         log_path=run_dir / "train.log", timeout_s=3600))
    result = job.wait()

Candidate code runs sandboxed: JobSpec(..., sandbox=Sandbox(writable=(job_dir,), hidden=(...))), after
`probe()` returned None (harness.jobs.sandbox). Every process is run by harness.jobs.process.
"""

from harness.jobs.local import LocalJob
from harness.jobs.sandbox import Sandbox, SandboxUnavailable, overlay_changes, probe
from harness.jobs.slurm import SlurmJob
from harness.jobs.jobspec import (
    TERMINAL_STATES,
    Job,
    JobError,
    JobResult,
    JobSpec,
    JobState,
    SubmitError,
)

__all__ = [
    "launch",
    "Job",
    "JobSpec",
    "JobResult",
    "JobState",
    "JobError",
    "SubmitError",
    "LocalJob",
    "overlay_changes",
    "SlurmJob",
    "TERMINAL_STATES",
    "Sandbox",
    "SandboxUnavailable",
    "probe",
]


def launch(spec: JobSpec) -> Job:
    """Start `spec` on its launcher and return the running job (raises SubmitError if refused)."""
    if spec.launcher == "local":
        return LocalJob(spec)
    if spec.launcher == "slurm":
        return SlurmJob(spec)
    raise ValueError(f"job {spec.name!r}: unknown launcher {spec.launcher!r}")
