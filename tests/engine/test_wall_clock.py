"""--max-wall-s and --warmdown-frac (issue 14): stop by time, the LR warmdown planned against the budget.

The trainer reads an injected clock (tests.parallel.workers.TickClock: every read advances it by one tick, and
the loop reads it once at its start and once per step), so these tests never depend on how fast this machine is:
after step k the elapsed training time is exactly k x tick (ticks are binary fractions, so the sums are exact).
The learning rate of every step is compared with the formula written out below (not the engine's code):
warmup by steps, then progress p = max((s + 1) / N, elapsed / S) for 0-based step s, with the elapsed time as
agreed when the step starts, and lr = peak - (peak - floor) x clamp((p - (1 - F)) / F, 0, 1); rel. 1e-12 (one
float64 formula against another).
"""

import json
import math
from pathlib import Path

import pytest
import torch

from engine.config import build_config, resolve
from engine.distributed import ParallelState
from engine.errors import ConfigError
from engine.optim import lr_at
from engine.train import Trainer
from tests.parallel.workers import TickClock, make_config

# 100 steps would take minutes; the budget of 10 s at 1.5 s a step stops the run after step 7 (10.5 s >= 10 s).
BUDGET = dict(num_steps=100, lr_schedule="wsd", warmdown_frac=0.5, warmup_steps=0, max_wall_s=10.0, save_every=2,
              save_final=True, lr=1e-3, min_lr_ratio=0.1)
TICK = 1.5


def expected_lr(step: int, elapsed: float, *, lr: float, min_lr_ratio: float, num_steps: int, max_wall_s: float,
                warmdown_frac: float, warmup_steps: int) -> float:
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = min(1.0, max((step + 1) / num_steps, elapsed / max_wall_s if max_wall_s else 0.0))
    into = min(1.0, max(0.0, (progress - (1.0 - warmdown_frac)) / warmdown_frac))
    return lr - (lr - lr * min_lr_ratio) * into


def _records(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def _run(overrides: dict, run_dir: Path, tick: float) -> Trainer:
    cfg = make_config(overrides, 1, str(run_dir))
    trainer = Trainer(cfg, ParallelState.single(torch.device("cpu")), torch.float32, clock=TickClock(tick))
    assert trainer.run() == 0
    return trainer


def test_warmdown_without_a_budget_is_wsd_with_that_many_decay_steps():
    """The progress form of the decay equals engine's step form (decay_steps = F x N) at every step."""
    by_frac = resolve(build_config({"lr_schedule": "wsd", "warmdown_frac": 0.25, "num_steps": 80, "warmup_steps": 5}))
    by_steps = resolve(build_config({"lr_schedule": "wsd", "decay_steps": 20, "num_steps": 80, "warmup_steps": 5}))
    assert [lr_at(by_frac, s) for s in range(80)] == pytest.approx([lr_at(by_steps, s) for s in range(80)], rel=1e-12)


def test_time_progress_drives_the_warmdown():
    cfg = resolve(build_config({**BUDGET, "warmup_steps": 3}))
    for step, elapsed in [(0, 0.0), (2, 1.0), (3, 4.9), (3, 5.0), (5, 6.0), (9, 9.99), (9, 10.0), (50, 30.0), (99, 0.0)]:
        want = expected_lr(step, elapsed, lr=1e-3, min_lr_ratio=0.1, num_steps=100, max_wall_s=10.0, warmdown_frac=0.5,
                           warmup_steps=3)
        assert lr_at(cfg, step, elapsed) == pytest.approx(want, rel=1e-12), (step, elapsed)
    assert lr_at(cfg, 9, 10.0) == pytest.approx(1e-4) and lr_at(cfg, 3, 4.9) == 1e-3


def test_stops_by_time_with_final_eval_and_checkpoint_and_resumes_the_budget(tmp_path):
    first = _run(BUDGET, tmp_path / "a", TICK)
    stop = math.ceil(BUDGET["max_wall_s"] / TICK)  # 7
    assert (first.step, first.elapsed_s) == (stop, stop * TICK)
    losses = _records(tmp_path / "a", "loss")
    assert [r["step"] for r in losses] == list(range(1, stop + 1))
    assert [r["elapsed_s"] for r in losses] == [k * TICK for k in range(1, stop + 1)]
    spec = {k: BUDGET[k] for k in ("lr", "min_lr_ratio", "num_steps", "max_wall_s", "warmdown_frac", "warmup_steps")}
    want = [expected_lr(s, s * TICK, **spec) for s in range(stop)]
    assert [r["lr"] for r in losses] == pytest.approx(want, rel=1e-12)
    assert want[-1] < want[0] / 2  # the budget, not the 100 steps, brought the decay
    assert [r["step"] for r in _records(tmp_path / "a", "eval")] == [stop]
    assert (tmp_path / "a" / "checkpoints" / f"step_{stop:08d}" / "manifest.json").is_file()

    # Resumed from step 4 (6 s spent), the budget is the total: the same steps, learning rates and losses.
    resumed_cfg = make_config({**BUDGET, "resume": str(tmp_path / "a" / "checkpoints" / "step_00000004")}, 1,
                              str(tmp_path / "b"))
    resumed = Trainer(resumed_cfg, ParallelState.single(torch.device("cpu")), torch.float32, clock=TickClock(TICK))
    assert (resumed.step, resumed.elapsed_s) == (4, 4 * TICK)
    assert resumed.run() == 0 and resumed.step == stop
    again = _records(tmp_path / "b", "loss")
    assert [(r["step"], r["lr"], r["global_loss"]) for r in again] == [(r["step"], r["lr"], r["global_loss"])
                                                                       for r in losses[4:]]


def test_a_resume_with_another_budget_is_a_schedule_change(tmp_path):
    _run({**BUDGET, "max_wall_s": 3.0}, tmp_path / "a", TICK)  # stops after step 2
    ckpt = str(tmp_path / "a" / "checkpoints" / "step_00000002")
    with pytest.raises(ConfigError, match=r"--max-wall-s 3.0 -> 6.0"):
        Trainer(make_config({**BUDGET, "max_wall_s": 6.0, "resume": ckpt}, 1, str(tmp_path / "b")),
                ParallelState.single(torch.device("cpu")), torch.float32)


@pytest.mark.parametrize("overrides,field,fragment", [
    ({"max_wall_s": -1.0}, "--max-wall-s", "is out of range"),
    ({"max_wall_s": math.nan}, "--max-wall-s", "is not a finite number"),
    ({"max_wall_s": 60.0}, "--max-wall-s", "add --lr-schedule wsd --warmdown-frac F"),
    ({"max_wall_s": 60.0, "lr_schedule": "wsd"}, "--max-wall-s", "add --lr-schedule wsd --warmdown-frac F"),
    ({"warmdown_frac": 0.3}, "--warmdown-frac", "add --lr-schedule wsd"),
    ({"warmdown_frac": 1.5, "lr_schedule": "wsd"}, "--warmdown-frac", "use a fraction in (0, 1]"),
    ({"warmdown_frac": 0.3, "lr_schedule": "wsd", "decay_steps": 5}, "--decay-steps", "not both"),
    ({"max_wall_s": 60.0, "lr_schedule": "constant", "save_last": 1, "keep_last": 3}, "--save-last", "known last step"),
])
def test_bad_budget_flags_name_the_field_and_fix(overrides, field, fragment):
    with pytest.raises(ConfigError) as info:
        resolve(build_config(overrides))
    assert info.value.field == field and fragment in str(info.value)
