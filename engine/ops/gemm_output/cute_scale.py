"""Our CuTeDSL kernel that scales a bf16/fp16 matrix in place by an fp32 scalar held on the device.

gemm_output (quack_ce.py) computes its gradients during the forward, for a loss scale of 1; the
backward then multiplies them by d loss / d loss_sum, a 0-dim fp32 tensor only the backward knows.
torch's `t.mul_(scalar_tensor)` on a bf16 t is slow and inexact: it takes the dtype-casting,
non-vectorised elementwise path (1.11 ms for the 600 MB grad_w of the 8B LM head on an H200, ~1.1
TB/s), and TensorIterator casts the 0-dim fp32 operand to the common dtype bf16 first, so every
gradient carries the scalar's bf16 rounding (up to 2^-9 relative). This kernel reads the scalar
once per thread from device memory (no host sync), multiplies in fp32 and rounds once, with 16-byte
vector accesses: `(t.float() * scale).to(t.dtype)` bitwise, at the floor of 4 bytes per element.

Layout: a CTA tile is 8 rows x 512 columns, one warp per row, 16 consecutive elements per thread
in two 16-byte accesses; columns are predicated (n need only be a multiple of 8), rows beyond m
are skipped.
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
