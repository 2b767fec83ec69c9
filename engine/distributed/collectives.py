"""Flat collectives that pick the right primitive for the backend.

Why and how: docs/engine/distributed.md, section `engine/distributed/collectives.py`.
"""

import torch
import torch.distributed as dist

__all__ = ["is_nccl", "reduce_scatter_flat", "all_gather_flat", "reduce_scatter_new", "all_gather_new"]

# torch >= 2.13 renamed the single-tensor collectives; the GPU machine runs 2.11.
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def is_nccl(group: "dist.ProcessGroup | None") -> bool:
    return dist.get_backend(group) == "nccl"


def reduce_scatter_flat(buffer: torch.Tensor, rank: int, group: "dist.ProcessGroup | None", size: int,
                        async_op: bool = False):
    """Sum `buffer` (1-D, length divisible by `size`) over the group; afterwards chunk `rank` of it
    holds the sum. The other chunks hold partial sums (NCCL) or the sum too (gloo): don't read them."""
    if is_nccl(group):
        chunk = buffer.numel() // size
        return _REDUCE_SCATTER(buffer[rank * chunk:(rank + 1) * chunk], buffer, group=group, async_op=async_op)
    return dist.all_reduce(buffer, group=group, async_op=async_op)


def all_gather_flat(buffer: torch.Tensor, rank: int, group: "dist.ProcessGroup | None", size: int,
                    async_op: bool = False):
    """Fill every chunk of `buffer` (1-D) with the owning rank's chunk; this rank's chunk is the input."""
    chunk = buffer.numel() // size
    own = buffer[rank * chunk:(rank + 1) * chunk]
    if is_nccl(group):
        return _ALL_GATHER(buffer, own, group=group, async_op=async_op)
    # gloo copies its result into the list's views when the work completes; the input must not alias them
    return dist.all_gather(list(buffer.chunk(size)), own.clone(), group=group, async_op=async_op)


def reduce_scatter_new(x: torch.Tensor, group: "dist.ProcessGroup | None", size: int, async_op: bool = False):
    """Sum `x` [n, ...] over the group and return (this rank's rows [n / size, ...], work handle).
    `x` is not modified (gloo reduces a copy)."""
    rows = x.shape[0] // size
    if is_nccl(group):
        out = torch.empty((rows, *x.shape[1:]), dtype=x.dtype, device=x.device)
        return out, _REDUCE_SCATTER(out, x.contiguous(), group=group, async_op=async_op)
    rank = dist.get_rank(group)
    full = x.clone(memory_format=torch.contiguous_format)
    work = dist.all_reduce(full, group=group, async_op=async_op)
    return full[rank * rows:(rank + 1) * rows], work


def all_gather_new(x: torch.Tensor, group: "dist.ProcessGroup | None", size: int, async_op: bool = False):
    """Concatenate every rank's `x` [m, ...] along dim 0: returns ([m * size, ...], work handle)."""
    x = x.contiguous()
    out = torch.empty((x.shape[0] * size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    if is_nccl(group):
        return out, _ALL_GATHER(out, x, group=group, async_op=async_op)
    return out, dist.all_gather(list(out.chunk(size)), x, group=group, async_op=async_op)
