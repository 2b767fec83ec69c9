"""gemm_fc1 on quack's SM90 gated GEMM (CuTeDSL), with our one-pass SwiGLU backward kernel.

Why and how: docs/engine/ops.md, section `engine/ops/gemm_fc1/quack_gated.py`.
"""

import torch
from quack.gemm_interface import gemm_gated

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


def gemm_fc1(x: torch.Tensor, w: torch.Tensor, *, main_grad=None) -> torch.Tensor:
    """silu(x @ W_gate^T) * (x @ W_up^T) with w = [W_gate; W_up] of shape [2f, h]; returns [..., f].
    main_grad: see engine/ops/gemm_fc1/register.toml."""
    check_inputs(x, w)
    if x.dtype not in _DTYPES or w.dtype != x.dtype or not x.is_cuda:
        raise ValueError(f"gemm_fc1 (quack) runs bf16/fp16 CUDA tensors of one dtype; got x {x.dtype} {x.device}, "
                         f"w {w.dtype}: use --op-gemm-fc1 baseline for other dtypes")
    if (w.shape[0] // 2) % 8 or w.shape[1] % 8:
        raise ValueError(f"gemm_fc1 (quack) needs f and h multiples of 8 (16-byte aligned rows); got w {tuple(w.shape)}")
    return _GemmFc1.apply(x, w, main_grad)
