"""quack's cross-entropy kernels, launched so that d loss / d logits is written in the GEMM dtype.

gemm_output (quack_ce.py) keeps its logits in fp32 but feeds the gradient GEMMs bf16 dlogits. quack's
own launchers (`cross_entropy_fwd_out`, `cross_entropy_bwd`) insist that dx has the logits' dtype, so
the fp32 gradient went to memory (4 bytes per logit) and a separate cast read it back to write bf16:
about 1 ms per 4096 x 73472 chunk on an H200, 8 ms of a MiniCPM4-8B step at GAS 8. The kernel bodies
already compute in fp32 and convert to dx's element type on the store; only the launchers' dtype
asserts and their fake tensors for compilation stand in the way. The two classes below replace just
the launchers (the `__call__` that sizes tiles and launches the kernel), specialised to what gemm_output
passes: no class weights, no separate target logits. dx may be any float dtype (fp32 too: the
no-gradient forward writes it over the logits themselves).
"""

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, const_expr
from quack import layout_utils
from quack.cache import jit_cache
from quack.compile_utils import make_fake_tensor
from quack.cross_entropy import CrossEntropy, CrossEntropyBackward
from quack.cute_dsl_utils import torch2cute_dtype_map

__all__ = ["ce_forward_", "ce_backward_"]


class _Forward(CrossEntropy):
    """Per row: loss = lse - x[target] (0 where target == ignore_index) and dx = softmax(x) - onehot(target),
    dx in its own dtype. Two-pass softmax (online_softmax=False): quack's online variant makes the row loss NaN
    when a warp holds only -inf columns (the vocabulary padding)."""

    @cute.jit
    def __call__(self, mX: cute.Tensor, mTarget: cute.Tensor, mLoss: cute.Tensor, mdX: cute.Tensor,
                 ignore_index: Int32, stream: cuda.CUstream):
        self._set_cluster_n()
        vecsize = math.gcd(self.N, 128 // max(mX.element_type.width, mdX.element_type.width))
        tiled_copy, tiler_mn, threads_per_row = self._get_tiled_copy(vecsize=vecsize)
        self.kernel(mX, mTarget, mX, mLoss, None, mdX, None, ignore_index, tiler_mn, tiled_copy,
                    threads_per_row).launch(
            grid=[cute.ceil_div(mX.shape[0], tiler_mn[0]), self.cluster_n, 1],
            block=[tiled_copy.size, 1, 1],
            cluster=[1, self.cluster_n, 1] if const_expr(self.cluster_n > 1) else None,
            stream=stream,
        )


class _Backward(CrossEntropyBackward):
    """dx = (exp(x - lse) - onehot(target)) * dloss per row, dx in its own dtype; rows whose target is
    ignore_index get 0, a target that matches no column (another TP rank's label) gets no onehot."""

    @cute.jit
    def __call__(self, mX: cute.Tensor, mTarget: cute.Tensor, mDLoss: cute.Tensor, mdX: cute.Tensor,
                 mLSE: cute.Tensor, ignore_index: Int32, stream: cuda.CUstream):
        vecsize = math.gcd(self.N, 128 // self.dtype.width)
        tiled_copy, tiler_mn, threads_per_row = self._get_tiled_copy(vecsize=vecsize)
        mDLoss, mTarget, mLSE = [layout_utils.expand(t, dim=1, size=self.N) for t in (mDLoss, mTarget, mLSE)]
        self.kernel(mX, mTarget, mDLoss, mdX, mLSE, None, ignore_index, mX.shape, tiler_mn, tiled_copy,
                    threads_per_row).launch(
            grid=[cute.ceil_div(mX.shape[0], tiler_mn[0]), cute.ceil_div(mX.shape[1], tiler_mn[1]), 1],
            block=[tiled_copy.size, 1, 1],
            stream=stream,
        )


def _matrix(dtype: type[cutlass.Numeric], rows, n: int):
    return make_fake_tensor(dtype, (rows, n), math.gcd(128 // dtype.width, n))


@jit_cache
def _compile_forward(x_dtype, dx_dtype, target_dtype, n: int):
    rows = cute.sym_int()
    return cute.compile(_Forward(x_dtype, n, online_softmax=False), _matrix(x_dtype, rows, n),
                        make_fake_tensor(target_dtype, (rows,)), make_fake_tensor(Float32, (rows,)),
                        _matrix(dx_dtype, rows, n), Int32(0),
                        cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")


@jit_cache
def _compile_backward(x_dtype, dx_dtype, target_dtype, n: int):
    rows = cute.sym_int()
    dloss = cute.runtime.make_fake_tensor(Float32, (rows,), stride=(cute.sym_int64(),))
    return cute.compile(_Backward(x_dtype, n), _matrix(x_dtype, rows, n), make_fake_tensor(target_dtype, (rows,)),
                        dloss, _matrix(dx_dtype, rows, n), make_fake_tensor(Float32, (rows,)), Int32(0),
                        cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")


def _check(name: str, x: torch.Tensor, target: torch.Tensor, dx: torch.Tensor, rows: dict[str, torch.Tensor]) -> None:
    if x.dim() != 2 or x.dtype != torch.float32 or not x.is_contiguous() or x.shape[1] % 4:
        raise ValueError(f"{name}: logits must be a contiguous fp32 matrix with a multiple of 4 columns; got "
                         f"{x.dtype} {tuple(x.shape)} strides {x.stride()}")
    if dx.shape != x.shape or not dx.is_contiguous() or dx.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"{name}: dx must be a contiguous float matrix shaped as the logits {tuple(x.shape)}; got "
                         f"{dx.dtype} {tuple(dx.shape)} strides {dx.stride()}")
    if target.shape != (x.shape[0],) or target.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}: target must be int32/int64 [{x.shape[0]}]; got {target.dtype} {tuple(target.shape)}")
    for what, t in rows.items():
        if t.shape != (x.shape[0],) or t.dtype != torch.float32:
            raise ValueError(f"{name}: {what} must be fp32 [{x.shape[0]}]; got {t.dtype} {tuple(t.shape)}")


def ce_forward_(x: torch.Tensor, target: torch.Tensor, loss: torch.Tensor, dx: torch.Tensor, ignore_index: int) -> None:
    """loss[i] = lse(x[i]) - x[i, target[i]] and dx[i] = softmax(x[i]) - onehot(target[i]), both 0 on ignored
    rows; x fp32 [m, n], dx [m, n] in any float dtype (it may be x itself), loss fp32 [m]."""
    _check("ce_forward_", x, target, dx, {"loss": loss})
    if x.shape[0]:
        dt = torch2cute_dtype_map
        _compile_forward(dt[x.dtype], dt[dx.dtype], dt[target.dtype], x.shape[1])(x, target, loss, dx,
                                                                                  Int32(ignore_index))


def ce_backward_(x: torch.Tensor, target: torch.Tensor, dloss: torch.Tensor, lse: torch.Tensor, dx: torch.Tensor,
                 ignore_index: int) -> None:
    """dx[i] = (exp(x[i] - lse[i]) - onehot(target[i])) * dloss[i], 0 on rows whose target is ignore_index; a
    target outside 0..n-1 (not ignore_index) adds no onehot. x fp32 [m, n], dx [m, n] any float dtype."""
    _check("ce_backward_", x, target, dx, {"dloss": dloss, "lse": lse})
    if x.shape[0]:
        dt = torch2cute_dtype_map
        _compile_backward(dt[x.dtype], dt[dx.dtype], dt[target.dtype], x.shape[1])(x, target, dloss, dx, lse,
                                                                                   Int32(ignore_index))
