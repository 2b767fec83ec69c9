"""Our CuTeDSL kernel for the SwiGLU backward of gemm_fc1 (one pass over memory).

The fused forward (quack's gated GEMM) stores the pre-activation interleaved, gate and up side by
side: preact[:, 2j] = gate_j, preact[:, 2j + 1] = up_j. Backward gets dy = d loss / d y for
y = silu(gate) * up and needs

    dgate = dy * up * silu'(gate),   dup = dy * silu(gate)

written in the CONCAT layout [dgate | dup] of the stacked weight [W_gate; W_up], so the two GEMMs
that follow (dx = dpre @ w, dw = dpre^T @ x) are plain cuBLAS calls on the op's own layout.

Unfused, torch needs ~5 elementwise kernels here (silu, its derivative, two products, the cat of
the halves), each a full pass over [M, f] or [M, 2f] tensors. This kernel reads dy (2 B/elem) and
the preact pair (4 B) once and writes the pair of grads (4 B) once: 10 bytes per element of y,
the floor for this step. Math in fp32 (quack.activation.dswiglu), rounded once to the input dtype.

Layout: a CTA covers ROWS x COLS elements of dy (8 rows, one warp per row, 4 repetitions of
4-element vectors per thread). Every thread owns one row; its dy vector k (4 elements, 8 bytes) and
its preact vector k (8 elements, 16 bytes) cover the same output columns, so element i of the dy
fragment pairs with elements 2i and 2i + 1 of the preact fragment. Columns are predicated (f need
only be a multiple of 8); rows beyond M are skipped.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, const_expr
from quack import activation, copy_utils
from quack.cache import jit_cache
from quack.compile_utils import make_fake_tensor
from quack.cute_dsl_utils import torch2cute_dtype_map

__all__ = ["DSwiGLUConcat", "dswiglu_concat"]

_VEC = 4  # dy / grad elements per vector (8 bytes in bf16); the preact vector has 2 x _VEC
_THREADS_PER_ROW = 32
_NUM_THREADS = 256
_REPS = 4


class DSwiGLUConcat:
    """dy [M, f] + interleaved preact [M, 2f] -> dgate [M, f], dup [M, f] (views of one [M, 2f])."""

    def __init__(self, dtype: type[cutlass.Numeric], n: int):
        self.dtype = dtype
        self.n = n
        self.rows = _NUM_THREADS // _THREADS_PER_ROW
        self.cols = _VEC * _THREADS_PER_ROW * _REPS

    @cute.jit
    def __call__(self, mDY: cute.Tensor, mPre: cute.Tensor, mDG: cute.Tensor, mDU: cute.Tensor,
                 stream: cuda.CUstream):
        copy_h = copy_utils.tiled_copy_2d(mDY.element_type, _THREADS_PER_ROW, _NUM_THREADS, _VEC)
        copy_p = copy_utils.tiled_copy_2d(mPre.element_type, _THREADS_PER_ROW, _NUM_THREADS, 2 * _VEC)
        self.kernel(mDY, mPre, mDG, mDU, copy_h, copy_p).launch(
            grid=[cute.ceil_div(mDY.shape[0], self.rows), cute.ceil_div(self.n, self.cols), 1],
            block=[_NUM_THREADS, 1, 1],
            stream=stream,
        )

    @cute.kernel
    def kernel(self, mDY: cute.Tensor, mPre: cute.Tensor, mDG: cute.Tensor, mDU: cute.Tensor,
               copy_h: cute.TiledCopy, copy_p: cute.TiledCopy):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, bidy, _ = cute.arch.block_idx()
        tiler = (const_expr(self.rows), const_expr(self.cols))
        tiler_p = (const_expr(self.rows), const_expr(2 * self.cols))
        shape = mDY.shape

        gDY, gDG, gDU, cH = [
            cute.local_tile(t, tiler, (bidx, bidy))
            for t in (mDY, mDG, mDU, cute.make_identity_tensor(shape))
        ]
        gP = cute.local_tile(mPre, tiler_p, (bidx, bidy))
        cP = cute.local_tile(cute.make_identity_tensor(mPre.shape), tiler_p, (bidx, bidy))

        thr_h = copy_h.get_slice(tidx)
        thr_p = copy_p.get_slice(tidx)
        tDYg = thr_h.partition_S(gDY)
        tDGg = thr_h.partition_D(gDG)
        tDUg = thr_h.partition_D(gDU)
        tHc = thr_h.partition_S(cH)
        tPg = thr_p.partition_S(gP)
        tPc = thr_p.partition_S(cP)

        rDY = cute.make_rmem_tensor_like(tDYg)
        rP = cute.make_rmem_tensor_like(tPg)
        rDG = cute.make_rmem_tensor_like(tDGg)
        rDU = cute.make_rmem_tensor_like(tDUg)
        pH = copy_utils.predicate_k(tHc, limit=shape[1])
        pP = copy_utils.predicate_k(tPc, limit=mPre.shape[1])

        row = tHc[0][0]
        if row < shape[0]:
            copy_utils.copy(tDYg, rDY, pred=pH)
            copy_utils.copy(tPg, rP, pred=pP)

        dy = cute.make_rmem_tensor_like(rDY, Float32)
        dy.store(rDY.load().to(Float32))
        pre = cute.make_rmem_tensor_like(rP, Float32)
        pre.store(rP.load().to(Float32))
        dg = cute.make_rmem_tensor_like(rDY, Float32)
        du = cute.make_rmem_tensor_like(rDY, Float32)
        for i in cutlass.range_constexpr(cute.size(dy)):
            dgate, dup, _ = activation.dswiglu(pre[2 * i], pre[2 * i + 1], dy[i])
            dg[i] = dgate
            du[i] = dup
        rDG.store(dg.load().to(rDG.element_type))
        rDU.store(du.load().to(rDU.element_type))
        if row < shape[0]:
            copy_utils.copy(rDG, tDGg, pred=pH)
            copy_utils.copy(rDU, tDUg, pred=pH)


@jit_cache
def _compile(dtype: type[cutlass.Numeric], n: int):
    m = cute.sym_int()
    # 8-byte vectors for dy and the grads (4 x 16 bit), 16-byte vectors for the preact pairs.
    dy = make_fake_tensor(dtype, (m, n), _VEC)
    pre = make_fake_tensor(dtype, (m, 2 * n), 2 * _VEC)
    dg = make_fake_tensor(dtype, (m, n), _VEC)
    du = make_fake_tensor(dtype, (m, n), _VEC)
    return cute.compile(DSwiGLUConcat(dtype, n), dy, pre, dg, du,
                        cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")


def dswiglu_concat(dy: torch.Tensor, preact: torch.Tensor) -> torch.Tensor:
    """[dgate | dup] of shape [M, 2f] from dy [M, f] and the interleaved preact [M, 2f]."""
    m, n = dy.shape
    if preact.shape != (m, 2 * n) or preact.dtype != dy.dtype:
        raise ValueError(f"dswiglu_concat: preact {tuple(preact.shape)} {preact.dtype} does not pair with dy {tuple(dy.shape)} {dy.dtype}")
    if n % 8:
        raise ValueError(f"dswiglu_concat: f={n} must be a multiple of 8 (16-byte aligned rows)")
    dy = dy if dy.stride(-1) == 1 and dy.stride(0) % 8 == 0 else dy.contiguous()
    out = torch.empty(m, 2 * n, dtype=dy.dtype, device=dy.device)
    if m:
        _compile(torch2cute_dtype_map[dy.dtype], n)(dy, preact, out[:, :n], out[:, n:])
    return out
