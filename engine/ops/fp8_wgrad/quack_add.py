"""fp8_wgrad on quack's SM90 GEMM with the accumulator added in its epilogue (CuTeDSL).

torch._scaled_mm cannot accumulate into its output (bf16's addmm can), so the baseline writes each FP8 weight
gradient as an fp32 [m, n] product and adds it to the gradient buffer: two extra passes over fp32 per linear and
micro-batch (~21 ms a step on the 4-layer 8B slice, docs/fp8.md). quack's `gemm_add_inplace` (out = alpha A B +
beta out) takes E4M3 / E5M2 operands on SM90, both K-major, which is exactly the layout of the transposed FP8
copies the linears keep for wgrad (dy^T and x^T row-major), and alpha as a device tensor, so the two tensorwise
scales fold into the epilogue without a host sync. FP8 slow accumulation (quack's default, as the baseline's
_scaled_mm) and a fixed tile configuration (tuned=False, no split-K) keep it bit for bit run to run.
"""

import torch
from quack.gemm_interface import gemm_add_inplace

from engine.ops.kernel_cache import configure_quack_cache

__all__ = ["wgrad_add"]

configure_quack_cache()

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def wgrad_add(out: torch.Tensor, qa: torch.Tensor, sa: torch.Tensor, qb: torch.Tensor, sb: torch.Tensor) -> None:
    """out += (qa / sa) @ (qb / sb)^T (engine/ops/fp8_wgrad/register.toml)."""
    (m, k), (n, kb) = qa.shape, qb.shape
    problems = []
    if qa.dtype not in _FP8 or qb.dtype not in _FP8:
        problems.append(f"operands {qa.dtype} and {qb.dtype}, not FP8")
    if out.dtype != torch.float32 or tuple(out.shape) != (m, n) or not out.is_contiguous():
        problems.append(f"out {out.dtype} {tuple(out.shape)} (contiguous: {out.is_contiguous()}), not fp32 [{m}, {n}]")
    if kb != k or k % 16 or qa.stride(-1) != 1 or qb.stride(-1) != 1:
        problems.append(f"qa {tuple(qa.shape)} strides {qa.stride()} and qb {tuple(qb.shape)} strides {qb.stride()}: "
                        "both row-major with one k, a multiple of 16")
    if not (out.is_cuda and qa.is_cuda and qb.is_cuda):
        problems.append("tensors not on CUDA")
    if problems:
        raise ValueError(f"fp8_wgrad (quack) cannot take these inputs: {'; '.join(problems)}: use --op-fp8-wgrad baseline")
    alpha = (sa.reciprocal() * sb.reciprocal()).reshape(1)  # as _scaled_mm's epilogue forms it; quack reads (1,)
    gemm_add_inplace(qa, qb.t(), out, alpha=alpha, beta=1.0, tuned=False)
