"""Gradient-accumulation fusion: weight gradients added straight into the fp32 gradient buffer.

Why and how: docs/engine/distributed.md, section `engine/distributed/wgrad.py`.
"""

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from engine.distributed.fp8 import (Fp8Operand, fp8_copy, grad_operand, keeps_fp8, linear_dgrad, linear_forward,
                                    linear_wgrad, rows, save_operands, saved_operands, weight_copy, wgrad_add)

__all__ = ["MainGrad", "add_rows_by_id", "attach_main_grad", "main_grad_of", "placeholder", "linear", "linear_grads",
           "save_linear", "linear_operands", "save_linear_operands", "saved_linear_grads", "linear_wgrad_to",
           "fused_linear", "fused_embedding"]


class MainGrad:
    """The fp32 gradient view of one parameter, which fused backward passes accumulate into. A step's first
    contribution writes the view and later ones add (TransformerEngine's first-micro-batch write, for every kind of
    contribution), so FlatBuffers.zero_grads need not clear the buffer: a pass over 4 bytes a parameter (7.5 ms of an 8B
    step at DP 4 on an H200), and the first micro-batch's weight-gradient GEMMs write their product instead of reading
    the buffer back. A view that got nothing by the step's end is zeroed then (`settle`)."""

    def __init__(self, grad: torch.Tensor):
        self.grad = grad
        self._filled = False
        self._fresh = True  # no contribution this step yet: the next one writes
        self._stale = False  # ... over an earlier step's values (a reset without zeroing), not zeros

    def reset(self, zeroed: bool) -> None:
        """A new step (FlatBuffers.zero_grads). `zeroed`: the view was cleared; else it holds the last step's values
        until the step's first contribution overwrites them."""
        self._fresh, self._stale = True, not zeroed

    def settle(self) -> None:
        """The step's backward passes are done: a view that got no contribution holds zeros, as if cleared."""
        if self._fresh and self._stale:
            self.grad.zero_()
        self._stale = False

    @property
    def written(self) -> bool:
        """Whether a contribution has reached the view this step."""
        return not self._fresh

    def mark_written(self) -> None:
        """A contribution reached the view outside Python: the replay of a CUDA graph that captured its write
        (engine/cuda_graph.py), so `settle` must keep it and later contributions add."""
        self._fresh = self._stale = False

    def _first(self) -> bool:
        """Whether this contribution writes the view (the step's first) rather than adding. A CUDA graph captures
        the decision, so engine/cuda_graph.py replays a graph that writes only as a step's first micro-batch."""
        first, self._fresh = self._fresh, False
        self._stale = False
        return first

    def add(self, t: torch.Tensor) -> None:
        """grad += t (an unfused backward's gradient, FlatBuffers' hook)."""
        if self._first():
            self.grad.copy_(t)
        else:
            self.grad.add_(t)

    def add_mm(self, a: torch.Tensor, b: torch.Tensor) -> None:
        """grad += a @ b, accumulated in fp32 (a, b 2-D in the model dtype); the step's first writes a @ b."""
        if a.dtype != self.grad.dtype and not a.is_cuda:  # no mixed-dtype mm on CPU: the same products in fp32
            a, b = a.to(self.grad.dtype), b.to(self.grad.dtype)
        mixed = {} if a.dtype == self.grad.dtype else {"out_dtype": self.grad.dtype}
        if self._first():
            torch.mm(a, b, **mixed, out=self.grad)
        else:
            torch.addmm(self.grad, a, b, **mixed, out=self.grad)
        self._filled = True

    def add_rows(self, index: torch.Tensor, rows: torch.Tensor) -> None:
        """grad[index[i]] += rows[i], in the same order every call, whatever torch's deterministic mode says:
        on CUDA `add_rows_by_id` (its index_add_ uses atomics); CPU's index_add_ walks the indices serially (its
        index_put_ uses atomics). The step's first clears the view, then adds (rows repeat ids)."""
        index, rows = index.reshape(-1), rows.reshape(-1, rows.shape[-1]).to(self.grad.dtype)
        if self._first():
            self.grad.zero_()
        if self.grad.is_cuda:
            add_rows_by_id(self.grad, index, rows)
        else:
            self.grad.index_add_(0, index, rows)
        self._filled = True

    def weight_grad(self, grad_y, x, w: torch.Tensor, fp8: str = "off") -> torch.Tensor:
        """A linear's weight gradient grad_y^T x, added here; autograd gets a placeholder. With --fp8 the product
        comes from the FP8 GEMM (engine/distributed/fp8.py wgrad_add; grad_y and x may be FP8 copies, Fp8Operand), added
        by the recipe's fp8_wgrad version (_scaled_mm's baseline writes the product, then adds it), or written straight
        into the buffer as the step's first contribution."""
        g2, x2 = rows(grad_y), rows(x)
        if fp8 != "off":
            wgrad_add(self.grad, g2, x2, fp8, write=self._first())
            self._filled = True
        else:
            self.add_mm(g2.t(), x2)
        return placeholder(w)

    def take(self) -> bool:
        """Whether a fused backward filled the buffer since the last call (and reset)."""
        filled, self._filled = self._filled, False
        return filled


