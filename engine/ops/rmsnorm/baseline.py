"""RMSNorm baseline in plain torch ops (autograd gives the backward).

Statistics and the weight multiply run in fp32 (fp64 inputs stay fp64) and the result is rounded
once to the input dtype, the numerics a fused kernel has. With a residual, the add is also done in
fp32 and rounded once to the residual stream's dtype; the norm then reads that rounded sum, so the
fused call equals `s = residual + scale * x; rmsnorm(s)` written out in the model.
"""

import torch

__all__ = ["rmsnorm"]


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    acc = _acc_dtype(x.dtype)
    xf = x.to(acc)
    inv_rms = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * inv_rms * weight.to(acc)).to(x.dtype)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, *, eps: float, residual: torch.Tensor | None = None,
            residual_scale: float = 1.0) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """rmsnorm(x), or with `residual`: (rmsnorm(s), s) where s = residual + residual_scale * x."""
    if x.shape[-1] != weight.shape[-1] or weight.dim() != 1:
        raise ValueError(f"rmsnorm: weight {tuple(weight.shape)} does not match the last dim of x {tuple(x.shape)}")
    if residual is None:
        return _norm(x, weight, eps)
    if residual.shape != x.shape:
        raise ValueError(f"rmsnorm: residual {tuple(residual.shape)} and x {tuple(x.shape)} differ in shape")
    acc = _acc_dtype(residual.dtype)
    s = (residual.to(acc) + residual_scale * x.to(acc)).to(residual.dtype)
    return _norm(s, weight, eps), s
