"""Skipping the optimizer step of a batch whose loss spikes (optional, off by default).

Why and how: docs/engine/optim.md, section `engine/optim/spike.py`.
"""

import math

import torch
import torch.distributed as dist

from engine.config import EngineConfig
from engine.distributed import ParallelState
from engine.errors import TrainingDiverged

__all__ = ["LossSpikeGuard"]


class LossSpikeGuard:
    def __init__(self, cfg: EngineConfig, par: ParallelState):
        self.factor, self.window, self.limit = cfg.skip_spike_factor, cfg.skip_spike_window, cfg.skip_spike_max_consecutive
        self.par = par
        self.history = torch.full((self.window,), math.nan, dtype=torch.float64)  # oldest first; nan = empty
        self.consecutive = 0
        self.skipped_total = 0
        self.skipped = False  # the decision on the last loss checked
        self.running_mean = math.nan  # the mean that decision was read against

    @property
    def enabled(self) -> bool:
        return self.factor > 0

    def check(self, loss: float, step: int) -> bool:
        """True: skip this step's update. Collective over every rank when enabled (call on all ranks)."""
        self.skipped = False
        if not self.enabled:
            return False
        full = not bool(torch.isnan(self.history).any())
        self.running_mean = float(self.history.mean()) if full else math.nan
        spike = full and loss > self.factor * self.running_mean
        if self.par.world_size > 1:
            flag = torch.tensor(1 if spike else 0, device=self.par.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            spike = bool(flag.item())
        if not spike:
            self.consecutive = 0
            self.history = torch.cat([self.history[1:], torch.tensor([loss], dtype=torch.float64)])
            return False
        self.skipped = True
        self.consecutive += 1
        self.skipped_total += 1
        if self.consecutive >= self.limit:
            raise TrainingDiverged(
                f"step {step}: {self.consecutive} batches in a row skipped as loss spikes (last loss {loss:.6g} > "
                f"--skip-spike-factor {self.factor:g} x running mean {self.running_mean:.6g} of the last "
                f"{self.window} steps); the run is diverging or the data is bad: inspect those batches, lower --lr, "
                f"or raise --skip-spike-factor / --skip-spike-max-consecutive")
        return True

    def state_dict(self) -> dict:
        return {"history": self.history, "consecutive": self.consecutive, "skipped_total": self.skipped_total}

    def load_state_dict(self, state: dict) -> None:
        self.history = state["history"].to(torch.float64).clone()
        self.consecutive, self.skipped_total = int(state["consecutive"]), int(state["skipped_total"])
