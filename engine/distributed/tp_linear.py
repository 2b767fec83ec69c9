"""Tensor-parallel linear layers whose backward hides the input-gradient collective behind a GEMM.

Why and how: docs/engine/distributed.md, section `engine/distributed/tp_linear.py`.
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist

from engine.distributed.collectives import all_gather_new, reduce_scatter_new
from engine.distributed.comm import copy_to_tp, gather_from_sp, reduce_from_tp, reduce_scatter_to_sp
from engine.distributed.fp8 import (Fp8Operand, fp8_copy, grad_operand, keeps_fp8, linear_dgrad, linear_wgrad, rows,
                                    save_operands, saved_operands, weight_copy)
from engine.distributed.wgrad import fused_linear, linear, linear_wgrad_to, main_grad_of, save_linear, saved_linear_grads

__all__ = ["TPComm", "column_input", "row_output", "column_parallel_linear", "row_parallel_linear", "mlp_region",
           "WgradHandOver"]


@dataclass(frozen=True)
class TPComm:
    """How a layer talks to its TP group: size, group, sequence parallelism, backward overlap, forward row chunks;
    and the recipe of its GEMMs (--fp8; each rank scales its own shard: engine/distributed/fp8.py says why)."""

    size: int
    group: "dist.ProcessGroup | None"
    sequence_parallel: bool = False
    overlap: bool = True
    fwd_chunks: int = 1
    fp8: str = "off"


def column_input(x: torch.Tensor, tp: TPComm) -> torch.Tensor:
    """Start of a TP region (input of a column-parallel layer) without overlap.
    SP: this rank's rows [n / tp, h] -> all rows [n, h]."""
    if tp.sequence_parallel:
        return gather_from_sp(x.reshape(-1, x.shape[-1]), tp.group, tp.size)
    return copy_to_tp(x, tp.group, tp.size)


def row_output(y: torch.Tensor, tp: TPComm) -> torch.Tensor:
    """End of a TP region (output of a row-parallel layer, partial sums on every rank).
    SP: [.., h] -> this rank's rows of the sum [n / tp, h]."""
    if tp.sequence_parallel:
        return reduce_scatter_to_sp(y.reshape(-1, y.shape[-1]), tp.group, tp.size)
    return reduce_from_tp(y, tp.group, tp.size)


def _start_input_grad_comm(grad: torch.Tensor, tp: TPComm):
    """Launch the collective that completes a column-parallel input gradient [n, h] (we own `grad`)."""
    if tp.sequence_parallel:
        return reduce_scatter_new(grad, tp.group, tp.size, async_op=True)
    return grad, dist.all_reduce(grad, group=tp.group, async_op=True)


