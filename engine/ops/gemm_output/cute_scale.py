"""Our CuTeDSL kernel that scales a bf16/fp16 matrix in place by an fp32 scalar held on the device.

Why and how: docs/engine/ops.md, section `engine/ops/gemm_output/cute_scale.py`.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32
from quack import copy_utils
from quack.cache import jit_cache
from quack.compile_utils import make_fake_tensor
from quack.cute_dsl_utils import torch2cute_dtype_map

__all__ = ["ScaleInPlace", "scale_"]

_THREADS_PER_ROW = 32
_NUM_THREADS = 256
_ELEMS_PER_THREAD = 16


class ScaleInPlace:
    """x [m, n] *= scale[0], fp32 math, one rounding to x's dtype."""

    def __init__(self, dtype: type[cutlass.Numeric], n: int):
        self.dtype = dtype
        self.n = n
        self.rows = _NUM_THREADS // _THREADS_PER_ROW
        self.cols = _ELEMS_PER_THREAD * _THREADS_PER_ROW

    @cute.jit
    def __call__(self, mX: cute.Tensor, mScale: cute.Tensor, stream: cuda.CUstream):
        vec = 128 // mX.element_type.width
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), mX.element_type, num_bits_per_copy=128)
        thr = cute.make_ordered_layout((self.rows, _THREADS_PER_ROW), order=(1, 0))
        copy = cute.make_tiled_copy_tv(atom, thr, cute.make_layout((1, vec)))
        self.kernel(mX, mScale, copy).launch(
            grid=[cute.ceil_div(mX.shape[0], self.rows), cute.ceil_div(self.n, self.cols), 1],
            block=[_NUM_THREADS, 1, 1],
            stream=stream,
        )

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mScale: cute.Tensor, copy: cute.TiledCopy):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, bidy, _ = cute.arch.block_idx()
        tiler = (self.rows, self.cols)
        gX = cute.local_tile(mX, tiler, (bidx, bidy))
        cX = cute.local_tile(cute.make_identity_tensor(mX.shape), tiler, (bidx, bidy))
        thr = copy.get_slice(tidx)
        tXg = thr.partition_S(gX)
        tXc = thr.partition_S(cX)
        rX = cute.make_rmem_tensor_like(tXg)
        pX = copy_utils.predicate_k(tXc, limit=mX.shape[1])
        row = tXc[0][0]
        if row < mX.shape[0]:
            copy_utils.copy(tXg, rX, pred=pX)
            scale = Float32(mScale[0])
            rX.store((rX.load().to(Float32) * scale).to(rX.element_type))
            copy_utils.copy(rX, tXg, pred=pX)


@jit_cache
def _compile(dtype: type[cutlass.Numeric], n: int):
    m = cute.sym_int()
    x = make_fake_tensor(dtype, (m, n), 8)
    scale = make_fake_tensor(Float32, (1,), 1)
    return cute.compile(ScaleInPlace(dtype, n), x, scale, cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True),
                        options="--enable-tvm-ffi")


def scale_(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x *= scale in place (x bf16/fp16 [m, n], contiguous, n % 8 == 0; scale a 1-element fp32 CUDA tensor)."""
    if x.dim() != 2 or x.dtype not in (torch.bfloat16, torch.float16) or not x.is_contiguous() or x.shape[1] % 8:
        raise ValueError(f"scale_: x must be a contiguous bf16/fp16 matrix with a multiple of 8 columns; got "
                         f"{x.dtype} {tuple(x.shape)} strides {x.stride()}")
    if scale.numel() != 1 or scale.dtype != torch.float32 or scale.device != x.device:
        raise ValueError(f"scale_: scale must be one fp32 element on {x.device}; got {scale.dtype} "
                         f"{tuple(scale.shape)} on {scale.device}")
    if x.numel():
        _compile(torch2cute_dtype_map[x.dtype], x.shape[1])(x, scale.reshape(1))
    return x
