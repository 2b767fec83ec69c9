"""Completing a step's fp32 gradients: TP sums, then the data-parallel reduce-scatter, per bucket.

Why and how: docs/engine/sharding.md, section `engine/sharding/grad_sync.py`.
"""

import torch
import torch.distributed as dist

from engine.distributed import ParallelState
from engine.distributed.collectives import reduce_scatter_flat
from engine.optim.buffers import Bucket, FlatBuffers
from engine.model.tp_grads import GradSum

__all__ = ["GradSync"]


class GradSync:
    def __init__(self, buffers: FlatBuffers, par: ParallelState, sums: list[GradSum], *, overlap: bool):
        self.buffers, self.par, self.overlap = buffers, par, overlap
        self.active = par.dp_size > 1 or bool(sums)
        by_param = {id(s.param): s for s in sums}
        # per bucket: flat ranges of the grad buffer to sum, grouped by process group
        self._sums: list[list[tuple[object, list[tuple[int, int]]]]] = []
        for b in buffers.buckets:
            groups: dict[int, tuple[object, list[tuple[int, int]]]] = {}
            for e in b.entries:
                s = by_param.get(id(e.param))
                if s is not None:
                    groups.setdefault(id(s.group), (s.group, []))[1].append((e.start + s.lo, e.start + s.hi))
            self._sums.append(list(groups.values()))
        self._last = False
        self._counts = [0] * len(buffers.buckets)
        self._launched = [False] * len(buffers.buckets)
        self._works: list = []
        self._hooks = []
        self.launched_by_backward = 0  # buckets of the last step launched from backward hooks (overlap at work)
        if self.active and overlap:
            for b in buffers.buckets:
                for e in b.entries:
                    self._hooks.append(e.param.register_post_accumulate_grad_hook(self._make_hook(b)))

    def _make_hook(self, bucket: Bucket):
        def hook(param: torch.Tensor) -> None:  # runs after FlatBuffers' hook has added the gradient
            if not self._last:
                return
            self._counts[bucket.index] += 1
            if self._counts[bucket.index] == len(bucket.entries):
                self._launch(bucket)

        return hook

    def start_micro_batch(self, last: bool) -> None:
        """Call before each micro-batch's backward; `last` arms the per-bucket launches."""
        self._last = last
        if last:
            self._counts = [0] * len(self.buffers.buckets)
            self._launched = [False] * len(self.buffers.buckets)

    @torch.no_grad()
    def _launch(self, bucket: Bucket) -> None:
        grads = self.buffers.grads
        for group, ranges in self._sums[bucket.index]:
            parts = [grads[lo:hi] for lo, hi in ranges]
            flat = parts[0] if len(parts) == 1 else torch.cat(parts)
            dist.all_reduce(flat, group=group)
            if len(parts) > 1:
                for p, reduced in zip(parts, torch.split(flat, [p.numel() for p in parts])):
                    p.copy_(reduced)
        if self.par.dp_size > 1:
            work = reduce_scatter_flat(grads[bucket.start:bucket.end], self.par.dp_rank, self.par.dp_group,
                                       self.par.dp_size, async_op=True)
            self._works.append(work)
        self._launched[bucket.index] = True

    def finish(self) -> None:
        """After the last micro-batch's backward: complete every bucket and wait for all of them."""
        if not self.active:
            return
        self.launched_by_backward = sum(self._launched)
        for b in self.buffers.buckets:
            if not self._launched[b.index]:
                self._launch(b)
        for work in self._works:
            work.wait()
        self._works = []
        self._last = False
        self._launched = [False] * len(self.buffers.buckets)
