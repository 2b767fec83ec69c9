"""fp8_cast triton: the cast as two hand-written Triton kernels, the amax pass and one tiled pass that writes q and
q^T, the transpose staged through shared memory so both stores run along rows.

Why: inductor's one kernel writing both layouts moved ~2 TB/s on an H200 (the slice's 272 casts a step took 38 ms,
docs/fp8.md "Where the slice's FP8 step goes"; 4 bytes an element: a bf16 read, two FP8 writes), half the memory's
speed; this one ~3.5 TB/s (22.4 ms; bench/fp8_cast.py). Each program loads a [BM, BN] tile of t (along its
contiguous dimension, whichever that is), scales, clamps and rounds it once, and stores the tile to q and its
transpose to q^T; Triton lays the transposed store out through shared memory. The amax reads t once beforehand
(each program a few blocks loaded together, its max merged into one value by an atomic max), and the cast kernel
forms the scale from it as the baseline does: max(dtype) x (1 / amax) with the reciprocal in fp64, rounded to fp32
(engine/distributed/fp8.py scale_for), 1 for an amax of 0 or NaN. A memset and two launches a cast, no small torch
kernels; with a known `amax` (the contract's: the kernel that wrote t took it) the cast kernel alone.

A scale per row or rounded to a power of two (rowwise) comes from the baseline's eager `amax_scale`; the write is
the same kernel reading that scale. Every path equals the baseline bit for bit (tests/ops/test_fp8_cast.py -m gpu):
the amax is a max (exact in any order), the scale the same formula, the write fp32 multiply, clamp and
round-to-nearest-even, elementwise.
"""

import torch
import triton
import triton.language as tl

from engine.distributed.fp8 import E4M3, E5M2, amax_scale, check_cast
from engine.errors import KernelLoadError

__all__ = ["cast", "max_nan", "merge_amax"]

_FORMATS = {E4M3: tl.float8e4nv, E5M2: tl.float8e5}

# Launch shapes (bench/fp8_cast.py sweeps them at the 8B's operand shapes; none changes a bit, only the time):
# the amax: a block of elements, its warps, and blocks a program (loaded together); the cast: a [BM, BN] tile a
# program and its warps. Over the 8B's operands every swept shape but a 128 x 256 tile (+19 %) sums within 3 % of
# these (fourteenth session, 1 x H200: bench/results/fp8_cast_s14_h200.json), about the spread of one shape measured
# twice; these are the first sweep's fastest tile and the atomic amax's first guess.
AMAX_BLOCK, AMAX_WARPS, AMAX_UNROLL = 4096, 8, 4
CAST_BM, CAST_BN, CAST_WARPS = 64, 64, 4


