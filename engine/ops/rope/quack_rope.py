"""RoPE on quack's CuTeDSL rotary kernel (quack.rotary.apply_rotary).

One kernel per tensor reads x once and writes the rotated copy once; it loads the d / 2 distinct
table columns (the first half of the engine's rotate-half tables), rotates each pair in fp32 and
rounds once to x's dtype, so it is at least as close to exact as the baseline, which rounds the
tables and each of its three products. The backward is the same kernel rotating the gradient by
-angle (quack's `conjugate`). q and k may be strided slices of the fused QKV projection (only the
last dimension must be contiguous), so nothing is copied before the kernel. Documents use quack's
varlen path: positions restart at each offset of `cu_seqlens` over the flattened b x s tokens.
"""

import torch
from quack.rotary import apply_rotary

from engine.ops.kernel_cache import configure_quack_cache
from engine.ops.rope.baseline import check_inputs

__all__ = ["rope"]

configure_quack_cache()

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cu_seqlens: torch.Tensor | None,
           max_seqlen: int | None, conjugate: bool) -> torch.Tensor:
    if x.stride(-1) != 1:
        x = x.contiguous()
    if cu_seqlens is None:
        return apply_rotary(x, cos, sin, conjugate=conjugate)
    b, s, h, d = x.shape
    out = apply_rotary(x.reshape(b * s, h, d), cos, sin, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                       conjugate=conjugate)
    return out.view(b, s, h, d)


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, cu_seqlens, max_seqlen):
        half = cos.shape[-1] // 2
        cos, sin = cos[:, :half], sin[:, :half]
        ctx.save_for_backward(cos, sin, cu_seqlens)
        ctx.max_seqlen = max_seqlen
        ctx.set_materialize_grads(False)
        return _apply(q, cos, sin, cu_seqlens, max_seqlen, False), _apply(k, cos, sin, cu_seqlens, max_seqlen, False)

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin, cu_seqlens = ctx.saved_tensors
        grads = [None if g is None else _apply(g, cos, sin, cu_seqlens, ctx.max_seqlen, True) for g in (dq, dk)]
        return *grads, None, None, None, None


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
         cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, k) rotated by each token's position (engine/ops/README.md)."""
    check_inputs(q, k, cos, sin, cu_seqlens, max_seqlen)
    if q.dtype not in _DTYPES or k.dtype != q.dtype or cos.dtype != torch.float32 or sin.dtype != torch.float32:
        raise ValueError(f"rope quack: q/k in one of {_DTYPES} and fp32 tables, got q {q.dtype}, k {k.dtype}, "
                         f"cos {cos.dtype}; use --op-rope baseline for others")
    if q.shape[-1] % 8 or q.shape[-1] > 512:
        raise ValueError(f"rope quack: head_dim={q.shape[-1]} must be a multiple of 8 and <= 512; use --op-rope baseline")
    return _Rope.apply(q, k, cos, sin, cu_seqlens, max_seqlen)
