"""The judge's own FP8 linear: the recipe of `--fp8` (docs/fp8.md) as quantise-dequantise in plain torch.

Part of the judge: nothing here imports the engine; it is written from the recipe as docs/fp8.md states it,
so that the exact-step check (harness/judge/exactstep.py) can measure, on the very weights and batch of a
step, how far an honest FP8 step lands from its fp32 reference: its own pass with the decoder's linears
(QKV, O, FC1 gate/up, FC2; `reference.loss_and_grads(..., linear=fp8_linear(recipe))`) quantised, against
its fp32 pass. The LM head, embedding, norms and attention stay as they are.

A linear y = x W^T is three GEMMs, each A B^T with the reduction dimension K last in both operands:

    forward  y  = x  W^T     A = x    [n, in],   B = W   [out, in]
    dgrad    dx = dy W       A = dy   [n, out],  B = W^T [in, out]
    wgrad    dW = dy^T x     A = dy^T [out, n],  B = x^T [in, n]

Each operand is quantised with a scale from its own amax at that moment (dynamic, no history):
q = cast(clamp(t * s, -max, max)), s = max / amax (1 where amax is 0), dequantised as q / s; the product
of the dequantised operands is taken in fp32 (FP8 tensor cores accumulate in fp32).
- tensorwise: one scale per tensor; x and W in E4M3, the output gradient dy in E5M2.
- rowwise: one scale per row of each operand along K, E4M3 throughout, scales rounded down to a power of 2.

Under autocast (the judge's pass of a bf16 run) the operands are first cast to the autocast dtype and the
output returned in it, as a bf16 engine quantises its bf16 activations and weights.
"""

from typing import Callable

import torch

__all__ = ["RECIPES", "quantise_dequantise", "fp8_linear"]

RECIPES = ("tensorwise", "rowwise")
_E4M3, _E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def quantise_dequantise(t: torch.Tensor, fmt: torch.dtype, per_row: bool) -> torch.Tensor:
    """t (2-D) rounded onto `fmt`'s grid under a dynamic amax scale (per row along the last dim, power-of-2 scale,
    or one per tensor), back in fp32."""
    top = torch.finfo(fmt).max
    t = t.float()
    amax = t.abs().amax(dim=-1, keepdim=True) if per_row else t.abs().amax()
    scale = torch.where(amax > 0, top / amax, torch.ones_like(amax))
    if per_row:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    return (t * scale).clamp(-top, top).to(fmt).float() / scale


def _product(a: torch.Tensor, b: torch.Tensor, recipe: str, a_fmt: torch.dtype) -> torch.Tensor:
    """a [m, k] @ b [n, k]^T with both operands quantised by `recipe` (a in `a_fmt` where tensorwise)."""
    rowwise = recipe == "rowwise"
    qa = quantise_dequantise(a, _E4M3 if rowwise else a_fmt, rowwise)
    qb = quantise_dequantise(b, _E4M3, rowwise)
    return qa @ qb.t()


class _FP8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2: torch.Tensor, w: torch.Tensor, recipe: str) -> torch.Tensor:
        ctx.save_for_backward(x2, w)
        ctx.recipe = recipe
        with torch.autocast(x2.device.type, enabled=False):
            return _product(x2, w, recipe, _E4M3).to(x2.dtype)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2, w = ctx.saved_tensors
        grad_fmt = _E5M2 if ctx.recipe == "tensorwise" else _E4M3
        with torch.autocast(x2.device.type, enabled=False):
            dx = _product(dy, w.t(), ctx.recipe, grad_fmt)
            dw = _product(dy.t(), x2.t(), ctx.recipe, grad_fmt)
        return dx.to(x2.dtype), dw.to(w.dtype), None


def fp8_linear(recipe: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """x [..., in], w [out, in] -> x w^T [..., out] through the recipe's FP8 GEMMs (forward and backward)."""
    if recipe not in RECIPES:
        raise ValueError(f"FP8 reference: recipe {recipe!r} is not one of {RECIPES}")

    def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled(x.device.type):
            dtype = torch.get_autocast_dtype(x.device.type)
            x, w = x.to(dtype), w.to(dtype)
        y = _FP8Linear.apply(x.reshape(-1, x.shape[-1]), w, recipe)
        return y.reshape(*x.shape[:-1], w.shape[0])

    return linear