@triton.jit
def max_nan(a, b):
    """max keeping NaN (tl.maximum's default drops it): an amax of a tensor with a NaN is NaN, as torch's."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def merge_amax(amax_ptr, block_max):
    """Merge a program's max |x| (>= 0, or NaN) into the tensor's amax: an atomic max on int32, zeroed beforehand. The
    bits of floats >= 0 order as integers and a NaN's sit above +inf's, so the integer max is the float max, NaN kept;
    a max is exact in any order, so the result is the same whatever order the programs run in."""
    tl.atomic_max(amax_ptr, block_max.to(tl.int32, bitcast=True), sem="relaxed")


@triton.jit
def _amax(x_ptr, amax_ptr, numel, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    """max |x| over UNROLL blocks of the flat x (NaN if any is NaN), merged into amax (int32 bits: merge_amax)."""
    start = tl.program_id(0).to(tl.int64) * (BLOCK * UNROLL)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in tl.static_range(UNROLL):  # unrolled: the loads are issued together, not one latency each
        offs = start + i * BLOCK + tl.arange(0, BLOCK)
        acc = max_nan(acc, tl.abs(tl.load(x_ptr + offs, mask=offs < numel, other=0.0).to(tl.float32)))
    merge_amax(amax_ptr, tl.reduce(acc, 0, max_nan))


@triton.jit
def _cast_tile(x_ptr, q_ptr, qt_ptr, amax_ptr, scale_ptr, M, N, sxm, sxn, scale_row_stride,
               FMAX: tl.constexpr, OUT: tl.constexpr, FROM_AMAX: tl.constexpr, TRANSPOSED: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr):
    """One [BM, BN] tile of t -> q (row-major [M, N]) and, with TRANSPOSED, q^T (row-major [N, M]). FROM_AMAX: the
    scale from the amax (int32 bits, merge_amax; program (0, 0) stores it); else read at scale_ptr + row x
    scale_row_stride."""
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    rm = pm.to(tl.int64) * BM + tl.arange(0, BM)
    rn = pn.to(tl.int64) * BN + tl.arange(0, BN)
    inside = (rm[:, None] < M) & (rn[None, :] < N)
    x = tl.load(x_ptr + rm[:, None] * sxm + rn[None, :] * sxn, mask=inside, other=0.0).to(tl.float32)
    if FROM_AMAX:
        amax = tl.load(amax_ptr).to(tl.float32, bitcast=True)
        scale = tl.where(amax > 0, (1.0 / amax.to(tl.float64)).to(tl.float32) * FMAX, 1.0)
        if (pm == 0) & (pn == 0):
            tl.store(scale_ptr, scale)
        y = x * scale
    else:
        y = x * tl.load(scale_ptr + rm * scale_row_stride, mask=rm < M, other=1.0)[:, None]
    q = tl.clamp(y, -FMAX, FMAX, propagate_nan=tl.PropagateNan.ALL).to(OUT)
    tl.store(q_ptr + rm[:, None] * N + rn[None, :], q, mask=inside)
    if TRANSPOSED:
        tl.store(qt_ptr + rn[:, None] * M + rm[None, :], tl.trans(q), mask=tl.trans(inside))


def _flat(t: torch.Tensor) -> torch.Tensor:
    """t's elements as one contiguous run (t itself, or the transposed view's storage): the amax reads them in order."""
    if t.is_contiguous():
        return t
    if t.t().is_contiguous():
        return t.t()
    return t.contiguous()


def _write(t: torch.Tensor, dtype: torch.dtype, transposed: bool, amax: torch.Tensor | None,
           scale: torch.Tensor, cast_config: tuple[int, int, int] = (CAST_BM, CAST_BN, CAST_WARPS)) -> tuple:
    """The cast kernel over t, as the contract returns it: (q, scale) or (q, scale, q^T). `amax` (int32 bits): the
    kernel forms the scale from it into `scale`; else it reads `scale` (one, or one a row)."""
    bm, bn, warps = cast_config
    m, n = t.shape
    q = torch.empty((m, n), dtype=dtype, device=t.device)
    qt = torch.empty((n, m), dtype=dtype, device=t.device) if transposed else q
    flat_scale = scale.reshape(-1)
    _cast_tile[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
        t, q, qt, flat_scale if amax is None else amax, flat_scale, m, n, t.stride(0), t.stride(1),
        1 if scale.numel() > 1 else 0, FMAX=torch.finfo(dtype).max, OUT=_FORMATS[dtype], FROM_AMAX=amax is not None,
        TRANSPOSED=transposed, BM=bm, BN=bn, num_warps=warps)
    return (q, scale, qt) if transposed else (q, scale)


def tensorwise(t: torch.Tensor, dtype: torch.dtype, transposed: bool,
               amax_config: tuple[int, int, int] | None = None,
               cast_config: tuple[int, int, int] | None = None) -> tuple:
    """One scale: the amax kernel, then the cast kernel forming the scale from it. The configs (the bench's sweep):
    (block, warps, blocks a program) and (BM, BN, warps); default the module's."""
    block, warps, unroll = amax_config or (AMAX_BLOCK, AMAX_WARPS, AMAX_UNROLL)
    flat = _flat(t)
    amax = torch.zeros((), dtype=torch.int32, device=t.device)
    _amax[(triton.cdiv(flat.numel(), block * unroll),)](flat, amax, flat.numel(), BLOCK=block, UNROLL=unroll,
                                                        num_warps=warps)
    scale = torch.empty((), dtype=torch.float32, device=t.device)
    return _write(t, dtype, transposed, amax, scale, cast_config or (CAST_BM, CAST_BN, CAST_WARPS))


def cast(t: torch.Tensor, dtype: torch.dtype, dim: int | None, pow2: bool, transposed: bool = False,
         amax: torch.Tensor | None = None) -> tuple:
    """The fp8_cast contract (register.toml). One scale: `tensorwise` (two kernels), or with a known `amax` the cast
    kernel alone. A scale per row or a power-of-two scale: the baseline's scale (eager), then the cast kernel."""
    if dtype not in _FORMATS:
        raise KernelLoadError("fp8_cast", "triton", "engine.ops.fp8_cast.triton_cast:cast",
                              f"no Triton cast to {dtype} (it has E4M3 and E5M2)", "use --op-fp8-cast baseline")
    check_cast(transposed, dim, pow2, amax)
    if not t.is_cuda or t.dim() != 2 or t.numel() == 0:
        raise ValueError(f"fp8_cast (triton) casts 2-D CUDA operands; got {tuple(t.shape)} on {t.device}: use "
                         f"--op-fp8-cast baseline")
    if amax is not None:  # the kernel reads the amax's bits as int32 (_amax writes it so)
        scale = torch.empty((), dtype=torch.float32, device=t.device)
        return _write(t, dtype, transposed, amax.reshape(()).view(torch.int32), scale)
    if dim is None and not pow2:
        return tensorwise(t, dtype, transposed)
    return _write(t, dtype, transposed, None, amax_scale(t, dtype, dim, pow2))