def add_rows_by_id(grad: torch.Tensor, index: torch.Tensor, rows: torch.Tensor) -> None:
    """grad[index[i]] += rows[i] (index 1-D, rows [n, h] in grad's dtype), deterministic and without a host sync.

    An accumulating index_put_ alone sums each run of equal ids serially in one warp, so a frequent token (EOS,
    a space: hundreds of rows in a micro-batch) holds up the whole kernel: 1.1 ms for 8192 rows of 4096 on an
    H200. Here the rows of each id are first summed by torch's embedding backward over compact run numbers
    (sorted partial segments of a few rows summed in parallel, then in a fixed order), and each sum is added
    once. The run count U is never read on the host: sums 0 .. U - 1 go to their ids, and the n - U unused
    (exact zero) sums each to row r mod grad's rows, so no row gets more than two additions however few the
    runs. (Sending the zeros to the runs' own ids instead made U tiny the worst case: a vocab-parallel shard
    whose tokens are nearly all another rank's, masked to one id, took 5.6 ms a micro-batch on an H200.)"""
    n = index.numel()
    if n == 0:
        return
    order = torch.argsort(index, stable=True)
    ids = index[order]
    starts = torch.ones(n, dtype=torch.long, device=index.device)
    starts[1:] = (ids[1:] != ids[:-1]).long()
    run_sorted = torch.cumsum(starts, 0) - 1  # the run number of each sorted position, 0 .. U - 1
    run = run_sorted[torch.argsort(order)]  # ... of each row in its own place
    sums = torch.ops.aten.embedding_dense_backward(rows, run, n, -1, False)  # [n, h]: run r's sum, zeros from U on
    r = torch.arange(n, device=index.device)
    last = run_sorted[-1]  # U - 1 (a device scalar)
    run_id = ids[torch.searchsorted(run_sorted, torch.minimum(r, last))]  # the id of run r (of run U - 1 past it)
    grad.index_put_((torch.where(r <= last, run_id, r % grad.shape[0]),), sums, accumulate=True)


# Which parameters have a fused fp32 gradient, and where: held here, not stamped on the parameter. Keyed by the
# parameter's identity and weakly, so a model that is dropped takes its entries with it.
_MAIN_GRADS: "WeakIdKeyDictionary[torch.Tensor, MainGrad]" = WeakIdKeyDictionary()


def attach_main_grad(param: torch.nn.Parameter, main: MainGrad) -> None:
    """Give `param` the MainGrad its fused backward passes add into (FlatBuffers, when fusion is on)."""
    _MAIN_GRADS[param] = main


def main_grad_of(param: torch.Tensor) -> MainGrad | None:
    """The parameter's MainGrad when gradient-accumulation fusion is on, else None."""
    return _MAIN_GRADS.get(param)


