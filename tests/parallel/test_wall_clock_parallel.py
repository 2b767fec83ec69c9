"""--max-wall-s on two real gloo processes (DP 2): the ranks agree on when to stop.

Rank 0 reads a fake clock that advances 1 s per read, rank 1 one that advances 3 s (an artificially slow rank;
the trainer reads its clock once when the loop starts and once per step: tests/parallel/workers.TickClock).
Left to itself rank 0 would train 10 steps of the 10 s budget and rank 1 only 4, and whichever stopped first
would leave the other waiting in the next all-reduce. The agreed time is the slowest rank's (an all-reduce MAX
every step), so both stop after step 4 (12 s >= 10 s), evaluate and checkpoint; the learning rates follow the
independent formula of tests/engine/test_wall_clock.py with the slow rank's times (rel. 1e-12).
"""

import json

import pytest

from tests.engine.test_wall_clock import BUDGET, expected_lr
from tests.parallel.workers import spawn_runs


def test_a_slow_rank_and_a_fast_one_stop_after_the_same_step(tmp_path):
    run_dir = tmp_path / "run"
    ranks = spawn_runs(2, {**BUDGET, "micro_batch_size": 2}, run_dir, [1.0, 3.0], tmp_path)
    assert [(r["rank"], r["code"], r["step"], r["elapsed_s"]) for r in ranks] == [(0, 0, 4, 12.0), (1, 0, 4, 12.0)]
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r for r in records if r["kind"] == "loss"]
    spec = {k: BUDGET[k] for k in ("lr", "min_lr_ratio", "num_steps", "max_wall_s", "warmdown_frac", "warmup_steps")}
    assert [r["lr"] for r in losses] == pytest.approx([expected_lr(s, 3.0 * s, **spec) for s in range(4)], rel=1e-12)
    assert [r["elapsed_s"] for r in losses] == [3.0, 6.0, 9.0, 12.0]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [4]
    assert (run_dir / "checkpoints" / "step_00000004" / "manifest.json").is_file()
