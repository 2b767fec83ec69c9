"""Megatron's f and g operators: where a tensor-parallel region starts and ends.

`copy_to_tp` marks the input of a column-parallel layer: identity forward, all-reduce of the input
gradient backward (each rank computed a partial gradient from its shard of the weight).
`reduce_from_tp` marks the output of a row-parallel layer: all-reduce forward (each rank holds a
partial sum), identity backward. With TP = 1 both are the identity and cost nothing.
"""

import torch
import torch.distributed as dist

__all__ = ["copy_to_tp", "reduce_from_tp"]


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
