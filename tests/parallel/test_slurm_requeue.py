"""scripts/slurm/pretrain_single_node.sbatch on the real local SLURM (CPU): USR1 to the batch shell
reaches the engine through srun and torchrun, the engine checkpoints at its next step boundary and
exits 0, and the script requeues the job. (The requeued start is not waited for: SLURM holds a
requeued job for minutes; docs/parallelism.md records a full cycle.)"""

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.engine.helpers import REPO

# The real local SLURM of the `slurm` fixture (tests/conftest.py: started once, skipped where it cannot be); an sbatch
# on PATH is not enough (the client can be installed with no controller running). Slow: a training job under
# sbatch, srun and torchrun, signalled and requeued.
pytestmark = pytest.mark.slow

SCRIPT = REPO / "scripts" / "slurm" / "pretrain_single_node.sbatch"


def wait_for(path: Path, text: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = path.read_text() if path.exists() else ""
        if text in content:
            return content
        time.sleep(0.5)
    raise AssertionError(f"{text!r} not in {path} after {timeout} s:\n{content[-3000:]}")


def test_usr1_checkpoints_and_requeues(slurm: None, tmp_path: Path) -> None:
    for script in SCRIPT.parent.glob("*.sbatch"):
        subprocess.run(["bash", "-n", str(script)], check=True)
    log, run_dir = tmp_path / "job.out", tmp_path / "run"
    submit = subprocess.run(
        ["sbatch", "--parsable", "--gpus-per-node=0", "--exclusive", f"--output={log}", str(SCRIPT),
         "--preset", "tiny", "--device", "cpu", "--seq-length", "64", "--micro-batch-size", "2", "--eval-samples", "0",
         "--num-steps", "100000", "--warmup-steps", "1", "--run-dir", str(run_dir)],
        cwd=REPO, capture_output=True, text=True, check=True, env={**os.environ, "NPROC_PER_NODE": "1"})
    job = submit.stdout.strip().split(";")[0]
    try:
        wait_for(log, "[LOSS] step=2 ", 120)
        subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True)
        text = wait_for(log, "[slurm] requeueing job", 120)
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    assert "stopped by SIGUSR1 at step" in text
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert (run_dir / "checkpoints" / latest / "meta.json").is_file()