class _ColumnParallelLinear(torch.autograd.Function):
    """y = x @ w^T where w is this rank's row block; backward overlaps dgrad's collective with wgrad.
    Tensorwise FP8 (engine/distributed/fp8.py keeps_fp8): the forward's FP8 copies of the (SP: gathered) input and
    of w are saved, and transposed in backward instead of cast again; under SP each rank saves its own rows of the
    gathered input's FP8 copy (cast with the scale of the whole) and backward all-gathers those, 1 byte an element."""

    @staticmethod
    def forward(ctx, x, w, tp):  # type: ignore[override]
        ctx.tp, ctx.in_shape, ctx.main = tp, x.shape, main_grad_of(w)
        x2 = x.reshape(-1, x.shape[-1])
        full = all_gather_new(x2, tp.group, tp.size)[0] if tp.sequence_parallel else x2
        if keeps_fp8(tp.fp8):
            # backward takes x^T (wgrad) and W^T (dgrad): the cast writes them beside the forward's layout
            q_full = fp8_copy(full, tp.fp8, transposed=not tp.sequence_parallel)
            qw = weight_copy(w, tp.fp8)
            if tp.sequence_parallel:  # this rank's rows (a copy: a view would hold the whole gathered copy)
                n = x2.shape[0]
                rank = dist.get_rank(tp.group)
                mine = Fp8Operand(q_full.q[rank * n:(rank + 1) * n].clone(), q_full.scale, inv=q_full.inv)
            else:
                mine = q_full.transposed_only()
            save_operands(ctx, mine, qw.transposed_only(), w)
            y = linear(q_full, qw, tp.fp8, like=full)
        else:
            save_operands(ctx, x2, w, w)
            y = linear(full, w, tp.fp8)
        return y if tp.sequence_parallel else y.view(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, grad_y):  # type: ignore[override]
        x2, w_op, w = saved_operands(ctx)
        tp = ctx.tp
        g = grad_y.reshape(-1, grad_y.shape[-1])
        gather = None
        if tp.sequence_parallel:  # the full input is needed only for wgrad: gather it while dgrad runs
            if isinstance(x2, Fp8Operand):  # the FP8 rows as bytes (every backend gathers uint8)
                q, gather = all_gather_new(x2.q.view(torch.uint8), tp.group, tp.size, async_op=True)
                full = Fp8Operand(q.view(x2.q.dtype), x2.scale, inv=x2.inv)
            else:
                full, gather = all_gather_new(x2, tp.group, tp.size, async_op=True)
        else:
            full = x2
        if tp.fp8 == "off":
            grad_x = g.mm(w)
        else:
            g = grad_operand(g, tp.fp8)  # cast once for dgrad and wgrad (tensorwise)
            grad_x = linear_dgrad(g, w_op, tp.fp8, grad_y.dtype)
        grad_x, comm = _start_input_grad_comm(grad_x, tp)
        if gather is not None:
            gather.wait()
        if ctx.main is not None:  # gradient-accumulation fusion (engine/distributed/wgrad.py)
            grad_w = ctx.main.weight_grad(g, full, w, tp.fp8)
        elif tp.fp8 != "off":
            grad_w = linear_wgrad(g, full, tp.fp8, w.dtype)
        else:
            grad_w = g.t().mm(full)
        comm.wait()
        if not tp.sequence_parallel:
            grad_x = grad_x.view(ctx.in_shape)
        return grad_x, grad_w, None


def column_parallel_linear(x: torch.Tensor, w: torch.Tensor, tp: TPComm) -> torch.Tensor:
    """Column-parallel linear for TP > 1: [.., h] (SP: [n / tp, h]) -> [.., rows] (SP: [n, rows])."""
    if tp.overlap:
        return _ColumnParallelLinear.apply(x, w, tp)
    return fused_linear(column_input(x, tp), w, tp.fp8)


