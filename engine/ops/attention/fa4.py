"""Causal GQA attention on flash-attn-4's CuTeDSL SM90 kernels (forward and backward).

Why and how: docs/engine/ops.md, section `engine/ops/attention/fa4.py`.
"""

import torch
from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
from flash_attn.cute import interface as fa_interface

from engine.ops.kernel_cache import configure_fa4_cache

__all__ = ["attention", "attention_nopack", "attention_tuned"]

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


def _varlen(q, k, v, softmax_scale: float, pack_gqa: bool | None, cu_seqlens: torch.Tensor,
            max_seqlen: int | None) -> torch.Tensor:
    """Causal attention within each document of the flattened tokens (FA4's varlen API)."""
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype != torch.int32 or cu_seqlens.device != q.device:
        raise ValueError(f"attention (fa4): cu_seqlens must be int32 [documents + 1] on {q.device}; got "
                         f"{cu_seqlens.dtype} {tuple(cu_seqlens.shape)} on {cu_seqlens.device}")
    if not isinstance(max_seqlen, int) or not 0 < max_seqlen <= q.shape[1]:
        raise ValueError(f"attention (fa4): max_seqlen must be the longest document as a host int in 1..{q.shape[1]}; "
                         f"got {max_seqlen!r}")
    b, s, hq, d = q.shape
    flat = [t.reshape(b * s, t.shape[2], d) for t in (q, k, v)]
    result = flash_attn_varlen_func(*flat, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=max_seqlen,
                                    max_seqlen_k=max_seqlen, softmax_scale=softmax_scale, causal=True,
                                    pack_gqa=pack_gqa, deterministic=torch.are_deterministic_algorithms_enabled())
    out = result[0] if isinstance(result, tuple) else result
    return out.view(b, s, hq, d)


def _fa4(q, k, v, softmax_scale: float, pack_gqa: bool | None, cu_seqlens: torch.Tensor | None,
         max_seqlen: int | None) -> torch.Tensor:
    _check(q, k, v)
    if cu_seqlens is not None:
        return _varlen(q, k, v, softmax_scale, pack_gqa, cu_seqlens, max_seqlen)
    result = flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=True, pack_gqa=pack_gqa,
                             deterministic=torch.are_deterministic_algorithms_enabled())
    return result[0] if isinstance(result, tuple) else result


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, softmax_scale: float,
              cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None) -> torch.Tensor:
    """Causal GQA attention (FA4 defaults: PackGQA forward). q [b, s, hq, d]; k, v [b, s, hkv, d]."""
    return _fa4(q, k, v, softmax_scale, None, cu_seqlens, max_seqlen)


def attention_nopack(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, softmax_scale: float,
                     cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None) -> torch.Tensor:
    """Causal GQA attention, forward without PackGQA (one M tile per query head)."""
    return _fa4(q, k, v, softmax_scale, False, cu_seqlens, max_seqlen)


# head dim -> forward kwargs of FA4's _flash_attn_fwd on SM90 (bench/attention_variants.py)
_SM90_FWD_TILES = {128: {"tile_mn": (192, 128), "mma_pv_is_rs": True, "intra_wg_overlap": False, "num_threads": 512}}


class _TunedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, softmax_scale: float):
        tiles = _SM90_FWD_TILES.get(q.shape[3], {}) if torch.cuda.get_device_capability(q.device)[0] == 9 else {}
        out, lse = fa_interface._flash_attn_fwd(q, k, v, softmax_scale=softmax_scale, causal=True, return_lse=True,
                                                **tiles)[:2]
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.softmax_scale = softmax_scale
        # Read at forward time, as torch's own ops do: the mode the step ran in decides its backward.
        ctx.deterministic = torch.are_deterministic_algorithms_enabled()
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = fa_interface._flash_attn_bwd(q, k, v, out, dout, lse, ctx.softmax_scale, True,
                                                  deterministic=ctx.deterministic)
        return dq, dk, dv, None


def attention_tuned(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, softmax_scale: float,
                    cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None) -> torch.Tensor:
    """Causal GQA attention on FA4's kernels with our SM90 forward tile for head dim 128 (documents: FA4's
    varlen defaults, see the module doc)."""
    _check(q, k, v)
    if cu_seqlens is not None:
        return _varlen(q, k, v, softmax_scale, None, cu_seqlens, max_seqlen)
    return _TunedAttention.apply(q, k, v, float(softmax_scale))
