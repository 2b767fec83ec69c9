"""Attention baseline: torch scaled_dot_product_attention, causal, grouped-query.

SDPA wants [b, h, s, d]; the engine's layout is [b, s, h, d] (what the QKV projection produces and
what FA4 takes), so q, k and v are transposed as views and the output transposed back. Since torch
2.5 SDPA maps query head i to KV head i // (hq // hkv) itself (`enable_gqa`), which lets the flash
backend read the shared K/V instead of copies; older torch gets the same mapping by
repeat_interleave (costs hq / hkv copies of K and V).
"""

import torch
import torch.nn.functional as F

__all__ = ["attention"]

_SDPA_HAS_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, softmax_scale: float) -> torch.Tensor:
    """Causal GQA attention. q [b, s, hq, d]; k, v [b, s, hkv, d]; returns [b, s, hq, d] in q.dtype."""
    if q.dim() != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"attention wants q [b, s, hq, d] and k, v [b, s, hkv, d]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    hq, hkv = q.shape[2], k.shape[2]
    if hq % hkv:
        raise ValueError(f"attention: query heads {hq} are not a multiple of KV heads {hkv}")
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    extra = {}
    if hq != hkv:
        if _SDPA_HAS_GQA:
            extra["enable_gqa"] = True
        else:
            kt = kt.repeat_interleave(hq // hkv, dim=1)
            vt = vt.repeat_interleave(hq // hkv, dim=1)
    out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=softmax_scale, **extra)
    return out.transpose(1, 2)
