"""gemm_fc1 on quack's SM90 gated GEMM (CuTeDSL), with our one-pass SwiGLU backward kernel; with --fp8 tensorwise the
same GEMM on the FP8 copies of x and W.

Why and how: docs/engine/ops.md, section `engine/ops/gemm_fc1/quack_gated.py`.
"""

import torch
from quack.gemm_interface import gemm_gated

from engine.distributed.fp8 import saved_operands
from engine.distributed.wgrad import linear_grads, linear_operands, save_linear_operands
from engine.ops.gemm_fc1.baseline import check_inputs
from engine.ops.gemm_fc1.cute_dswiglu import dswiglu_concat
from engine.ops.kernel_cache import configure_quack_cache

__all__ = ["gemm_fc1"]

configure_quack_cache()

_DTYPES = (torch.bfloat16, torch.float16)


class _GemmFc1(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, main_grad) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        preact, y = gemm_gated(x2, w.t(), activation="swiglu", concat_layout=("B",), tuned=False,
                               store_preact=True)
        ctx.save_for_backward(x2, w, preact)
        ctx.lead, ctx.main_grad = lead, main_grad
        return y.view(*lead, y.shape[-1])

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2, w, preact = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1])
        dpre = dswiglu_concat(dy2, preact)  # [M, 2f], concat layout [dgate | dup]
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = torch.mm(dpre, w).view(*ctx.lead, w.shape[1])
        if ctx.needs_input_grad[1] and ctx.main_grad is not None:
            dw = ctx.main_grad.weight_grad(dpre, x2, w)
        elif ctx.needs_input_grad[1]:
            dw = torch.mm(dpre.t(), x2)
        return dx, dw, None


class _GemmFc1Fp8(torch.autograd.Function):
    """--fp8 tensorwise: quack's gated GEMM on x's and W's FP8 copies (E4M3, K-major: the row-major copies), the two
    scales' reciprocals as the accumulator's scale before the SwiGLU (quack's `alpha`, fp32), preact and y in x's
    dtype; quack accumulates FP8 with fp32 promotion (no fast mode: register.toml's fp8 leaves out fast-accum).
    Backward: the same one-pass SwiGLU backward, then dgrad and wgrad as every FP8 linear runs them
    (engine/distributed/wgrad.py linear_grads) on the forward's kept copies: x^T's and W^T's FP8 copies, saved as the
    other linears save them (linear_operands, save_linear_operands), the weight gradient to main_grad."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, main_grad, fp8: str) -> torch.Tensor:
        x8, w8 = linear_operands(ctx, x, w, fp8)
        alpha = (x8.inverse() * w8.inverse()).reshape(1)
        preact, y = gemm_gated(x8.q, w8.q.t(), activation="swiglu", concat_layout=("B",), tuned=False,
                               store_preact=True, alpha=alpha, out_dtype=x.dtype, postact_dtype=x.dtype)
        save_linear_operands(ctx, x8, w8, w, preact)
        ctx.main_grad = main_grad
        return y.view(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x_op, w_op, w, preact = saved_operands(ctx)
        dpre = dswiglu_concat(dy.reshape(-1, dy.shape[-1]), preact)  # [M, 2f], concat layout [dgate | dup]
        dx, dw = linear_grads(dpre, x_op, w, ctx.main_grad, ctx.needs_input_grad, ctx.fp8, w_op, ctx.x_shape)
        return dx, dw, None, None


def gemm_fc1(x: torch.Tensor, w: torch.Tensor, *, main_grad=None, fp8: str = "off",
             amax: bool = False) -> "torch.Tensor | tuple[torch.Tensor, None]":
    """silu(x @ W_gate^T) * (x @ W_up^T) with w = [W_gate; W_up] of shape [2f, h]; returns [..., f], or with `amax`
    (y, None): quack's epilogue does not take y's amax, so the cast reduces y itself. main_grad, fp8 (tensorwise
    only: register.toml), amax: see engine/ops/gemm_fc1/register.toml."""
    check_inputs(x, w)
    if x.dtype not in _DTYPES or w.dtype != x.dtype or not x.is_cuda:
        raise ValueError(f"gemm_fc1 (quack) runs bf16/fp16 CUDA tensors of one dtype; got x {x.dtype} {x.device}, "
                         f"w {w.dtype}: use --op-gemm-fc1 baseline for other dtypes")
    if (w.shape[0] // 2) % 8 or w.shape[1] % 8:
        raise ValueError(f"gemm_fc1 (quack) needs f and h multiples of 8 (16-byte aligned rows); got w {tuple(w.shape)}")
    if fp8 == "off":
        y = _GemmFc1.apply(x, w, main_grad)
    elif fp8 != "tensorwise" or getattr(fp8, "fast_accum", False):  # refused at start (dispatch.py check_fp8)
        raise ValueError(f"gemm_fc1 (quack) runs --fp8 tensorwise with full accumulation only; got {fp8!r}"
                         f"{' with fast accumulation' if getattr(fp8, 'fast_accum', False) else ''}: use "
                         f"--op-gemm-fc1 compiled")
    else:
        y = _GemmFc1Fp8.apply(x, w, main_grad, fp8)
    return (y, None) if amax else y
