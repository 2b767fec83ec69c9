"""Helpers for engine tests: run the CLI as a real subprocess and parse its wire lines."""

import json
import re
import subprocess
import sys
from pathlib import Path

__all__ = ["REPO", "run_engine", "run_engine_batch", "check_rejected", "loss_lines", "eval_lines", "deterministic_fields", "TINY_FAST"]

REPO = Path(__file__).resolve().parents[2]

# Small enough for a few seconds per run on 2 CPU cores.
TINY_FAST = ["--preset", "tiny", "--device", "cpu", "--seq-length", "64", "--micro-batch-size", "4",
             "--eval-samples", "8", "--num-steps", "6", "--warmup-steps", "2"]

_LOSS = re.compile(r"^\[LOSS\] step=(\d+) global_loss=(\S+) grad_norm=(\S+) lr=(\S+) tokens=(\d+) time_s=(\S+) mfu=(\S+)$")


def run_engine(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "engine", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"engine exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    return proc


def run_engine_batch(argvs: list[list[str]], timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """`python -m engine ARGV` for each argv, all in one process (tests/engine/engine_batch.py): for refusals, which
    stop before any work, and short runs whose checks cannot pass by what an earlier run left in the process, so that
    torch is imported once. One CompletedProcess per argv, in order."""
    proc = subprocess.run([sys.executable, "-m", "tests.engine.engine_batch"], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, input="".join(json.dumps(a) + "\n" for a in argvs))
    assert proc.returncode == 0, f"the batch exited {proc.returncode}: {proc.stderr[-3000:]}"
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(results) == len(argvs), proc.stdout[-3000:] + proc.stderr[-3000:]
    return [subprocess.CompletedProcess([sys.executable, "-m", "engine", *a], r["rc"], r["stdout"], r["stderr"])
            for a, r in zip(argvs, results)]


def check_rejected(proc: subprocess.CompletedProcess, run_dir: Path, fragment: str, case: str = "") -> None:
    """A refusal: exit 2, one stderr line holding `fragment`, and `run_dir` never made."""
    assert proc.returncode == 2, (case, proc.stdout + proc.stderr)
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, (case, proc.stderr)
    assert fragment in lines[0], (case, lines[0])
    assert not run_dir.exists(), f"{case}: a rejected run must write nothing"


def loss_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("[LOSS]")]


def eval_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("[EVAL]")]


def deterministic_fields(line: str) -> tuple[str, ...]:
    """step, loss, grad norm, lr, tokens: everything in a [LOSS] line except wall time and MFU."""
    m = _LOSS.match(line)
    assert m, f"not a [LOSS] wire line: {line!r}"
    return m.groups()[:5]
