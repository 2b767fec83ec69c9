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

from engine.distributed.fp8 import check_wgrad
from engine.ops.kernel_cache import configure_quack_cache

__all__ = ["wgrad_add"]

configure_quack_cache()


def wgrad_add(out: torch.Tensor, qa: torch.Tensor, sa: torch.Tensor, qb: torch.Tensor, sb: torch.Tensor) -> None:
    """out += (qa / sa) @ (qb / sb)^T (engine/ops/fp8_wgrad/register.toml)."""
    check_wgrad(out, qa, qb, "quack")
    alpha = (sa.reciprocal() * sb.reciprocal()).reshape(1)  # as _scaled_mm's epilogue forms it; quack reads (1,)
    gemm_add_inplace(qa, qb.t(), out, alpha=alpha, beta=1.0, tuned=False)
