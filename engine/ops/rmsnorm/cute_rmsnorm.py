"""Our CuTeDSL RMSNorm, fused with the scaled residual add of a pre-norm decoder (forward + backward).

Why and how: docs/engine/ops.md, section `engine/ops/rmsnorm/cute_rmsnorm.py`.
"""

import math
import operator
from typing import Optional

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, const_expr
from quack import copy_utils
from quack.cache import jit_cache
from quack.compile_utils import make_fake_tensor
from quack.cute_dsl_utils import torch2cute_dtype_map

from engine.ops.kernel_cache import configure_quack_cache

__all__ = [
    "MAX_N",
    "VEC",
    "ELEMS",
    "BWD_ELEMS",
    "threads_per_row",
    "ctas_per_sm",
    "RMSNormFwd",
    "RMSNormBwd",
    "compile_fwd",
    "compile_bwd",
    "rmsnorm_fwd",
    "rmsnorm_bwd",
    "rmsnorm",
]

configure_quack_cache()

MAX_N = 8192
VEC = 8  # elements per thread and access: 16 bytes of bf16 / fp16
ELEMS = 16  # forward: ~elements per thread and row
BWD_ELEMS = 16  # backward: the same (bench/rmsnorm_gpu_check.py also times 8)
_ACT_DTYPES = (torch.bfloat16, torch.float16)
_W_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def threads_per_row(n: int, elems: int) -> int:
    """Threads covering one row: ~`elems` elements each, a power of two in [32, 512]."""
    want = max(1, math.ceil(n / elems))
    return min(512, max(32, 1 << (want - 1).bit_length()))


