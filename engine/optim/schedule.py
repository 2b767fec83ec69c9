"""Learning-rate schedules, as pure functions of the optimizer step (0-based).

All share a linear warmup from lr / warmup to lr over `warmup_steps`, then:
- cosine: half a cosine from lr to min_lr over the remaining steps;
- linear: a straight line from lr to min_lr;
- constant: lr;
- wsd (warmup-stable-decay, MiniCPM): lr until the last `decay_steps` (default 10% of the run),
  then linearly down to min_lr. A run can branch off the stable phase at any step and decay.
Being a function of the step alone, the schedule needs no state in a checkpoint beyond the step.
"""

import math

from engine.config import EngineConfig

__all__ = ["lr_at", "schedule_fields"]


def schedule_fields(lr_schedule: str) -> tuple[str, ...]:
    """The EngineConfig fields `lr_at` reads under `lr_schedule` (besides the name itself): a resume
    that changes one of them changes the learning rate of the steps still to come."""
    if lr_schedule == "constant":
        return ("lr", "warmup_steps")
    if lr_schedule == "wsd":
        return ("lr", "min_lr_ratio", "warmup_steps", "decay_steps", "num_steps")
    return ("lr", "min_lr_ratio", "warmup_steps", "num_steps")


def lr_at(cfg: EngineConfig, step: int) -> float:
    peak, floor = cfg.lr, cfg.lr * cfg.min_lr_ratio
    if step < cfg.warmup_steps:
        return peak * (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return peak
    if cfg.lr_schedule == "wsd":
        decay = cfg.decay_steps or max(1, round(0.1 * cfg.num_steps))
        start = cfg.num_steps - decay
        if step < start:
            return peak
        progress = min(1.0, (step - start + 1) / decay)
        return peak + (floor - peak) * progress
    span = max(1, cfg.num_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    if cfg.lr_schedule == "linear":
        return peak + (floor - peak) * progress
    if cfg.lr_schedule == "cosine":
        return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr_schedule {cfg.lr_schedule!r}")