class _RowParallelLinear(torch.autograd.Function):
    """y = sum over the TP group of x @ w^T (x: this rank's slice of the features, w: its column block), all-reduced in
    place in `tp.fwd_chunks` row chunks as they are computed. Backward is a linear's (the sum's gradient is the identity:
    every rank gets the whole grad_y): `linear_grads`, the weight gradient through `sink` when there is one.
    Tensorwise FP8 saves the forward's FP8 copies (save_linear; `x_amax`: x's, where known); with several row chunks
    each chunk of x is cast with its own scale, so x is saved in bf16 and cast again (whole) for wgrad, and only w's
    copy is kept (x_amax unused)."""

    @staticmethod
    def forward(ctx, x, w, sink, tp, x_amax):  # type: ignore[override]
        ctx.sink = sink
        x_op, w_op = save_linear(ctx, x, w, tp.fp8, keep_x=tp.fwd_chunks == 1, x_amax=x_amax)
        x2 = x.reshape(-1, x.shape[-1])
        n = x2.shape[0]
        y = torch.empty(n, w.shape[0], dtype=x2.dtype, device=x2.device)
        works = []
        for i in range(tp.fwd_chunks):
            chunk = slice(i * n // tp.fwd_chunks, (i + 1) * n // tp.fwd_chunks)
            if tp.fp8 == "off":
                torch.mm(x2[chunk], w.t(), out=y[chunk])
            else:  # one chunk: x_op is x's FP8 copy (tensorwise) or x
                y[chunk] = linear(x_op if tp.fwd_chunks == 1 else x2[chunk], w_op, tp.fp8, like=x2[chunk])
            works.append(dist.all_reduce(y[chunk], group=tp.group, async_op=True))
        for work in works:  # the compute stream waits for NCCL's; the host does not
            work.wait()
        return y.view(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, grad_y):  # type: ignore[override]
        return (*saved_linear_grads(ctx, grad_y, ctx.sink), None, None, None)


def row_parallel_linear(x: torch.Tensor, w: torch.Tensor, tp: TPComm, sink=None,
                        x_amax: torch.Tensor | None = None) -> torch.Tensor:
    """Row-parallel linear for TP > 1, the end of a TP region: [.., in / tp] -> the sum over TP [.., out] (SP: this
    rank's rows of it, [n / tp, out]). The weight gradient goes to `sink` (the MLP region's hand-over) or else to w's
    MainGrad when gradient-accumulation fusion is on. `x_amax`: x's amax (this rank's shard) where the kernel that
    wrote x took it (tensorwise FP8: x's cast skips its reduction). x is the GEMM's input under SP too (the
    reduce-scatter comes after the GEMM)."""
    if sink is None and w.requires_grad:
        sink = main_grad_of(w)
    if tp.sequence_parallel:
        plain = sink is None and tp.fp8 == "off"  # an FP8 GEMM has no autograd of its own
        return row_output(linear(x, w) if plain else linear_wgrad_to(x, w, sink, tp.fp8, x_amax), tp)
    return _RowParallelLinear.apply(x, w, sink, tp, x_amax)


class WgradHandOver:
    """Carries FC2's (grad_output, input) from its backward node to the MLP region's node."""

    def __init__(self) -> None:
        self.grad_out: torch.Tensor | None = None
        self.inp: torch.Tensor | None = None

    def weight_grad(self, grad_y, x, w: torch.Tensor, fp8: str = "off") -> None:
        """FC2's backward: keep the operands (with tensorwise FP8, dy's and x's FP8 copies); the region node computes
        the gradient (autograd gets None) with the same recipe (its TPComm's)."""
        self.grad_out, self.inp = grad_y, x


class _MLPRegion(torch.autograd.Function):
    """Forward: the region's input (SP: all-gathered) and an alias of FC2's weight.
    Backward: launch the input-gradient collective, compute FC2's wgrad, wait."""

    @staticmethod
    def forward(ctx, x, w_next, hand_over, tp):  # type: ignore[override]
        ctx.tp, ctx.hand_over, ctx.in_shape, ctx.main = tp, hand_over, x.shape, main_grad_of(w_next)
        ctx.save_for_backward(w_next)
        ctx.set_materialize_grads(False)
        if tp.sequence_parallel:
            x_out = all_gather_new(x.reshape(-1, x.shape[-1]), tp.group, tp.size)[0]
        else:
            x_out = x.view_as(x)
        return x_out, w_next.view_as(w_next)

    @staticmethod
    def backward(ctx, grad_x, grad_w_next):  # type: ignore[override]
        tp, hand = ctx.tp, ctx.hand_over
        comm = None
        if grad_x is not None:
            g = grad_x.reshape(-1, grad_x.shape[-1])
            if not tp.sequence_parallel:
                # autograd may share an incoming gradient with another consumer: reduce a private copy
                g = g.clone(memory_format=torch.contiguous_format)
            grad_x, comm = _start_input_grad_comm(g, tp)
        if hand.grad_out is not None:
            go, inp = rows(hand.grad_out), rows(hand.inp)
            if ctx.main is not None:  # gradient-accumulation fusion (engine/distributed/wgrad.py)
                unfused = grad_w_next  # the alias's gradient from any other use (none in the model)
                grad_w_next = ctx.main.weight_grad(go, inp, ctx.saved_tensors[0], tp.fp8)
                if unfused is not None:
                    ctx.main.grad.add_(unfused)
            else:
                w_dtype = ctx.saved_tensors[0].dtype
                gw = go.t().mm(inp) if tp.fp8 == "off" else linear_wgrad(go, inp, tp.fp8, w_dtype)
                grad_w_next = gw if grad_w_next is None else grad_w_next + gw
            hand.grad_out = hand.inp = None
        if comm is not None:
            comm.wait()
            if not tp.sequence_parallel:
                grad_x = grad_x.view(ctx.in_shape)
        return grad_x, grad_w_next, None, None


def mlp_region(x: torch.Tensor, w_next: torch.Tensor, tp: TPComm) -> tuple[torch.Tensor, torch.Tensor, WgradHandOver]:
    """Start of the MLP's TP region with FC2's weight routed through it (docs/engine/distributed.md).
    Returns (FC1 input, FC2 weight to use, the hand-over: FC2's weight-gradient sink for `row_parallel_linear`)."""
    hand = WgradHandOver()
    x_out, w_alias = _MLPRegion.apply(x, w_next, hand, tp)
    return x_out, w_alias, hand
