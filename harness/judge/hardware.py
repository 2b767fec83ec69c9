"""The hardware the judge itself sees, held against a milestone's `requires`.

The judge asks the machine (nvidia-smi, sbatch/sinfo), never the candidate: a job that claims to have
run on eight H100s proves nothing. Where the machine falls short, `check_requires` raises
NeedsHardware ("needs 8 x H100/H200 GPUs; this machine has 0"): `temper gate` reports that as a
status of its own, not as a rejection.
"""

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.spec import JobGate, Milestone, NeedsHardware, Requires

__all__ = ["Machine", "NeedsHardware", "probe_machine", "check_requires", "check_data", "gpu_processes",
           "wait_watching_gpus"]


@dataclass(frozen=True)
class Machine:
    gpus: tuple[str, ...]  # device names, one per visible GPU
    slurm: bool


def probe_machine(slurm: bool = True) -> Machine:
    """The GPUs nvidia-smi lists and, when `slurm`, whether a SLURM controller answers. Asked only when needed:
    where the SLURM client is installed but no controller runs, `sinfo` takes seconds to give up."""
    names: tuple[str, ...] = ()
    smi = shutil.which("nvidia-smi")
    if smi:
        proc = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=60)
        if proc.returncode == 0:
            names = tuple(line.strip() for line in proc.stdout.splitlines() if line.strip())
    answers = False
    if slurm and shutil.which("sbatch") and shutil.which("sinfo"):
        answers = subprocess.run(["sinfo", "-h"], capture_output=True, timeout=30).returncode == 0
    return Machine(gpus=names, slurm=answers)


def _matching(requires: Requires, machine: Machine) -> list[str]:
    if not requires.gpu_types:
        return list(machine.gpus)
    return [n for n in machine.gpus if any(t.lower() in n.lower() for t in requires.gpu_types)]


def check_requires(requires: Requires, machine: Machine | None = None) -> str:
    """The device jobs run on ("cuda" or "cpu"); NeedsHardware when this machine cannot judge."""
    machine = machine or probe_machine(slurm=requires.slurm)
    if requires.slurm and not machine.slurm:
        raise NeedsHardware(f"needs {requires.describe()}; no SLURM controller answers here (sinfo)")
    if requires.device == "cpu":
        return "cpu"
    usable = _matching(requires, machine)
    if len(usable) >= max(requires.gpus, 1):
        return "cuda"
    if requires.device == "any" and not machine.gpus:
        return "cpu"
    have = ", ".join(machine.gpus) or "no GPU"
    raise NeedsHardware(f"needs {requires.describe()}; this machine has {len(machine.gpus)} ({have})")


def check_data(milestone: Milestone, data: Path) -> None:
    """NeedsHardware naming every path of the shared data folder (`{data}/...` in a job's argv) that this machine
    lacks: without the corpus a job would fail and the candidate would be rejected for the machine's fault."""
    wanted = sorted({arg[arg.index("{data}"):].removeprefix("{data}").lstrip("/") for g in milestone.gates
                     if isinstance(g, JobGate) for arg in g.argv if "{data}" in arg})
    missing = [w for w in wanted if not (data / w).exists()]
    if missing:
        raise NeedsHardware(f"needs the shared data folder's {', '.join(missing)}; {data} lacks "
                            f"{'them' if len(missing) > 1 else 'it'} (set TEMPER_DATA to the folder that holds them)")


def gpu_processes() -> dict[int, str]:
    """{host pid: GPU uuid} of every process with a CUDA context, as nvidia-smi (the driver) reports them."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return {}
    proc = subprocess.run([smi, "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"], capture_output=True,
                          text=True, timeout=30)
    out = {}
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        pid, _, uuid = line.partition(",")
        if pid.strip().isdigit():
            out[int(pid)] = uuid.strip()
    return out


def wait_watching_gpus(job: Any, sample_s: float = 2.0) -> tuple[Any, set[str]]:
    """Wait for a local job (harness.jobs.LocalJob) and collect the uuid of every GPU the driver shows one
    of its processes on, sampled every `sample_s`: the judge's own count of the GPUs a job used."""
    seen: set[str] = set()
    last = -sample_s
    try:
        while (result := job.poll()) is None:
            if time.monotonic() - last >= sample_s:
                last = time.monotonic()
                members = job.member_pids()
                seen |= {uuid for pid, uuid in gpu_processes().items() if pid in members}
            time.sleep(0.25)
    except KeyboardInterrupt:
        job.cancel()
        raise
    return result, seen
