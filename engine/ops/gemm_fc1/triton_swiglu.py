"""gemm_fc1 triton: the baseline's GEMM (bf16, or FP8 with --fp8), then the SwiGLU forward and backward each one
hand-written Triton kernel over the GEMM's [gate | up] halves; with --fp8 tensorwise each kernel also takes the amax
of what it writes, so the FP8 casts of FC2's input (the forward's y, the contract's `amax`) and of FC1's output
gradient skip their reduction pass.

Why: under --fp8 gemm_fc1's GEMM is torch._scaled_mm, whose output is [gate | up] in halves; the quack version's
fused epilogue has an FP8 path only on quack's own FP8 GEMM (2.2x slower a step than cuBLAS's on an H200,
docs/fp8.md), and the CuTeDSL SwiGLU backward reads the interleaved layout quack writes. The `compiled` version's
inductor kernels run the halves: its backward moved ~2.3 TB/s (18.5 ms of the slice's FP8 step). These kernels
read and write each byte once in 16-byte vectors, in fp32 inside, and each amax (of the bf16 values the kernel
stores: exactly the amax the cast would reduce, so the same scale and bits) costs no pass of its own: FC1's output
gradient is the largest operand FP8 casts (8192 x 32768 a micro-batch on the slice), FC2's input half of it.

Numerics: fp32 inside, one rounding to the model dtype at the end, as `compiled` (whose kernels round the same
expressions but may order them differently: both are held to the baseline by tolerance, tests/ops).
"""

import torch
import triton
import triton.language as tl

from engine.distributed.fp8 import keeps_fp8
from engine.distributed.wgrad import linear, linear_grads, linear_operands, save_linear_operands, saved_operands
from engine.ops.fp8_cast.triton_cast import max_nan, merge_amax
from engine.ops.gemm_fc1.baseline import check_inputs

__all__ = ["gemm_fc1"]

# a program's tile: BM rows x BF columns of each half. Not swept: elementwise, 16-byte vectors along f; the backward
# moves ~4.0 TB/s at the slice's shape (10.7 ms for 32 calls of 1.34 GB: profile_8b4l_fp8_triton_s14_h200.json)
BM, BF, WARPS = 8, 512, 8


@triton.jit
def _swiglu_fwd(pre_ptr, y_ptr, amax_ptr, M, F, AMAX: tl.constexpr, BM: tl.constexpr, BF: tl.constexpr):
    """y [M, F] = silu(gate) * up of pre [M, 2F] = [gate | up] (both row-major); AMAX: max |y| as stored (NaN if
    any; the masked tail is 0), merged into amax (int32 bits: engine/ops/fp8_cast/triton_cast.py merge_amax)."""
    rm = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    rf = tl.program_id(1).to(tl.int64) * BF + tl.arange(0, BF)
    inside = (rm[:, None] < M) & (rf[None, :] < F)
    at = rm[:, None] * (2 * F) + rf[None, :]
    g = tl.load(pre_ptr + at, mask=inside, other=0.0).to(tl.float32)
    u = tl.load(pre_ptr + at + F, mask=inside, other=0.0).to(tl.float32)
    y = (g * tl.sigmoid(g) * u).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + rm[:, None] * F + rf[None, :], y, mask=inside)
    if AMAX:
        merge_amax(amax_ptr, tl.reduce(tl.reduce(tl.abs(y.to(tl.float32)), 1, max_nan), 0, max_nan))


@triton.jit
def _swiglu_bwd(dy_ptr, pre_ptr, dpre_ptr, amax_ptr, M, F, dy_stride, AMAX: tl.constexpr, BM: tl.constexpr,
                BF: tl.constexpr):
    """dpre [M, 2F] = [dgate | dup] from dy [M, F] and pre = [gate | up]; AMAX: max |dpre| as stored (NaN if any),
    merged into amax (int32 bits: engine/ops/fp8_cast/triton_cast.py merge_amax)."""
    rm = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    rf = tl.program_id(1).to(tl.int64) * BF + tl.arange(0, BF)
    inside = (rm[:, None] < M) & (rf[None, :] < F)
    at = rm[:, None] * (2 * F) + rf[None, :]
    dy = tl.load(dy_ptr + rm[:, None] * dy_stride + rf[None, :], mask=inside, other=0.0).to(tl.float32)
    g = tl.load(pre_ptr + at, mask=inside, other=0.0).to(tl.float32)
    u = tl.load(pre_ptr + at + F, mask=inside, other=0.0).to(tl.float32)
    sig = tl.sigmoid(g)
    dgate = (dy * u * sig * (1 + g * (1 - sig))).to(dpre_ptr.dtype.element_ty)
    dup = (dy * g * sig).to(dpre_ptr.dtype.element_ty)
    tl.store(dpre_ptr + at, dgate, mask=inside)
    tl.store(dpre_ptr + at + F, dup, mask=inside)
    if AMAX:
        m = max_nan(tl.abs(dgate.to(tl.float32)), tl.abs(dup.to(tl.float32)))
        merge_amax(amax_ptr, tl.reduce(tl.reduce(m, 1, max_nan), 0, max_nan))