def placeholder(w: torch.Tensor) -> torch.Tensor:
    """What a fused backward returns as the weight's gradient: memory only, never read."""
    return torch.empty_like(w)


def linear(x, w, fp8: str = "off", like: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, w), or its GEMM in FP8 (--fp8: engine/distributed/fp8.py). With --fp8, x and w may be FP8 copies
    (Fp8Operand); `like`, the bf16 input, then gives the output's leading shape and dtype."""
    if fp8 == "off":
        return F.linear(x, w)
    like = x if like is None else like
    return linear_forward(rows(x), w, fp8, like.dtype).view(*like.shape[:-1], w.shape[0])


def linear_grads(grad_y: torch.Tensor, x, w: torch.Tensor, sink, needs_input_grad, fp8: str = "off", w_op=None,
                 x_shape: torch.Size | None = None, grad_amax: torch.Tensor | None = None) -> tuple:
    """(grad_x, grad_w) of y = F.linear(x, w), each only where autograd asks for it. The weight gradient goes through
    `sink.weight_grad(grad_y, x, w, fp8)` when there is a sink (what that returns is what autograd gets), else it is
    grad_y^T x. `fp8`: the recipe of both GEMMs (off: bf16 / fp32 as the model); with --fp8 dy is cast once here
    for both (tensorwise; rowwise casts it per GEMM: engine/distributed/fp8.py keeps_fp8), `x` may be the forward's
    FP8 copy (2-D, `x_shape` the input's shape) and `w_op` w's (dgrad's operand; default w); `grad_amax`: dy's amax
    where the kernel that wrote dy took it (tensorwise: its cast skips the reduction)."""
    x_shape = x.shape if x_shape is None else x_shape
    grad_x = grad_w = None
    if fp8 == "off":
        g2, x2 = grad_y.reshape(-1, grad_y.shape[-1]), x.reshape(-1, x.shape[-1])
        if needs_input_grad[0]:
            grad_x = grad_y.matmul(w)
        if needs_input_grad[1]:
            # the contract's sink takes (dy, x, w) (engine/ops/gemm_fc1/register.toml); the recipe only with --fp8
            grad_w = sink.weight_grad(grad_y, x, w) if sink is not None else g2.t().mm(x2)
        return grad_x, grad_w
    g = grad_operand(grad_y.reshape(-1, grad_y.shape[-1]), fp8, grad_amax)
    if needs_input_grad[0]:
        grad_x = linear_dgrad(g, w if w_op is None else w_op, fp8, grad_y.dtype).view(*x_shape)
    if needs_input_grad[1]:
        grad_w = sink.weight_grad(g, rows(x), w, fp8) if sink is not None else linear_wgrad(g, rows(x), fp8, w.dtype)
    return grad_x, grad_w


def save_linear(ctx, x: torch.Tensor, w: torch.Tensor, fp8: str, keep_x: bool = True,
                x_amax: torch.Tensor | None = None) -> tuple:
    """Save in ctx what `saved_linear_grads` needs for y = F.linear(x, w); returns the forward GEMM's operands.
    Tensorwise FP8 (keeps_fp8): x's (with `keep_x`) and w's FP8 copies, cast once here for the forward GEMM and
    saved in place of the bf16 x (half its bytes; w's copy is held too), so the backward transposes them instead of
    casting again: the same FP8 values, bit for bit. w itself is saved as well (a parameter: no memory) for the
    weight-gradient sink. Otherwise x and w (rowwise: cast again in backward). `x_amax`: linear_operands'."""
    x_op, w_op = linear_operands(ctx, x, w, fp8, keep_x, x_amax)
    save_linear_operands(ctx, x_op, w_op, w)
    return x_op, w_op


def linear_operands(ctx, x: torch.Tensor, w: torch.Tensor, fp8: str, keep_x: bool = True,
                    x_amax: torch.Tensor | None = None) -> tuple:
    """save_linear's first half, for an op that fuses the linear with what follows it: the forward GEMM's operands
    (cast where the recipe keeps FP8 copies), the recipe and x's shape noted in ctx. `x_amax`: x's amax where the
    kernel that wrote x took it (tensorwise: x's cast skips its reduction; unused where x is not cast whole)."""
    ctx.fp8, ctx.x_shape = fp8, x.shape
    keep = keeps_fp8(fp8)
    x_op = fp8_copy(rows(x), fp8, transposed=True, amax=x_amax) if keep and keep_x else x
    w_op = weight_copy(w, fp8) if keep else w
    return x_op, w_op


def save_linear_operands(ctx, x_op, w_op, w: torch.Tensor, *also: torch.Tensor) -> None:
    """save_linear's second half: the operands as backward takes them, then `also` (the fusing op's own tensors;
    saved_operands gives them back after x_op, w_op, w)."""
    # backward takes x^T (wgrad) and W^T (dgrad): keep those layouts only, as the cast wrote them
    save_operands(ctx, *[o.transposed_only() if isinstance(o, Fp8Operand) else o for o in (x_op, w_op)], w, *also)


def saved_linear_grads(ctx, grad_y: torch.Tensor, sink) -> tuple:
    """linear_grads of what save_linear saved."""
    x_op, w_op, w = saved_operands(ctx)
    return linear_grads(grad_y, x_op, w, sink, ctx.needs_input_grad, ctx.fp8, w_op, ctx.x_shape)


class _LinearWgradTo(torch.autograd.Function):
    """F.linear(x, w) whose weight gradient goes to `sink`: `sink.weight_grad(grad_y, x, w)` does what it does with
    it and returns what autograd gets for w (a MainGrad adds it and returns a placeholder; the MLP region's
    hand-over in tp_linear.py keeps the operands for later and returns None). No sink: grad_y^T x as usual. With
    `fp8` on, all three GEMMs run in FP8 (the FP8 linear of TP 1 and of the sequence-parallel row-parallel layers),
    tensorwise on the forward's FP8 copies (save_linear; `x_amax`: x's, where known)."""

    @staticmethod
    def forward(ctx, x, w, sink, fp8, x_amax):  # type: ignore[override]
        ctx.sink = sink
        x_op, w_op = save_linear(ctx, x, w, fp8, x_amax=x_amax)
        return linear(x_op, w_op, fp8, like=x)

    @staticmethod
    def backward(ctx, grad_y):  # type: ignore[override]
        return (*saved_linear_grads(ctx, grad_y, ctx.sink), None, None, None)


def linear_wgrad_to(x: torch.Tensor, w: torch.Tensor, sink, fp8: str = "off",
                    x_amax: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, w) with its weight gradient handed to `sink` (see _LinearWgradTo); `x_amax`: x's amax where the
    kernel that wrote x took it (tensorwise FP8: x's cast skips its reduction)."""
    return _LinearWgradTo.apply(x, w, sink, fp8, x_amax)


def fused_linear(x: torch.Tensor, w: torch.Tensor, fp8: str = "off", x_amax: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, w), whose weight gradient goes into w's MainGrad when it has one; `fp8`: its GEMMs' recipe;
    `x_amax`: linear_wgrad_to's."""
    main = main_grad_of(w) if w.requires_grad else None
    if main is None and fp8 == "off":
        return F.linear(x, w)
    return linear_wgrad_to(x, w, main, fp8, x_amax)


class _FusedEmbedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, w, main):  # type: ignore[override]
        ctx.main = main
        ctx.save_for_backward(ids, w)
        return F.embedding(ids, w)

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        ids, w = ctx.saved_tensors
        ctx.main.add_rows(ids, grad_out)
        return None, placeholder(w), None


def fused_embedding(ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """F.embedding(ids, w), whose weight gradient goes into w's MainGrad when it has one."""
    main = main_grad_of(w)
    if main is None or not w.requires_grad:
        return F.embedding(ids, w)
    return _FusedEmbedding.apply(ids, w, main)
