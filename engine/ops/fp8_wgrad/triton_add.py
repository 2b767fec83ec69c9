"""fp8_wgrad triton: a persistent Triton FP8 GEMM that adds its product into the fp32 accumulator in its epilogue.

Why: torch._scaled_mm cannot accumulate into its output, so the baseline writes each later micro-batch's FP8
weight gradient as an fp32 [m, n] product and adds it (~18 ms a step on the 4-layer 8B slice, docs/fp8.md); quack's
epilogue add waited on every k-tile's accumulator promotion (3.2x slower a step). Here the tiles come in by TMA
(both operands K-major: the layouts of the transposed FP8 copies the linears keep), the product of a tile is formed
on the tensor cores, scaled by 1 / (sa sb) and added to the tile of `out` read and written once.

Accumulation: Hopper's FP8 MMA accumulates in reduced precision; `IMPRECISE` bounds how many k-products it sums
before the partial sum is added into a separate fp32 accumulator (Triton's max_num_imprecise_acc; cuBLAS's
non-fast-accumulation mode promotes the same way). The default promotes once a k-tile (PROMOTE, below): no fast
accumulation, as the op's contract asks. Fixed launch shapes and tile order: bit for bit run to run.
"""

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

__all__ = ["wgrad_add"]

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)

# (BM, BN, BK, GROUP_M, stages, warps, imprecise): one tile shape for every linear of the 8B (m, n >= 4096, k = the
# micro-batch's tokens); bench/fp8_wgrad.py sweeps the alternatives. imprecise = BK: the MMA's partial sums promoted
# to fp32 once a k-tile (the contract's "no fast accumulation").
CONFIG = (128, 256, 128, 8, 3, 8, 128)


@triton.jit
def _tile(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Grouped order: GROUP_M row-tiles share each column-tile while it is in L2."""
    in_group = GROUP_M * num_pid_n
    first_m = (tile_id // in_group) * GROUP_M
    size_m = min(num_pid_m - first_m, GROUP_M)
    return first_m + (tile_id % in_group) % size_m, (tile_id % in_group) // size_m


@triton.jit
def _wgrad_add(a_desc, b_desc, out_ptr, alpha_ptr, M, N, K, NUM_PROGRAMS: tl.constexpr, BM: tl.constexpr,
               BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr,
               IMPRECISE: tl.constexpr):
    """out [M, N] += alpha * A [M, K] @ B [N, K]^T, a tile at a time over NUM_PROGRAMS persistent programs."""
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    alpha = tl.load(alpha_ptr)
    for tile_id in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_PROGRAMS):
        pid_m, pid_n = _tile(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BM
        off_n = pid_n * BN
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in tl.range(0, K, BK, num_stages=STAGES):
            a = a_desc.load([off_m, k])
            b = b_desc.load([off_n, k])
            if IMPRECISE == 0:  # Triton's default on SM90: no promotion (fast accumulation), for the sweep's rows
                acc = tl.dot(a, b.T, acc)
            else:
                acc = tl.dot(a, b.T, acc, max_num_imprecise_acc=IMPRECISE)
        rm = (off_m + tl.arange(0, BM)).to(tl.int64)
        rn = off_n + tl.arange(0, BN)
        at = out_ptr + rm[:, None] * N + rn[None, :]
        inside = (rm[:, None] < M) & (rn[None, :] < N)
        tl.store(at, tl.load(at, mask=inside, other=0.0) + acc * alpha, mask=inside)


def _programs(device: torch.device) -> int:
    """One program an SM (four under Triton's interpreter, where the tests run it on CPU tensors)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def launch(out: torch.Tensor, qa: torch.Tensor, qb: torch.Tensor, alpha: torch.Tensor, config: tuple = CONFIG) -> None:
    """out += alpha * qa @ qb^T at one launch shape (config as CONFIG); alpha a one-element fp32 device tensor."""
    bm, bn, bk, group_m, stages, warps, imprecise = config
    (m, k), n = qa.shape, qb.shape[0]
    programs = min(_programs(out.device), triton.cdiv(m, bm) * triton.cdiv(n, bn))
    _wgrad_add[(programs,)](TensorDescriptor.from_tensor(qa, [bm, bk]), TensorDescriptor.from_tensor(qb, [bn, bk]),
                            out, alpha, m, n, k, NUM_PROGRAMS=programs, BM=bm, BN=bn, BK=bk, GROUP_M=group_m,
                            STAGES=stages, IMPRECISE=imprecise, num_warps=warps)


def check_inputs(out: torch.Tensor, qa: torch.Tensor, qb: torch.Tensor) -> None:
    """The contract's layouts (engine/ops/fp8_wgrad/register.toml), each problem named with the fix."""
    (m, k), (n, kb) = qa.shape, qb.shape
    problems = []
    if qa.dtype not in _FP8 or qb.dtype not in _FP8:
        problems.append(f"operands {qa.dtype} and {qb.dtype}, not FP8")
    if out.dtype != torch.float32 or tuple(out.shape) != (m, n) or not out.is_contiguous():
        problems.append(f"out {out.dtype} {tuple(out.shape)} (contiguous: {out.is_contiguous()}), not fp32 [{m}, {n}]")
    if kb != k or k % 16 or qa.stride() != (k, 1) or qb.stride() != (k, 1):
        problems.append(f"qa {tuple(qa.shape)} strides {qa.stride()} and qb {tuple(qb.shape)} strides {qb.stride()}: "
                        "both contiguous row-major with one k, a multiple of 16")
    if not (out.is_cuda and qa.is_cuda and qb.is_cuda):
        problems.append("tensors not on CUDA")
    if problems:
        raise ValueError(f"fp8_wgrad (triton) cannot take these inputs: {'; '.join(problems)}: "
                         "use --op-fp8-wgrad baseline")


def wgrad_add(out: torch.Tensor, qa: torch.Tensor, sa: torch.Tensor, qb: torch.Tensor, sb: torch.Tensor) -> None:
    """out += (qa / sa) @ (qb / sb)^T (engine/ops/fp8_wgrad/register.toml)."""
    check_inputs(out, qa, qb)
    launch(out, qa, qb, (sa.reciprocal() * sb.reciprocal()).reshape(1))  # as _scaled_mm's epilogue forms alpha
