"""Megatron's f and g operators: where a tensor-parallel region starts and ends.

`copy_to_tp` marks the input of a column-parallel layer: identity forward, all-reduce of the input
gradient backward (each rank computed a partial gradient from its shard of the weight).
`reduce_from_tp` marks the output of a row-parallel layer: all-reduce forward (each rank holds a
partial sum), identity backward. With TP = 1 both are the identity and cost nothing.

Sequence-parallel variants (the residual stream is split into `tp` row blocks of the flattened
[tokens, hidden] activations; norms are per token, so any split of the tokens works):
`gather_from_sp` starts a region (all-gather of the rows forward, reduce-scatter of the gradient
backward) and `reduce_scatter_to_sp` ends one (reduce-scatter forward, all-gather backward).
"""

import torch
import torch.distributed as dist

from engine.distributed.collectives import all_gather_new, reduce_scatter_new

__all__ = ["copy_to_tp", "reduce_from_tp", "gather_from_sp", "reduce_scatter_to_sp"]


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):  # type: ignore[override]
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        # Autograd may hand the same gradient tensor to several consumers: reduce a private copy.
        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):  # type: ignore[override]
        # Reduce a copy: mutating an autograd input in place would need mark_dirty bookkeeping.
        x = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad, None


def copy_to_tp(x: torch.Tensor, group: "dist.ProcessGroup | None", tp_size: int) -> torch.Tensor:
    return x if tp_size == 1 else _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group: "dist.ProcessGroup | None", tp_size: int) -> torch.Tensor:
    return x if tp_size == 1 else _ReduceFromTP.apply(x, group)


class _GatherFromSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, size):  # type: ignore[override]
        ctx.group, ctx.size = group, size
        return all_gather_new(x, group, size)[0]

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return reduce_scatter_new(grad, ctx.group, ctx.size)[0], None, None


class _ReduceScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, size):  # type: ignore[override]
        ctx.group, ctx.size = group, size
        return reduce_scatter_new(x, group, size)[0]

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return all_gather_new(grad, ctx.group, ctx.size)[0], None, None


def gather_from_sp(x: torch.Tensor, group: "dist.ProcessGroup | None", tp_size: int) -> torch.Tensor:
    """[n / tp, ...] row block of this rank -> [n, ...] (backward: reduce-scatter of the gradient)."""
    return x if tp_size == 1 else _GatherFromSP.apply(x, group, tp_size)


def reduce_scatter_to_sp(x: torch.Tensor, group: "dist.ProcessGroup | None", tp_size: int) -> torch.Tensor:
    """Partial sums [n, ...] -> this rank's row block of their sum [n / tp, ...] (backward: all-gather)."""
    return x if tp_size == 1 else _ReduceScatterToSP.apply(x, group, tp_size)
