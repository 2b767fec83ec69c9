"""fc1 + SwiGLU baseline: one GEMM against the stacked [W_gate; W_up], then silu(gate) * up.

One GEMM of width 2f instead of two of width f: the same FLOPs in a single, larger launch, and the
stacked weight is the layout the fused CuTeDSL versions read. Autograd gives the backward.
"""

import torch
import torch.nn.functional as F

__all__ = ["gemm_fc1"]


def gemm_fc1(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """silu(x @ W_gate^T) * (x @ W_up^T) with w = [W_gate; W_up] of shape [2f, h]; returns [..., f]."""
    if w.dim() != 2 or w.shape[0] % 2 or w.shape[1] != x.shape[-1]:
        raise ValueError(f"gemm_fc1 wants w [2f, h] with h = x.shape[-1]; got x {tuple(x.shape)}, w {tuple(w.shape)}")
    gate, up = F.linear(x, w).chunk(2, dim=-1)
    return F.silu(gate) * up
