"""fc1 + SwiGLU baseline: one GEMM against the stacked [W_gate; W_up], then silu(gate) * up.

One GEMM of width 2f instead of two of width f: the same FLOPs in a single, larger launch, and the
stacked weight is the layout the fused CuTeDSL versions read. Autograd gives the backward; with a
`main_grad` (the contract's gradient-accumulation fusion) the GEMM's weight gradient is added into it
in fp32 by engine/distributed/wgrad.py's linear instead. With `fp8` the GEMM and its two backward GEMMs run in FP8
(engine/distributed/fp8.py); the SwiGLU stays in the model dtype. With `amax` it also returns y's amax, reduced
plainly (the contract's reference; a version whose kernel writes y can take it there instead).
"""

import torch
import torch.nn.functional as F

from engine.distributed.fp8 import amax_of
from engine.distributed.wgrad import linear_wgrad_to

__all__ = ["gemm_fc1", "check_inputs", "preact"]


def check_inputs(x: torch.Tensor, w: torch.Tensor) -> None:
    """The contract's shape check, shared by every gemm_fc1 version."""
    if w.dim() != 2 or w.shape[0] % 2 or w.shape[1] != x.shape[-1]:
        raise ValueError(f"gemm_fc1 wants w [2f, h] with h = x.shape[-1]; got x {tuple(x.shape)}, w {tuple(w.shape)}")


def gemm_fc1(x: torch.Tensor, w: torch.Tensor, *, main_grad=None, fp8: str = "off",
             amax: bool = False) -> "torch.Tensor | tuple[torch.Tensor, torch.Tensor]":
    """silu(x @ W_gate^T) * (x @ W_up^T) with w = [W_gate; W_up] of shape [2f, h]; returns [..., f], or with `amax`
    (y, y's amax). main_grad, fp8, amax: see engine/ops/gemm_fc1/register.toml."""
    gate, up = preact(x, w, main_grad, fp8).chunk(2, dim=-1)
    y = F.silu(gate) * up
    return (y, amax_of(y)) if amax else y


def preact(x: torch.Tensor, w: torch.Tensor, main_grad, fp8: str) -> torch.Tensor:
    """x @ w^T = [gate | up] ([..., 2f]): the one GEMM, with its weight gradient to main_grad and in FP8 as asked."""
    check_inputs(x, w)
    main = main_grad if w.requires_grad else None
    return F.linear(x, w) if main is None and fp8 == "off" else linear_wgrad_to(x, w, main, fp8)
