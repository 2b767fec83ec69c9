"""What the GPU benchmark scripts share: the relative error they check with, the event timer, the launcher.

METHOD.md (device tool): compare with ||x - ref|| / ||ref|| in float64 (non-finite never passes),
time with device events after a warm-up call, take the median, rotate among input sets so repeated
calls do not measure the cache.
"""

import math
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["rel_err", "median_call_ms", "torchrun", "launcher"]


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64; inf when x has NaN/Inf; a zero ref counts as norm 1."""
    x, ref = x.detach().double(), ref.detach().double()
    if not torch.isfinite(x).all():
        return math.inf
    denom = ref.norm().item()
    return (x - ref).norm().item() / (denom if denom > 0 else 1.0)


def median_call_ms(fn: Callable[[Any], Any], sets: Sequence[Any], iters: int, *, warm: bool = True) -> float:
    """Median device time (ms) of one call of fn(sets[i % len(sets)]), events around each call."""
    if warm:
        fn(sets[0])
        torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(iters):
        start.record()
        fn(sets[i % len(sets)])
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def torchrun(nproc: int) -> list[str]:
    """`torchrun --standalone --nproc-per-node N` under this Python (standalone: a free local rendezvous port)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]


def launcher(nproc: int) -> list[str]:
    """How a bench starts `-m engine ...`: this Python for one process, torchrun for several."""
    return torchrun(nproc) if nproc > 1 else [sys.executable]
