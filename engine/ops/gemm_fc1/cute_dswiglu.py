"""Our CuTeDSL kernel for the SwiGLU backward of gemm_fc1 (one pass over memory).

Why and how: docs/engine/ops.md, section `engine/ops/gemm_fc1/cute_dswiglu.py`.
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

VEC = 8  # dy / grad elements per thread and repetition (16 bytes in bf16); preact: 2 x VEC
_THREADS_PER_ROW = 32
_NUM_THREADS = 256
_ELEMS_PER_THREAD = 16  # dy elements per thread per CTA tile: REPS = 16 // vec repetitions


def _tiled_copy(dtype: type[cutlass.Numeric], elems: int) -> cute.TiledCopy:
    """Thread t of a row copies `elems` consecutive elements, in 16-byte (or smaller) accesses."""
    atom_elems = min(elems, 128 // dtype.width)
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=atom_elems * dtype.width)
    thr = cute.make_ordered_layout((_NUM_THREADS // _THREADS_PER_ROW, _THREADS_PER_ROW), order=(1, 0))
    return cute.make_tiled_copy_tv(atom, thr, cute.make_layout((1, elems)))


class DSwiGLUConcat:
    """dy [M, f] + interleaved preact [M, 2f] -> dgate [M, f], dup [M, f] (views of one [M, 2f])."""

    def __init__(self, dtype: type[cutlass.Numeric], n: int, vec: int = VEC):
        self.dtype = dtype
        self.n = n
        self.vec = vec
        self.rows = _NUM_THREADS // _THREADS_PER_ROW
        self.cols = vec * _THREADS_PER_ROW * (_ELEMS_PER_THREAD // vec)

    @cute.jit
    def __call__(self, mDY: cute.Tensor, mPre: cute.Tensor, mDG: cute.Tensor, mDU: cute.Tensor,
                 stream: cuda.CUstream):
        copy_h = _tiled_copy(mDY.element_type, self.vec)
        copy_p = _tiled_copy(mPre.element_type, 2 * self.vec)
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
def _compile(dtype: type[cutlass.Numeric], n: int, vec: int):
    m = cute.sym_int()
    # Row strides and base addresses are 16-byte aligned (f % 8 == 0): vectors of up to 8 x 16 bit.
    dy = make_fake_tensor(dtype, (m, n), min(vec, 8))
    pre = make_fake_tensor(dtype, (m, 2 * n), 8)
    dg = make_fake_tensor(dtype, (m, n), min(vec, 8))
    du = make_fake_tensor(dtype, (m, n), min(vec, 8))
    return cute.compile(DSwiGLUConcat(dtype, n, vec), dy, pre, dg, du,
                        cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")


def dswiglu_concat(dy: torch.Tensor, preact: torch.Tensor, *, vec: int = VEC) -> torch.Tensor:
    """[dgate | dup] of shape [M, 2f] from dy [M, f] and the interleaved preact [M, 2f].

    vec (4 or 8) picks the vector width; bench/dswiglu_variants.py times both."""
    m, n = dy.shape
    if preact.shape != (m, 2 * n) or preact.dtype != dy.dtype:
        raise ValueError(f"dswiglu_concat: preact {tuple(preact.shape)} {preact.dtype} does not pair with dy {tuple(dy.shape)} {dy.dtype}")
    if vec not in (4, 8):
        raise ValueError(f"dswiglu_concat: vec={vec} must be 4 or 8")
    if n % 8:
        raise ValueError(f"dswiglu_concat: f={n} must be a multiple of 8 (16-byte aligned rows)")
    dy = dy if dy.stride(-1) == 1 and dy.stride(0) % 8 == 0 else dy.contiguous()
    out = torch.empty(m, 2 * n, dtype=dy.dtype, device=dy.device)
    if m:
        _compile(torch2cute_dtype_map[dy.dtype], n, vec)(dy, preact, out[:, :n], out[:, n:])
    return out
