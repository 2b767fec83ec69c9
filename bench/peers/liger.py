"""liger-kernel (0.8.x) versions of the engine's hot ops, for bench/ops.py: what a user would pick instead.

Each wraps liger's Triton kernel in the engine op's signature (engine/ops/*/baseline.py), so bench/ops.py
checks and times it exactly like the engine's versions:
- rmsnorm: LigerRMSNormFunction; with a residual, LigerFusedAddRMSNormFunction on (scale x branch, residual)
  (liger fuses the add, not MiniCPM's depth scale: that multiply stays a torch op).
- gemm_fc1: torch's FC1 GEMM, then LigerSiLUMulFunction (liger fuses SwiGLU's elementwise part only).
- gemm_output: LigerFusedLinearCrossEntropyFunction over the true vocabulary rows, reduction sum (TP 1 only:
  liger has no vocab-parallel fused linear CE).
- rope: liger_rotary_pos_emb on q and k (transposed to its [b, heads, s, d]; tables cast to q's dtype); no
  per-document positions.
"""

import torch.nn.functional as F

__all__ = ["liger_version", "liger_candidates"]


def liger_version() -> str:
    from importlib import metadata

    return metadata.version("liger-kernel")


def rmsnorm(x, weight, *, eps, residual=None, residual_scale=1.0):
    from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    if residual is None:
        return LigerRMSNormFunction.apply(x, weight, eps, 0.0, "llama", False)
    branch = x * residual_scale if residual_scale != 1.0 else x
    return LigerFusedAddRMSNormFunction.apply(branch, residual, weight, eps, 0.0, "llama", False)


def gemm_fc1(x, w):
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    gate, up = F.linear(x, w).chunk(2, dim=-1)
    return LigerSiLUMulFunction.apply(gate, up)


def gemm_output(h, w, labels, *, vocab_start, vocab_size, tp_group=None):
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    if vocab_start != 0 or w.shape[0] < vocab_size:
        raise ValueError("liger's fused linear cross-entropy has no vocab-parallel path (TP > 1)")
    loss, *_ = LigerFusedLinearCrossEntropyFunction.apply(h, w[:vocab_size], labels, None, None, -100, 0.0, 0.0, "sum")
    return loss  # (loss, z_loss, token accuracy, predicted tokens)


def rope(q, k, cos, sin, *, cu_seqlens=None, max_seqlen=None):
    """q [b, s, h, d], k [b, s, kv, d] (the engine's layout) -> rotated, via liger's [b, heads, s, d] kernel."""
    from liger_kernel.transformers.rope import liger_rotary_pos_emb

    if cu_seqlens is not None:
        raise ValueError("liger's rope takes no per-document positions (cu_seqlens)")
    s = q.shape[1]
    q2, k2 = liger_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos[None, :s].to(q.dtype), sin[None, :s].to(q.dtype))
    return q2.transpose(1, 2), k2.transpose(1, 2)


def liger_candidates(op: str) -> list:
    """[(version name, fn)] for `op`; raises ImportError (with liger's own message) when liger cannot load."""
    import liger_kernel  # noqa: F401 -- the reason liger is unavailable surfaces here

    fn = {"rmsnorm": rmsnorm, "gemm_fc1": gemm_fc1, "gemm_output": gemm_output, "rope": rope}.get(op)
    return [("liger", fn)] if fn is not None else []
