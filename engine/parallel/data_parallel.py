"""Data parallelism for the flat buffers (plain, not yet overlapped with backward).

Gradients: the loss of every rank is already divided by the GLOBAL valid-token count, so the
data-parallel gradient is the SUM over ranks (not the mean). Parameters: each rank's optimizer
updates only the slice it owns (FlatBuffers.shard_ranges), so after the step every bucket is
re-assembled from its owners.
"""

import torch.distributed as dist

from engine.distributed import ParallelState
from engine.optim.buffers import FlatBuffers

__all__ = ["reduce_grads", "gather_params"]


def reduce_grads(buffers: FlatBuffers, par: ParallelState) -> None:
    if par.dp_size == 1:
        return
    for b in buffers.buckets:
        dist.all_reduce(buffers.grads[b.start:b.end], group=par.dp_group)


def gather_params(buffers: FlatBuffers, par: ParallelState) -> None:
    if par.dp_size == 1:
        return
    for b, (lo, hi) in zip(buffers.buckets, buffers.shard_ranges(par.dp_rank)):
        view = buffers.params[b.start:b.end]
        shard = buffers.params[lo:hi].clone()
        dist.all_gather(list(view.chunk(par.dp_size)), shard, group=par.dp_group)  # writes into the views
