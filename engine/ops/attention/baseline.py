"""Attention baseline: torch scaled_dot_product_attention, causal, grouped-query.

Why and how: docs/engine/ops.md, section `engine/ops/attention/baseline.py`.
"""

import torch
import torch.nn.functional as F

__all__ = ["attention"]

_SDPA_HAS_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


def _document_mask(cu_seqlens: torch.Tensor, b: int, s: int, device: torch.device) -> torch.Tensor:
    """[b, 1, s, s] bool: query t may read key u iff u <= t and both lie in the same document."""
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype != torch.int32 or cu_seqlens.device != device:
        raise ValueError(f"attention: cu_seqlens must be int32 [documents + 1] on {device}; got {cu_seqlens.dtype} "
                         f"{tuple(cu_seqlens.shape)} on {cu_seqlens.device}")
    token = torch.arange(b * s, device=device, dtype=torch.int32)
    document = torch.searchsorted(cu_seqlens, token, right=True).view(b, s)
    same = document[:, :, None] == document[:, None, :]
    causal = torch.ones(s, s, dtype=torch.bool, device=device).tril()
    return (same & causal).unsqueeze(1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, softmax_scale: float,
              cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None) -> torch.Tensor:
    """Causal GQA attention. q [b, s, hq, d]; k, v [b, s, hkv, d]; returns [b, s, hq, d] in q.dtype.
    With cu_seqlens (int32, offsets of the documents in the flattened b x s tokens), causal within
    each document only; max_seqlen is not needed here."""
    if q.dim() != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"attention wants q [b, s, hq, d] and k, v [b, s, hkv, d]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    hq, hkv = q.shape[2], k.shape[2]
    if hq % hkv:
        raise ValueError(f"attention: query heads {hq} are not a multiple of KV heads {hkv}")
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if cu_seqlens is not None:
        mask = _document_mask(cu_seqlens, q.shape[0], q.shape[1], q.device)
        if hq != hkv:
            kt = kt.repeat_interleave(hq // hkv, dim=1)
            vt = vt.repeat_interleave(hq // hkv, dim=1)
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=softmax_scale)
        return out.transpose(1, 2)
    extra = {}
    if hq != hkv:
        if _SDPA_HAS_GQA:
            extra["enable_gqa"] = True
        else:
            kt = kt.repeat_interleave(hq // hkv, dim=1)
            vt = vt.repeat_interleave(hq // hkv, dim=1)
    out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=softmax_scale, **extra)
    return out.transpose(1, 2)