def swiglu(pre: torch.Tensor, amax: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(silu(gate) * up of a row-major [M, 2F] = [gate | up], its amax as a one-element fp32 tensor where `amax`,
    else None)."""
    m, f = pre.shape[0], pre.shape[1] // 2
    y = torch.empty((m, f), dtype=pre.dtype, device=pre.device)
    bits = torch.zeros((), dtype=torch.int32, device=pre.device) if amax else y
    _swiglu_fwd[(triton.cdiv(m, BM), triton.cdiv(f, BF))](pre, y, bits, m, f, AMAX=amax, BM=BM, BF=BF,
                                                          num_warps=WARPS)
    return y, (bits.view(torch.float32) if amax else None)


def dswiglu(dy: torch.Tensor, pre: torch.Tensor, amax: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """([dgate | dup] [M, 2F] in pre's dtype, its amax as a one-element fp32 tensor where `amax`, else None)."""
    m, f = dy.shape
    dy = dy if dy.stride(1) == 1 else dy.contiguous()
    dpre = torch.empty_like(pre)
    bits = torch.zeros((), dtype=torch.int32, device=dy.device) if amax else dpre
    _swiglu_bwd[(triton.cdiv(m, BM), triton.cdiv(f, BF))](dy, pre, dpre, bits, m, f, dy.stride(0), AMAX=amax, BM=BM,
                                                          BF=BF, num_warps=WARPS)
    return dpre, (bits.view(torch.float32) if amax else None)


class _GemmFc1(torch.autograd.Function):
    """The FC1 linear (engine/distributed/wgrad.py: its FP8 copies kept as every linear keeps them, its weight
    gradient to the sink) and the SwiGLU in one node: saves the operands and the GEMM output [gate | up]. With
    `amax`, returns (y, y's amax) (the amax non-differentiable: no gradient is formed for it)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, sink, fp8: str, amax: bool):
        ctx.sink = sink
        x_op, w_op = linear_operands(ctx, x, w, fp8)
        pre = linear(x_op, w_op, fp8, like=x).reshape(-1, w.shape[0])
        save_linear_operands(ctx, x_op, w_op, w, pre)
        y, y_amax = swiglu(pre, amax)
        y = y.view(*x.shape[:-1], w.shape[0] // 2)
        if not amax:
            return y
        ctx.mark_non_differentiable(y_amax)
        ctx.set_materialize_grads(False)  # no zeros made for the amax's gradient
        return y, y_amax

    @staticmethod
    def backward(ctx, dy: "torch.Tensor | None", *_):
        if dy is None:  # y reached no loss (only with `amax`: grads not materialised)
            return None, None, None, None, None
        x_op, w_op, w, pre = saved_operands(ctx)
        dpre, amax = dswiglu(dy.reshape(-1, dy.shape[-1]), pre, amax=keeps_fp8(ctx.fp8))
        dpre = dpre.view(*ctx.x_shape[:-1], dpre.shape[-1])  # as the linear's output: bf16 dgrad keeps x's shape
        dx, dw = linear_grads(dpre, x_op, w, ctx.sink, ctx.needs_input_grad, ctx.fp8, w_op, ctx.x_shape, amax)
        return dx, dw, None, None, None


def gemm_fc1(x: torch.Tensor, w: torch.Tensor, *, main_grad=None, fp8: str = "off",
             amax: bool = False) -> "torch.Tensor | tuple[torch.Tensor, torch.Tensor]":
    """silu(x @ W_gate^T) * (x @ W_up^T) with w = [W_gate; W_up] of shape [2f, h]; returns [..., f], or with `amax`
    (y, y's amax taken by the forward kernel). main_grad, fp8, amax: see engine/ops/gemm_fc1/register.toml."""
    check_inputs(x, w)
    if not x.is_cuda:
        raise ValueError(f"gemm_fc1 (triton) runs CUDA tensors; got x on {x.device}: use --op-gemm-fc1 baseline")
    return _GemmFc1.apply(x, w, main_grad if w.requires_grad else None, fp8, amax)
