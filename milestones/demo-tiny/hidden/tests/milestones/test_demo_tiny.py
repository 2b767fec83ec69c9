"""Acceptance test of milestone demo-tiny: the `inverse_sqrt` learning-rate schedule.

Held out: it lives in milestones/demo-tiny/hidden/ and the judge copies it into the checkout it
judges, never into the agent's worktree. It runs the real engine in a subprocess and reads the
learning rate from the `[LOSS]` wire lines; the expected values come from the formula in the
milestone's goal, written out here independently of the engine. Peak, warmup, step count and the
engine's --seed (a small one people type or a large one past 32 bits) are drawn from the judge's secret
(TEMPER_JUDGE_SEED, a new one each judging), so no fixed input can be special-cased. The judge's own jobs
run longer and wider configurations of the same secret and hold the same formula at every step
(milestones/demo-tiny.toml, harness/judge/claims/contract.py).
"""

import math
import os
import random
import re
import subprocess
import sys

import pytest

LOSS_LR = re.compile(r"^\[LOSS\] step=(\d+) .*?\blr=(\S+)", re.MULTILINE)
_draw = random.Random(int(os.environ.get("TEMPER_JUDGE_SEED", "1234")))
PEAK = round(_draw.uniform(2e-3, 2e-2), 6)
WARMUP = _draw.randint(2, 6)
STEPS = WARMUP + _draw.randint(5, 9)
SEED = _draw.choice((_draw.randint(0, 100), _draw.randint(2**32, 2**63 - 1)))
# `lr=%.6e` keeps 7 significant digits: the printed value is within 5e-7 relative of the true one.
REL_TOL = 1e-6


def reference_lr(step: int) -> float:
    w = max(WARMUP, 1)
    return 0.0 if step <= 0 else PEAK * min(step / w, math.sqrt(w / step))


def run_engine(*flags: str, run_dir) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "engine", "pretrain", "--preset", "tiny", "--device", "cpu", "--seed", str(SEED),
            "--eval-samples", "0", "--no-save-final", "--run-dir", str(run_dir), *flags]
    return subprocess.run(argv, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def logged_lrs(tmp_path_factory) -> dict[int, float]:
    proc = run_engine("--num-steps", str(STEPS), "--warmup-steps", str(WARMUP), "--lr", str(PEAK),
                      "--lr-schedule", "inverse_sqrt", run_dir=tmp_path_factory.mktemp("run"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lrs = {int(step): float(lr) for step, lr in LOSS_LR.findall(proc.stdout + proc.stderr)}
    assert lrs, "no [LOSS] lines in the engine's output"
    return lrs


def test_every_step_is_logged(logged_lrs):
    assert len(logged_lrs) == STEPS


def test_warmup_is_linear_to_the_peak(logged_lrs):
    for step in (s for s in logged_lrs if s <= WARMUP):
        assert logged_lrs[step] == pytest.approx(reference_lr(step), rel=REL_TOL, abs=1e-12), step


def test_decay_is_inverse_square_root(logged_lrs):
    later = [s for s in logged_lrs if s > WARMUP]
    assert later, "no step after the warmup was logged"
    for step in later:
        assert logged_lrs[step] == pytest.approx(reference_lr(step), rel=REL_TOL), step


def test_unknown_schedule_names_the_new_choice(tmp_path):
    proc = run_engine("--num-steps", "1", "--lr-schedule", "inverse-sqrt-typo", run_dir=tmp_path)
    assert proc.returncode == 2
    assert "inverse_sqrt" in proc.stderr
