"""Causal GQA attention on flash-attn-4's CuTeDSL SM90 kernels (forward and backward).

`flash_attn.cute.flash_attn_func` takes the engine's layout [b, s, h, d] as is, maps query head i
to KV head i // (hq / hkv) itself (no K/V copies), keeps the softmax statistics (lse) for its own
backward and returns (out, lse). Head dims 64 (MiniCPM4-0.5B) and 128 (MiniCPM4-8B) use FA4's
tuned SM90 tiles. Compiled kernels go to the on-disk cache (engine/ops/kernel_cache.py).

Two versions differ in one forward knob. `attention` keeps FA4's default for GQA, PackGQA (the
query heads that share a KV head are packed into one M tile, so each K/V tile is loaded once per
group). `attention_nopack` (version fa4-nopack) gives every query head its own M tiles, loaded by
TMA, and leaves K/V reuse across the group to L2. FA4's backward never packs.
"""

import torch
from flash_attn.cute import flash_attn_func

from engine.ops.kernel_cache import configure_fa4_cache

__all__ = ["attention", "attention_nopack"]

configure_fa4_cache()

_DTYPES = (torch.bfloat16, torch.float16)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"attention wants q [b, s, hq, d] and k, v [b, s, hkv, d]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"attention: query heads {q.shape[2]} are not a multiple of KV heads {k.shape[2]}")
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype or not q.is_cuda:
        raise ValueError(f"attention (fa4) runs bf16/fp16 CUDA tensors; got {q.dtype} on {q.device}: "
                         "use --op-attention baseline")
    if q.shape[3] % 8 or q.shape[3] > 256:
        raise ValueError(f"attention (fa4) needs a head dim that is a multiple of 8 and <= 256; got {q.shape[3]}")


def _fa4(q, k, v, softmax_scale: float, pack_gqa: bool | None) -> torch.Tensor:
    _check(q, k, v)
    result = flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=True, pack_gqa=pack_gqa)
    return result[0] if isinstance(result, tuple) else result


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, softmax_scale: float) -> torch.Tensor:
    """Causal GQA attention (FA4 defaults: PackGQA forward). q [b, s, hq, d]; k, v [b, s, hkv, d]."""
    return _fa4(q, k, v, softmax_scale, None)


def attention_nopack(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, softmax_scale: float) -> torch.Tensor:
    """Causal GQA attention, forward without PackGQA (one M tile per query head)."""
    return _fa4(q, k, v, softmax_scale, False)
