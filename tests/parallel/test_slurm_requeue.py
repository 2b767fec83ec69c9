"""scripts/slurm/pretrain.sbatch on the real local SLURM (CPU, one node, NPROC_PER_NODE processes with
--gpus-per-node=0): a job runs srun -> torchrun (c10d rendezvous on the node's host name) -> the engine to
completion and leaves its checkpoint; USR1 to the batch shell reaches the engine through srun and torchrun,
the engine checkpoints at its next step boundary and exits 0, and the script requeues the job. (The
requeued start is not waited for: SLURM holds a requeued job for minutes; docs/parallelism.md records a
full cycle.)"""

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.engine.helpers import REPO

# The real local SLURM of the `slurm` fixture (tests/conftest.py: started once, skipped where it cannot be); an sbatch
# on PATH is not enough (the client can be installed with no controller running). Slow: a training job under
# sbatch, srun and torchrun, signalled and requeued.
pytestmark = [pytest.mark.slow, pytest.mark.slurm]

SCRIPT = REPO / "scripts" / "slurm" / "pretrain.sbatch"


def wait_for(path: Path, text: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = path.read_text() if path.exists() else ""
        if text in content:
            return content
        time.sleep(0.5)
    raise AssertionError(f"{text!r} not in {path} after {timeout} s:\n{content[-3000:]}")


def submit(log: Path, nproc: int, *flags: str) -> str:
    """sbatch the script on this one node, CPU only; the job id."""
    out = subprocess.run(["sbatch", "--parsable", "--gpus-per-node=0", "--exclusive", f"--output={log}", str(SCRIPT),
                          "--device", "cpu", *flags],
                         cwd=REPO, capture_output=True, text=True, check=True, env={**os.environ, "NPROC_PER_NODE": str(nproc)})
    return out.stdout.strip().split(";")[0]


def test_runs_to_completion_and_writes_its_checkpoint(slurm: None, tmp_path: Path) -> None:
    """1 node x 2 processes, TP 2, 3 steps: the job ends COMPLETED with exit 0 and the final checkpoint published."""
    log, run_dir = tmp_path / "job.out", tmp_path / "run"
    job = submit(log, 2, "--preset", "tiny", "--tp", "2", "--seq-length", "64", "--micro-batch-size", "2",
                 "--eval-samples", "0", "--num-steps", "3", "--warmup-steps", "1", "--save-every", "3",
                 "--run-dir", str(run_dir))
    try:
        text = wait_for(log, "[slurm] done: exit", 300)
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    assert "[slurm] done: exit 0" in text, text[-3000:]
    assert "rendezvous " in text and "layout launcher=torchrun world=2 tp=2 dp=1 nodes=1 per_node=2" in text
    assert "[LOSS] step=3 " in text
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert latest == "step_00000003" and (run_dir / "checkpoints" / latest / "meta.json").is_file()


def test_usr1_checkpoints_and_requeues(slurm: None, tmp_path: Path) -> None:
    for script in SCRIPT.parent.glob("*.sbatch"):
        subprocess.run(["bash", "-n", str(script)], check=True)
    log, run_dir = tmp_path / "job.out", tmp_path / "run"
    job = submit(log, 1, "--preset", "tiny", "--seq-length", "64", "--micro-batch-size", "2", "--eval-samples", "0",
                 "--num-steps", "100000", "--warmup-steps", "1", "--run-dir", str(run_dir))
    try:
        wait_for(log, "[LOSS] step=2 ", 120)
        subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True)
        text = wait_for(log, "[slurm] requeueing job", 120)
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    assert "stopped by SIGUSR1 at step" in text
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert (run_dir / "checkpoints" / latest / "meta.json").is_file()

