"""gemm_fc1 compiled: the baseline's GEMM (bf16, or FP8 with --fp8), then the SwiGLU forward and its backward each
compiled by inductor into one kernel (engine/ops/inductor.py).

The baseline's SwiGLU is eager: silu, a multiply of two strided halves, and in backward two multiplies, silu's
backward and a cat, each a pass over memory (60 ms a step beyond one fused kernel on the 4-layer 8B slice on an
H200: docs/fp8.md). The quack version fuses it into its GEMM, but that GEMM has no FP8 path; this one runs the GEMM
--fp8 asks for. Forward saves only the GEMM output [gate | up]; backward computes in fp32 from it and writes
[dgate | dup] in the model dtype (the baseline rounds silu(gate) and dy * up to it first, so the two differ in the
last bits of bf16: tests/ops/test_gemm_fc1_compiled.py).
"""

import torch
import torch.nn.functional as F

from engine.ops.gemm_fc1.baseline import preact
from engine.ops.inductor import CompiledKernel

__all__ = ["gemm_fc1"]


def _swiglu(pre: torch.Tensor) -> torch.Tensor:
    gate, up = pre.chunk(2, dim=-1)
    return F.silu(gate) * up


def _dswiglu(dy: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    gate, up = pre.float().chunk(2, dim=-1)
    dy = dy.float()
    sig = torch.sigmoid(gate)
    dgate = dy * up * sig * (1 + gate * (1 - sig))
    dup = dy * gate * sig
    return torch.cat([dgate, dup], dim=-1).to(pre.dtype)


def _kernel(fn) -> CompiledKernel:
    # a graph per shape (inductor.py): split and cat by a runtime f would cost a division per element
    return CompiledKernel(fn, "gemm_fc1", "compiled", "engine.ops.gemm_fc1.compiled:gemm_fc1",
                          "use --op-gemm-fc1 baseline")


_FORWARD, _BACKWARD = _kernel(_swiglu), _kernel(_dswiglu)


class _SwiGLU(torch.autograd.Function):
    """silu(gate) * up of pre = [gate | up], 2-D; saves pre only."""

    @staticmethod
    def forward(ctx, pre):  # type: ignore[override]
        ctx.save_for_backward(pre)
        return _FORWARD(pre)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        (pre,) = ctx.saved_tensors
        return _BACKWARD(dy, pre)


def gemm_fc1(x: torch.Tensor, w: torch.Tensor, *, main_grad=None, fp8: str = "off",
             amax: bool = False) -> "torch.Tensor | tuple[torch.Tensor, None]":
    """silu(x @ W_gate^T) * (x @ W_up^T) with w = [W_gate; W_up] of shape [2f, h]; returns [..., f], or with `amax`
    (y, None): the inductor kernel does not take y's amax, so the cast reduces y itself (its own kernel: no slower
    than a reduction here). main_grad, fp8, amax: see engine/ops/gemm_fc1/register.toml."""
    pre = preact(x, w, main_grad, fp8)
    out = _SwiGLU.apply(pre.reshape(-1, pre.shape[-1]))
    y = out.view(*pre.shape[:-1], out.shape[-1])
    return (y, None) if amax else y
