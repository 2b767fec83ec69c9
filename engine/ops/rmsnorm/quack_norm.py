"""RMSNorm on quack's CuTeDSL row kernels, including the residual-fused form of the contract.

Why and how: docs/engine/ops.md, section `engine/ops/rmsnorm/quack_norm.py`.
"""

import torch
from quack.rmsnorm import rmsnorm as quack_rmsnorm
from quack.rmsnorm import rmsnorm_bwd, rmsnorm_fwd

from engine.ops.kernel_cache import configure_quack_cache

__all__ = ["rmsnorm"]

configure_quack_cache()

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class _ResidualRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, residual, eps, residual_scale):
        n = x.shape[-1]
        x2 = x.reshape(-1, n)
        r2 = residual.reshape(-1, n)
        branch = x2 if residual_scale == 1.0 else x2.float().mul_(residual_scale)
        out, s, rstd = rmsnorm_fwd(branch, weight, residual=r2, out_dtype=x.dtype, residual_dtype=residual.dtype,
                                   eps=eps, store_rstd=True)
        ctx.save_for_backward(s, weight, rstd)
        ctx.residual_scale = residual_scale
        ctx.set_materialize_grads(False)
        return out.view(x.shape), s.view(residual.shape)

    @staticmethod
    def backward(ctx, dout, ds_out):
        s, weight, rstd = ctx.saved_tensors
        shape = dout.shape if dout is not None else ds_out.shape
        n = s.shape[-1]
        if dout is None:
            dout = torch.zeros_like(s)
        dout2 = dout.reshape(-1, n).contiguous()
        ds_out2 = ds_out.reshape(-1, n).contiguous() if ds_out is not None else None
        ds, dw, _, _ = rmsnorm_bwd(s, weight, dout2, rstd, dresidual_out=ds_out2, has_residual=True)
        dres = ds.view(shape)
        dx = dres if ctx.residual_scale == 1.0 else (ds * ctx.residual_scale).view(shape)
        return dx, dw, dres, None, None


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, *, eps: float, residual: torch.Tensor | None = None,
            residual_scale: float = 1.0) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """rmsnorm(x), or with `residual`: (rmsnorm(s), s) where s = residual + residual_scale * x."""
    if x.shape[-1] != weight.shape[-1] or weight.dim() != 1:
        raise ValueError(f"rmsnorm: weight {tuple(weight.shape)} does not match the last dim of x {tuple(x.shape)}")
    if x.dtype not in _DTYPES or weight.dtype not in _DTYPES or not x.is_cuda:
        raise ValueError(f"rmsnorm (quack) runs fp16/bf16/fp32 CUDA tensors; got x {x.dtype} {x.device}: "
                         "use --op-rmsnorm baseline")
    if x.shape[-1] % 8:
        raise ValueError(f"rmsnorm (quack) needs the hidden size to be a multiple of 8; got {x.shape[-1]}")
    if residual is None:
        return quack_rmsnorm(x, weight, eps=eps)
    if residual.shape != x.shape:
        raise ValueError(f"rmsnorm: residual {tuple(residual.shape)} and x {tuple(x.shape)} differ in shape")
    return _ResidualRMSNorm.apply(x, weight, residual, eps, float(residual_scale))
