"""What the GPU benchmark scripts share: the relative error they check with and the event timer.

METHOD.md (device tool): compare with ||x - ref|| / ||ref|| in float64 (non-finite never passes),
time with device events after a warm-up call, take the median, rotate among input sets so repeated
calls do not measure the cache.
"""

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["rel_err", "median_call_ms"]


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
