"""Run the engine under the real launcher, `python -m torch.distributed.run` (torchrun), as a subprocess."""

import subprocess
import sys

from tests.engine.helpers import REPO

__all__ = ["torchrun", "TINY_DP"]

# tiny, fp32 on CPU, global batch 4 at every layout below; 0.3 MB buckets: ~6 buckets at TP 1, ~3 at TP 2
TINY_DP = ["--preset", "tiny", "--device", "cpu", "--seq-length", "64", "--eval-samples", "0", "--warmup-steps", "2",
           "--ddp-bucket-mb", "0.3"]


def torchrun(nproc: int, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc-per-node N -m engine ARGS` (standalone: a free local rendezvous port)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "-m", "engine", *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"torchrun exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc
