"""Gradient-accumulation fusion: weight gradients added straight into the fp32 gradient buffer.

Why and how: docs/engine/distributed.md, section `engine/distributed/wgrad.py`.
"""

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from engine.distributed.fp8 import linear_dgrad, linear_forward, linear_wgrad

__all__ = ["MainGrad", "add_rows_by_id", "attach_main_grad", "main_grad_of", "placeholder", "linear", "linear_grads",
           "linear_wgrad_to", "fused_linear", "fused_embedding"]


class MainGrad:
    """The fp32 gradient view of one parameter, which fused backward passes accumulate into."""

    def __init__(self, grad: torch.Tensor):
        self.grad = grad
        self._filled = False

    def add_mm(self, a: torch.Tensor, b: torch.Tensor) -> None:
        """grad += a @ b, accumulated in fp32 (a, b 2-D in the model dtype)."""
        if a.dtype == self.grad.dtype:
            self.grad.addmm_(a, b)
        elif a.is_cuda:
            torch.addmm(self.grad, a, b, out_dtype=self.grad.dtype, out=self.grad)
        else:  # torch has no mixed-dtype addmm on CPU: the same products, accumulated in fp32
            self.grad.addmm_(a.to(self.grad.dtype), b.to(self.grad.dtype))
        self._filled = True

    def add_rows(self, index: torch.Tensor, rows: torch.Tensor) -> None:
        """grad[index[i]] += rows[i], in the same order every call, whatever torch's deterministic mode says:
        on CUDA `add_rows_by_id` (its index_add_ uses atomics); CPU's index_add_ walks the indices serially (its
        index_put_ uses atomics)."""
        index, rows = index.reshape(-1), rows.reshape(-1, rows.shape[-1]).to(self.grad.dtype)
        if self.grad.is_cuda:
            add_rows_by_id(self.grad, index, rows)
        else:
            self.grad.index_add_(0, index, rows)
        self._filled = True

    def weight_grad(self, grad_y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, fp8: str = "off") -> torch.Tensor:
        """A linear's weight gradient grad_y^T x, added here; autograd gets a placeholder. With --fp8 the product
        comes from the FP8 GEMM (engine/distributed/fp8.py) and is added (no FP8 GEMM accumulates into its output)."""
        g2, x2 = grad_y.reshape(-1, grad_y.shape[-1]), x.reshape(-1, x.shape[-1])
        if fp8 != "off":
            self.grad.add_(linear_wgrad(g2, x2, fp8, self.grad.dtype))
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
    once. The run count U is never read on the host: the n - U unused (zero) sums go to the ids of runs
    r mod U, so an id gets a handful of additions, all but one of exact zeros."""
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
    r = torch.remainder(r, run_sorted[-1] + 1)  # U = the last run number + 1 (a device scalar)
    grad.index_put_((ids[torch.searchsorted(run_sorted, r)],), sums, accumulate=True)


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


def linear(x: torch.Tensor, w: torch.Tensor, fp8: str = "off") -> torch.Tensor:
    """F.linear(x, w), or its GEMM in FP8 (--fp8: engine/distributed/fp8.py)."""
    if fp8 == "off":
        return F.linear(x, w)
    return linear_forward(x.reshape(-1, x.shape[-1]), w, fp8).view(*x.shape[:-1], w.shape[0])


def linear_grads(grad_y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, sink, needs_input_grad,
                 fp8: str = "off") -> tuple:
    """(grad_x, grad_w) of y = F.linear(x, w), each only where autograd asks for it. The weight gradient goes through
    `sink.weight_grad(grad_y, x, w, fp8)` when there is a sink (what that returns is what autograd gets), else it is
    grad_y^T x. `fp8`: the recipe of both GEMMs (off: bf16 / fp32 as the model)."""
    g2, x2 = grad_y.reshape(-1, grad_y.shape[-1]), x.reshape(-1, x.shape[-1])
    grad_x = grad_w = None
    if needs_input_grad[0]:
        grad_x = grad_y.matmul(w) if fp8 == "off" else linear_dgrad(g2, w, fp8).view(*x.shape)
    if needs_input_grad[1]:
        if sink is not None:
            # the contract's sink takes (dy, x, w) (engine/ops/gemm_fc1/register.toml); the recipe only with --fp8
            grad_w = sink.weight_grad(grad_y, x, w) if fp8 == "off" else sink.weight_grad(grad_y, x, w, fp8)
        elif fp8 != "off":
            grad_w = linear_wgrad(g2, x2, fp8, w.dtype)
        else:
            grad_w = g2.t().mm(x2)
    return grad_x, grad_w


class _LinearWgradTo(torch.autograd.Function):
    """F.linear(x, w) whose weight gradient goes to `sink`: `sink.weight_grad(grad_y, x, w)` does what it does with
    it and returns what autograd gets for w (a MainGrad adds it and returns a placeholder; the MLP region's
    hand-over in tp_linear.py keeps the operands for later and returns None). No sink: grad_y^T x as usual. With
    `fp8` on, all three GEMMs run in FP8 (the FP8 linear of TP 1 and of the sequence-parallel row-parallel layers)."""

    @staticmethod
    def forward(ctx, x, w, sink, fp8):  # type: ignore[override]
        ctx.sink, ctx.fp8 = sink, fp8
        ctx.save_for_backward(x, w)
        return linear(x, w, fp8)

    @staticmethod
    def backward(ctx, grad_y):  # type: ignore[override]
        x, w = ctx.saved_tensors
        return (*linear_grads(grad_y, x, w, ctx.sink, ctx.needs_input_grad, ctx.fp8), None, None)


def linear_wgrad_to(x: torch.Tensor, w: torch.Tensor, sink, fp8: str = "off") -> torch.Tensor:
    """F.linear(x, w) with its weight gradient handed to `sink` (see _LinearWgradTo)."""
    return _LinearWgradTo.apply(x, w, sink, fp8)


def fused_linear(x: torch.Tensor, w: torch.Tensor, fp8: str = "off") -> torch.Tensor:
    """F.linear(x, w), whose weight gradient goes into w's MainGrad when it has one; `fp8`: its GEMMs' recipe."""
    main = main_grad_of(w) if w.requires_grad else None
    if main is None and fp8 == "off":
        return F.linear(x, w)
    return linear_wgrad_to(x, w, main, fp8)


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
