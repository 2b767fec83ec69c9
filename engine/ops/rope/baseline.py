"""RoPE in plain torch ops, HF Llama's math (autograd gives the backward).

The tables are cast to x's dtype and the rotation runs there (`x * cos + rotate_half(x) * sin`), as
`apply_rotary_pos_emb` in transformers does, so a model exported to HF gives the same numbers. With
documents (`cu_seqlens`) each token's position is its index inside its document, computed on the
device from the offsets.
"""

import torch

__all__ = ["rope", "check_inputs", "document_positions"]


def check_inputs(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 cu_seqlens: torch.Tensor | None, max_seqlen: int | None) -> None:
    """The contract's shapes (engine/ops/README.md), each problem named with its value."""
    if q.dim() != 4 or k.dim() != 4 or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"rope: q {tuple(q.shape)} and k {tuple(k.shape)} must be [b, s, heads, d] with the same b, s and d")
    b, s, _, d = q.shape
    if cos.shape != sin.shape or cos.dim() != 2 or cos.shape[1] != d or cos.shape[0] < s:
        raise ValueError(f"rope: cos {tuple(cos.shape)} / sin {tuple(sin.shape)} must be [max_seq >= {s}, {d}] "
                         "(engine/ops/rope/tables.py)")
    if cu_seqlens is not None and (cu_seqlens.dim() != 1 or cu_seqlens.dtype != torch.int32 or max_seqlen is None):
        raise ValueError(f"rope: cu_seqlens must be int32 [documents + 1] with max_seqlen a host int; got "
                         f"{cu_seqlens.dtype} {tuple(cu_seqlens.shape)}, max_seqlen={max_seqlen!r}")


def document_positions(cu_seqlens: torch.Tensor, b: int, s: int) -> torch.Tensor:
    """int64 [b, s]: each token's index inside its document; cu_seqlens are the flattened offsets."""
    starts = cu_seqlens.to(torch.int64)
    tokens = torch.arange(b * s, device=cu_seqlens.device)
    document = torch.searchsorted(starts, tokens, right=True) - 1
    return (tokens - starts[document]).view(b, s)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
         cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, k) rotated by each token's position (engine/ops/README.md)."""
    check_inputs(q, k, cos, sin, cu_seqlens, max_seqlen)
    b, s = q.shape[:2]
    if cu_seqlens is None:
        c, sn = cos[:s].to(q.dtype)[None, :, None, :], sin[:s].to(q.dtype)[None, :, None, :]
    else:
        positions = document_positions(cu_seqlens, b, s)
        c, sn = cos[positions].to(q.dtype)[:, :, None, :], sin[positions].to(q.dtype)[:, :, None, :]
    return _rotate(q, c, sn), _rotate(k, c, sn)
