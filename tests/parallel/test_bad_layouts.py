"""Bad parallel layouts: one line naming the fields, values and the fix, exit code 2, nothing written.

The process count comes from the launcher's environment (RANK / WORLD_SIZE), so a single process
that is told it is rank 0 of 3 sees exactly what torchrun's rank 0 would, and is refused before any
rendezvous. One real torchrun launch checks what a user sees there: one engine line, not one per rank.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.config import build_config, resolve
from engine.errors import ConfigError
from tests.engine.helpers import REPO, TINY_FAST
from tests.parallel.launch import torchrun


def launched_as(rank: int, world: int, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
           "LOCAL_WORLD_SIZE": str(world)}
    return subprocess.run([sys.executable, "-m", "engine", "pretrain", *TINY_FAST, "--run-dir", str(tmp_path / "run"),
                           *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_tp_not_dividing_the_world_size(tmp_path):
    proc = launched_as(0, 3, tmp_path, "--tp", "2")
    assert proc.returncode == 2, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert lines == ["error: --tp=2 does not divide the number of processes (3): use a divisor of the world size 3, or "
                     "launch with torchrun --nproc-per-node 2 (or a multiple of 2) -m engine pretrain ..."], lines
    assert not (tmp_path / "run").exists()


def test_other_ranks_exit_2_without_repeating_the_line(tmp_path):
    proc = launched_as(1, 3, tmp_path, "--tp", "2")
    assert proc.returncode == 2 and proc.stderr.strip() == "", proc.stderr


def test_torchrun_shows_one_engine_line(tmp_path):
    proc = torchrun(2, "pretrain", *TINY_FAST, "--tp", "4", "--run-dir", str(tmp_path / "run"), check=False)
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert errors == ["error: --tp=4 does not divide the number of processes (2): use a divisor of the world size 2, or "
                      "launch with torchrun --nproc-per-node 4 (or a multiple of 4) -m engine pretrain ..."], proc.stderr
    assert "exitcode  : 2" in proc.stderr  # torchrun's own summary; torchrun itself exits 1
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides, world, fragment", [
    ({"tp": 3}, 3, "--tp=3 does not divide the query heads: use a TP size that divides --num-heads 4"),
    ({"tp": 6, "num_heads": 12, "num_kv_heads": 4}, 6,
     "--tp=6 neither divides nor is divided by the KV heads: use a TP size that divides --num-kv-heads 4 or is a multiple of it"),
    ({"tp": 2, "micro_batch_size": 2, "grad_accum_steps": 2, "global_batch_size": 4}, 4,
     "global batch 4 != mbs 2 x GAS 2 x DP 2"),
    ({"tp": 2, "sequence_parallel": True, "seq_length": 63}, 2, "--seq-length=63"),
    ({"ddp_bucket_mb": 0.0}, 1, "--ddp-bucket-mb=0.0"),
])
def test_layout_errors_name_the_field_and_the_fix(overrides, world, fragment):
    with pytest.raises(ConfigError) as err:
        resolve(build_config({"preset": "tiny", **overrides}), world)
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_more_tp_ranks_than_kv_heads_is_a_layout_not_an_error():
    cfg = resolve(build_config({"preset": "tiny", "tp": 4, "num_kv_heads": 2}), 8)
    assert (cfg.tp, cfg.dp_size_hint) == (4, 2)
    assert resolve(build_config({"preset": "tiny", "sequence_parallel": True}), 2).sequence_parallel is False  # TP 1
