"""Learning-rate schedules, as pure functions of the optimizer step (0-based).

Why and how: docs/engine/optim.md, section `engine/optim/schedule.py`.
"""

import math

from engine.config import EngineConfig

__all__ = ["lr_at", "schedule_fields", "run_progress"]


def schedule_fields(lr_schedule: str, warmdown: bool = False) -> tuple[str, ...]:
    """The EngineConfig fields `lr_at` reads under `lr_schedule` (besides the name itself; `warmdown`: with
    --warmdown-frac on): a resume that changes one of them changes the learning rate of the steps still to come."""
    if lr_schedule == "constant":
        return ("lr", "warmup_steps")
    if lr_schedule == "wsd" and warmdown:
        return ("lr", "min_lr_ratio", "warmup_steps", "warmdown_frac", "num_steps", "max_wall_s")
    if lr_schedule == "wsd":
        return ("lr", "min_lr_ratio", "warmup_steps", "decay_steps", "num_steps", "warmdown_frac")
    return ("lr", "min_lr_ratio", "warmup_steps", "num_steps")


def run_progress(cfg: EngineConfig, step: int, elapsed_s: float) -> float:
    """How far through the run step `step` (0-based) ends, in [0, 1]: by steps, or by the wall-clock budget
    as spent when the step starts (`elapsed_s`, the same on every rank), whichever is further."""
    progress = (step + 1) / cfg.num_steps
    if cfg.max_wall_s > 0:
        progress = max(progress, elapsed_s / cfg.max_wall_s)
    return min(1.0, progress)


def lr_at(cfg: EngineConfig, step: int, elapsed_s: float = 0.0) -> float:
    peak, floor = cfg.lr, cfg.lr * cfg.min_lr_ratio
    if step < cfg.warmup_steps:
        return peak * (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return peak
    if cfg.lr_schedule == "wsd" and cfg.warmdown_frac > 0:
        into = (run_progress(cfg, step, elapsed_s) - (1.0 - cfg.warmdown_frac)) / cfg.warmdown_frac
        return peak + (floor - peak) * min(1.0, max(0.0, into))
    if cfg.lr_schedule == "wsd":
        decay = cfg.decay_steps or max(1, round(0.1 * cfg.num_steps))
        start = cfg.num_steps - decay
        if step < start:
            return peak
        progress = min(1.0, (step - start + 1) / decay)
        return peak + (floor - peak) * progress
    span = max(1, cfg.num_steps - 1 - cfg.warmup_steps)  # steps from the first after warmup to the last
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    if cfg.lr_schedule == "linear":
        return peak + (floor - peak) * progress
    if cfg.lr_schedule == "cosine":
        return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr_schedule {cfg.lr_schedule!r}")