def ctas_per_sm(n: int, elems: int) -> int:
    """Resident backward CTAs per SM the grid is sized for: 8192 / (elements per thread) threads
    per SM (512 at 16 elements = <= 128 registers per thread, 1024 at 8 = <= 64), which the
    kernel's minctasm makes the compiler honour."""
    tpr = threads_per_row(n, elems)
    per_thread = VEC * math.ceil(n / (VEC * tpr))
    return max(1, min(32, (8192 // per_thread) // tpr))


def _tiled_copy(dtype: type[cutlass.Numeric], tpr: int) -> cute.TiledCopy:
    """Thread t of a row copies VEC consecutive elements (16-byte accesses at most)."""
    atom_elems = min(VEC, 128 // dtype.width)
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=atom_elems * dtype.width)
    thr = cute.make_ordered_layout((1, tpr), order=(1, 0))
    return cute.make_tiled_copy_tv(atom, thr, cute.make_layout((1, VEC)))


@cute.jit
def _row_sum(val: Float32, buf: cute.Tensor, stage: cutlass.Int32, warps: cutlass.Constexpr[int]) -> Float32:
    """Sum of `val` over the CTA's row; every thread gets the same value (same addition order).

    buf: shared [warps, 2] fp32; consecutive calls alternate `stage`, so a slot is rewritten only
    after the barrier of the next call, which every reader of the previous call has passed."""
    val = cute.arch.warp_reduction(val, operator.add)
    if const_expr(warps > 1):
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if cute.arch.lane_idx() == 0:
            buf[warp, stage] = val
        cute.arch.barrier()
        total = buf[0, stage]
        for i in cutlass.range_constexpr(1, warps):
            total = total + buf[i, stage]
        val = total
    return val


@cute.jit
def _mul_rn(a: Float32, b: Float32) -> Float32:
    """a * b rounded to fp32 on its own: PTX `mul.rn` is never contracted into an fma.

    The residual add must round scale * x before adding, as the baseline's separate torch ops do;
    LLVM would otherwise fuse r + scale * x into one fma (one rounding) and s could differ from
    the baseline's in the last bit before its bf16 rounding."""
    return cute.arch.inline_ptx("mul.rn.f32 {$w0}, {$r0}, {$r1};", write_only_types=[Float32], read_only_args=[a, b])


@cute.jit
def _zero(frag: cute.Tensor):
    frag.fill(frag.element_type(0))


class _RowKernel:
    def __init__(self, n: int, elems: int):
        self.n = n
        self.elems = elems
        self.tpr = threads_per_row(n, elems)
        self.warps = self.tpr // 32
        self.reps = math.ceil(n / (VEC * self.tpr))
        self.cols = VEC * self.tpr * self.reps
        self.even = self.cols == n


class RMSNormFwd(_RowKernel):
    """x [M, n] (+ residual [M, n]) -> y [M, n] (+ s [M, n]), rstd [M] fp32; one CTA per row."""

    def __init__(self, n: int, has_residual: bool, elems: int = ELEMS):
        super().__init__(n, elems)
        self.has_residual = has_residual

    @cute.jit
    def __call__(self, mX: cute.Tensor, mR: Optional[cute.Tensor], mW: cute.Tensor, mY: cute.Tensor,
                 mS: Optional[cute.Tensor], mRstd: cute.Tensor, eps: Float32, scale: Float32, stream: cuda.CUstream):
        copy_a = _tiled_copy(mX.element_type, self.tpr)
        copy_r = _tiled_copy(mR.element_type, self.tpr) if const_expr(self.has_residual) else None
        copy_w = _tiled_copy(mW.element_type, self.tpr)
        self.kernel(mX, mR, mW, mY, mS, mRstd, eps, scale, copy_a, copy_r, copy_w).launch(
            grid=[mX.shape[0], 1, 1], block=[self.tpr, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mR: Optional[cute.Tensor], mW: cute.Tensor, mY: cute.Tensor,
               mS: Optional[cute.Tensor], mRstd: cute.Tensor, eps: Float32, scale: Float32,
               copy_a: cute.TiledCopy, copy_r: Optional[cute.TiledCopy], copy_w: cute.TiledCopy):
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        tiler = (1, const_expr(self.cols))
        smem = cutlass.utils.SmemAllocator()
        buf = smem.allocate_tensor(Float32, cute.make_layout((self.warps, 2)), byte_alignment=16)

        thr_a = copy_a.get_slice(tidx)
        thr_w = copy_w.get_slice(tidx)
        mW2 = cute.make_tensor(mW.iterator, cute.make_layout((1, self.n), stride=(0, 1)))
        tWg = thr_w.partition_S(cute.local_tile(mW2, tiler, (0, 0)))
        tXg = thr_a.partition_S(cute.local_tile(mX, tiler, (row, 0)))
        tYg = thr_a.partition_D(cute.local_tile(mY, tiler, (row, 0)))
        cA = thr_a.partition_S(cute.local_tile(cute.make_identity_tensor(mX.shape), tiler, (row, 0)))
        cW = thr_w.partition_S(cute.local_tile(cute.make_identity_tensor(mW2.shape), tiler, (0, 0)))
        pA = None if const_expr(self.even) else copy_utils.predicate_k(cA, limit=self.n)
        pW = None if const_expr(self.even) else copy_utils.predicate_k(cW, limit=self.n)

        rX = cute.make_rmem_tensor_like(tXg)
        rW = cute.make_rmem_tensor_like(tWg)
        if const_expr(not self.even):
            _zero(rX)
            _zero(rW)
        cute.copy(copy_a, tXg, rX, pred=pA)
        if const_expr(self.has_residual):
            tRg = thr_a.partition_S(cute.local_tile(mR, tiler, (row, 0)))
            tSg = thr_a.partition_D(cute.local_tile(mS, tiler, (row, 0)))
            rR = cute.make_rmem_tensor_like(tRg)
            if const_expr(not self.even):
                _zero(rR)
            cute.copy(copy_r, tRg, rR, pred=pA)
        cute.copy(copy_w, tWg, rW, pred=pW)

        if const_expr(self.has_residual):
            # Same operation order as the baseline: scale * x, then + residual, in fp32, rounded once.
            xf = cute.make_rmem_tensor_like(rX, Float32)
            xf.store(rX.load().to(Float32))
            for i in cutlass.range_constexpr(cute.size(xf)):
                xf[i] = _mul_rn(xf[i], scale)
            rS = cute.make_rmem_tensor_like(tSg)
            rS.store((rR.load().to(Float32) + xf.load()).to(rS.element_type))
            cute.copy(copy_r, rS, tSg, pred=pA)
            s = rS.load().to(Float32)  # normalise the rounded sum
        else:
            s = rX.load().to(Float32)

        total = _row_sum((s * s).reduce(cute.ReductionOp.ADD, Float32(0.0), 0), buf, 0, self.warps)
        rstd = cute.math.rsqrt(total / self.n + eps)
        if tidx == 0:
            mRstd[row] = rstd

        w = cute.make_rmem_tensor_like(rX, Float32)
        for i in cutlass.range_constexpr(cute.size(w)):
            w[i] = rW[i].to(Float32)
        rY = cute.make_rmem_tensor_like(tYg)
        rY.store((s * rstd * w.load()).to(rY.element_type))
        cute.copy(copy_a, rY, tYg, pred=pA)


class RMSNormBwd(_RowKernel):
    """Persistent backward: CTA b walks rows b, b + grid, ...; writes ds / dx per row, dw row b."""

    def __init__(self, n: int, has_residual: bool, has_ds_out: bool, elems: int = BWD_ELEMS):
        super().__init__(n, elems)
        self.has_residual = has_residual
        self.has_ds_out = has_ds_out
        self.ctas_per_sm = ctas_per_sm(n, elems)

    @cute.jit
    def __call__(self, mS: cute.Tensor, mW: cute.Tensor, mDY: cute.Tensor, mDSout: Optional[cute.Tensor],
                 mRstd: cute.Tensor, mDRes: Optional[cute.Tensor], mDX: cute.Tensor, mDW: cute.Tensor,
                 scale: Float32, stream: cuda.CUstream):
        copy_a = _tiled_copy(mS.element_type, self.tpr)
        copy_x = _tiled_copy(mDX.element_type, self.tpr)
        copy_w = _tiled_copy(mW.element_type, self.tpr)
        copy_f = _tiled_copy(Float32, self.tpr)
        self.kernel(mS, mW, mDY, mDSout, mRstd, mDRes, mDX, mDW, scale, copy_a, copy_x, copy_w, copy_f).launch(
            grid=[mDW.shape[0], 1, 1], block=[self.tpr, 1, 1], stream=stream,
            # The grid is sized for ctas_per_sm resident CTAs per SM: a CTA that had to wait for a
            # free slot would start its whole share of rows late. minctasm caps the registers.
            min_blocks_per_mp=self.ctas_per_sm, preferred_smem_carveout=25)

    @cute.kernel
    def kernel(self, mS: cute.Tensor, mW: cute.Tensor, mDY: cute.Tensor, mDSout: Optional[cute.Tensor],
               mRstd: cute.Tensor, mDRes: Optional[cute.Tensor], mDX: cute.Tensor, mDW: cute.Tensor,
               scale: Float32, copy_a: cute.TiledCopy, copy_x: cute.TiledCopy, copy_w: cute.TiledCopy,
               copy_f: cute.TiledCopy):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        tiler = (1, const_expr(self.cols))
        smem = cutlass.utils.SmemAllocator()
        buf = smem.allocate_tensor(Float32, cute.make_layout((self.warps, 2)), byte_alignment=16)

        thr_a = copy_a.get_slice(tidx)
        thr_x = copy_x.get_slice(tidx)
        thr_w = copy_w.get_slice(tidx)
        thr_f = copy_f.get_slice(tidx)
        mW2 = cute.make_tensor(mW.iterator, cute.make_layout((1, self.n), stride=(0, 1)))
        tWg = thr_w.partition_S(cute.local_tile(mW2, tiler, (0, 0)))
        tDWg = thr_f.partition_D(cute.local_tile(mDW, tiler, (bidx, 0)))
        # Every row tile has the same columns: one predicate serves all rows.
        cA = thr_a.partition_S(cute.local_tile(cute.make_identity_tensor(mS.shape), tiler, (0, 0)))
        cW = thr_w.partition_S(cute.local_tile(cute.make_identity_tensor(mW2.shape), tiler, (0, 0)))
        cF = thr_f.partition_S(cute.local_tile(cute.make_identity_tensor(mDW.shape), tiler, (0, 0)))
        pA = None if const_expr(self.even) else copy_utils.predicate_k(cA, limit=self.n)
        pW = None if const_expr(self.even) else copy_utils.predicate_k(cW, limit=self.n)
        pF = None if const_expr(self.even) else copy_utils.predicate_k(cF, limit=self.n)

        rW = cute.make_rmem_tensor_like(tWg)
        if const_expr(not self.even):
            _zero(rW)
        cute.copy(copy_w, tWg, rW, pred=pW)

        tS0 = thr_a.partition_S(cute.local_tile(mS, tiler, (0, 0)))
        rS = cute.make_rmem_tensor_like(tS0)
        rDY = cute.make_rmem_tensor_like(tS0, mDY.element_type)
        rDSo = cute.make_rmem_tensor_like(tS0, mDSout.element_type) if const_expr(self.has_ds_out) else None
        # Zero once: predicated-off columns are never loaded, so they stay zero for every row.
        if const_expr(not self.even):
            _zero(rS)
            _zero(rDY)
            if const_expr(self.has_ds_out):
                _zero(rDSo)
        w = cute.make_rmem_tensor_like(rS, Float32)
        for i in cutlass.range_constexpr(cute.size(w)):
            w[i] = rW[i].to(Float32)
        acc = cute.make_rmem_tensor_like(rS, Float32)
        acc.fill(0.0)
        rDX = cute.make_rmem_tensor_like(tS0, mDX.element_type)
        rDRes = cute.make_rmem_tensor_like(tS0, mDRes.element_type) if const_expr(self.has_residual) else None

        stage = cutlass.Int32(0)
        for row in cutlass.range(bidx, mS.shape[0], gdim, unroll=1):
            tSg = thr_a.partition_S(cute.local_tile(mS, tiler, (row, 0)))
            tDYg = thr_x.partition_S(cute.local_tile(mDY, tiler, (row, 0)))
            cute.copy(copy_a, tSg, rS, pred=pA)
            cute.copy(copy_x, tDYg, rDY, pred=pA)
            if const_expr(self.has_ds_out):
                tDSog = thr_a.partition_S(cute.local_tile(mDSout, tiler, (row, 0)))
                cute.copy(copy_a, tDSog, rDSo, pred=pA)
            rstd = mRstd[row]

            s_hat = rS.load().to(Float32) * rstd
            dy = rDY.load().to(Float32)
            wdy = dy * w.load()
            dot = _row_sum((wdy * s_hat).reduce(cute.ReductionOp.ADD, Float32(0.0), 0), buf, stage, self.warps)
            stage = 1 - stage
            ds = (wdy - s_hat * (dot / self.n)) * rstd
            if const_expr(self.has_ds_out):
                ds = ds + rDSo.load().to(Float32)
            acc.store(acc.load() + dy * s_hat)

            tDXg = thr_x.partition_D(cute.local_tile(mDX, tiler, (row, 0)))
            if const_expr(self.has_residual):
                tDRg = thr_a.partition_D(cute.local_tile(mDRes, tiler, (row, 0)))
                rDRes.store(ds.to(rDRes.element_type))
                cute.copy(copy_a, rDRes, tDRg, pred=pA)
                rDX.store((ds * scale).to(rDX.element_type))
            else:
                rDX.store(ds.to(rDX.element_type))
            cute.copy(copy_x, rDX, tDXg, pred=pA)

        rDW = cute.make_rmem_tensor_like(tDWg)
        for i in cutlass.range_constexpr(cute.size(rDW)):
            rDW[i] = acc[i]
        cute.copy(copy_f, rDW, tDWg, pred=pF)


def _fake_rows(dtype, m, n):
    # Row strides and base addresses are 16-byte aligned (n % 8 == 0, _rows() checks the pointers).
    return make_fake_tensor(dtype, (m, n), 128 // dtype.width)


@jit_cache
def compile_fwd(x_dtype: type[cutlass.Numeric], res_dtype: type[cutlass.Numeric] | None,
                w_dtype: type[cutlass.Numeric], n: int):
    """The compiled forward for (x dtype, residual dtype or None, weight dtype, n)."""
    m = cute.sym_int()
    has_res = res_dtype is not None
    return cute.compile(
        RMSNormFwd(n, has_res),
        _fake_rows(x_dtype, m, n), _fake_rows(res_dtype, m, n) if has_res else None,
        make_fake_tensor(w_dtype, (n,), 128 // w_dtype.width), _fake_rows(x_dtype, m, n),
        _fake_rows(res_dtype, m, n) if has_res else None, make_fake_tensor(Float32, (m,)),
        Float32(1e-6), Float32(1.0), cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True),
        options="--enable-tvm-ffi")


@jit_cache
def compile_bwd(s_dtype: type[cutlass.Numeric], x_dtype: type[cutlass.Numeric], w_dtype: type[cutlass.Numeric],
                n: int, has_residual: bool, has_ds_out: bool, elems: int = BWD_ELEMS):
    """The compiled backward; s_dtype is the saved input's (residual's, or x's without one)."""
    m, g = cute.sym_int(), cute.sym_int()
    return cute.compile(
        RMSNormBwd(n, has_residual, has_ds_out, elems),
        _fake_rows(s_dtype, m, n), make_fake_tensor(w_dtype, (n,), 128 // w_dtype.width),
        _fake_rows(x_dtype, m, n), _fake_rows(s_dtype, m, n) if has_ds_out else None,
        make_fake_tensor(Float32, (m,)), _fake_rows(s_dtype, m, n) if has_residual else None,
        _fake_rows(x_dtype, m, n), make_fake_tensor(Float32, (g, n), 4), Float32(1.0),
        cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """t as [M, n] rows with unit column stride, 16-byte aligned rows and base (else a copy)."""
    t2 = t.reshape(-1, n)
    aligned = t2.stride(1) == 1 and (t2.stride(0) * t2.element_size()) % 16 == 0 and t2.data_ptr() % 16 == 0
    return t2 if aligned else t2.contiguous()


def _vec(w: torch.Tensor) -> torch.Tensor:
    """The weight as a contiguous, 16-byte aligned vector (else a copy)."""
    return w if w.is_contiguous() and w.data_ptr() % 16 == 0 else w.clone(memory_format=torch.contiguous_format)


def _check(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> None:
    if x.shape[-1] != weight.shape[-1] or weight.dim() != 1:
        raise ValueError(f"rmsnorm: weight {tuple(weight.shape)} does not match the last dim of x {tuple(x.shape)}")
    n = x.shape[-1]
    if n % 8 or n > MAX_N:
        raise ValueError(f"rmsnorm (cute) needs the hidden size to be a multiple of 8 and at most {MAX_N}; got {n}: "
                         "use --op-rmsnorm baseline")
    if not x.is_cuda or x.dtype not in _ACT_DTYPES or weight.dtype not in _W_DTYPES or weight.device != x.device:
        raise ValueError(f"rmsnorm (cute) runs bf16/fp16 CUDA activations and a bf16/fp16/fp32 weight on the same "
                         f"device; got x {x.dtype} {x.device}, weight {weight.dtype} {weight.device}: "
                         "use --op-rmsnorm baseline")
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"rmsnorm: residual {tuple(residual.shape)} and x {tuple(x.shape)} differ in shape")
        if residual.dtype not in _ACT_DTYPES or residual.device != x.device:
            raise ValueError(f"rmsnorm (cute) runs a bf16/fp16 residual on x's device; got {residual.dtype} "
                             f"{residual.device}: use --op-rmsnorm baseline")


def _cute_dtype(dtype: torch.dtype) -> type[cutlass.Numeric]:
    return torch2cute_dtype_map[dtype]


def rmsnorm_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
                residual_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(y [M, n], s [M, n] or None, rstd [M] fp32) for x, residual viewed as rows [M, n]."""
    n = x.shape[-1]
    x2 = _rows(x, n)
    r2 = _rows(residual, n) if residual is not None else None
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    s = torch.empty(x2.shape, dtype=residual.dtype, device=x.device) if residual is not None else None
    rstd = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
    if x2.shape[0]:
        kernel = compile_fwd(_cute_dtype(x.dtype), _cute_dtype(residual.dtype) if residual is not None else None,
                             _cute_dtype(weight.dtype), n)
        kernel(x2, r2, _vec(weight), y, s, rstd, float(eps), float(residual_scale))
    return y, s, rstd


_SM_COUNT: dict[int, int] = {}


def _grid(device: torch.device, m: int, n: int, elems: int) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return max(1, min(m, _SM_COUNT[index] * ctas_per_sm(n, elems)))


def rmsnorm_bwd(s: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor,
                ds_out: torch.Tensor | None, *, x_dtype: torch.dtype, has_residual: bool,
                residual_scale: float = 1.0, elems: int = BWD_ELEMS) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(dx [M, n] x_dtype, dresidual [M, n] or None, dweight fp32 [n]) for rows s [M, n], dy [M, n].

    elems: ~elements per thread (16 or 8; a compile-time variant for benchmarks)."""
    m, n = s.shape
    dy2 = _rows(dy, n)
    ds2 = _rows(ds_out, n) if ds_out is not None else None
    dx = torch.empty((m, n), dtype=x_dtype, device=s.device)
    dres = torch.empty((m, n), dtype=s.dtype, device=s.device) if has_residual else None
    partial = torch.empty((_grid(s.device, m, n, elems), n), dtype=torch.float32, device=s.device)
    if m:
        kernel = compile_bwd(_cute_dtype(s.dtype), _cute_dtype(x_dtype), _cute_dtype(weight.dtype), n,
                             has_residual, ds2 is not None, elems)
        kernel(s, _vec(weight), dy2, ds2, rstd, dres, dx, partial, float(residual_scale))
    else:
        partial.zero_()
    # Fixed-shape torch reduction over the per-CTA rows: same order every call (no atomics).
    return dx, dres, partial.sum(dim=0)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        y, _, rstd = rmsnorm_fwd(x, weight, eps)
        ctx.save_for_backward(_rows(x, x.shape[-1]), weight, rstd)
        ctx.x_shape = x.shape
        ctx.set_materialize_grads(False)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, rstd = ctx.saved_tensors
        if dy is None:
            return None, None, None
        dx, _, dw = rmsnorm_bwd(x2, weight, rstd, dy, None, x_dtype=x2.dtype, has_residual=False)
        return dx.view(ctx.x_shape), dw.to(weight.dtype), None


class _ResidualRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, residual, eps, residual_scale):
        y, s, rstd = rmsnorm_fwd(x, weight, eps, residual, residual_scale)
        ctx.save_for_backward(s, weight, rstd)
        ctx.x_shape, ctx.x_dtype, ctx.residual_scale = x.shape, x.dtype, residual_scale
        ctx.set_materialize_grads(False)
        return y.view(x.shape), s.view(x.shape)

    @staticmethod
    def backward(ctx, dy, ds_out):
        s, weight, rstd = ctx.saved_tensors
        shape, scale = ctx.x_shape, ctx.residual_scale
        if dy is None:
            # y unused: ds = ds_out exactly, and the weight gets no gradient (None, as the baseline's
            # autograd gives it: y is its only path).
            if ds_out is None:
                return None, None, None, None, None
            dres = ds_out.to(s.dtype)
            dx = (ds_out.float() * scale).to(ctx.x_dtype)
            return dx.view(shape), None, dres.view(shape), None, None
        dx, dres, dw = rmsnorm_bwd(s, weight, rstd, dy, ds_out, x_dtype=ctx.x_dtype, has_residual=True,
                                   residual_scale=scale)
        return dx.view(shape), dw.to(weight.dtype), dres.view(shape), None, None


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, *, eps: float, residual: torch.Tensor | None = None,
            residual_scale: float = 1.0) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """rmsnorm(x), or with `residual`: (rmsnorm(s), s) where s = residual + residual_scale * x."""
    _check(x, weight, residual)
    if residual is None:
        return _RMSNorm.apply(x, weight, float(eps))
    return _ResidualRMSNorm.apply(x, weight, residual, float(eps), float(residual_scale))
