"""fp8_cast compiled: the baseline cast (engine/distributed/fp8.py `cast`) compiled by inductor
(engine/ops/inductor.py): with one scale (tensorwise) the amax, the scale and the write (fp32 multiply, clamp,
round-to-nearest-even cast; with `transposed`, the transpose's row-major copy too) in one call; with a scale per row
(rowwise) the baseline's eager scale, then the compiled write. Either way bit for bit the baseline. A graph per
shape (a run casts a dozen shapes): inductor then writes q and its transpose's row-major copy in one tiled kernel,
1.4-1.7x faster than the dynamic-shape graph's two (bench/compiled_shapes.py on an H200); from 2^27 elements on two
kernels are faster still (q, then q^T from q: SPLIT_NUMEL).

Why each of these: docs/fp8.md, "Speed: the casts fused" and "the cast writes the layout backward takes".
"""

import torch

from engine.distributed.fp8 import E4M3, E5M2, amax_scale, check_cast, scale_for, scaled_cast
from engine.errors import KernelLoadError
from engine.ops.inductor import CompiledKernel

__all__ = ["cast"]

ENTRY = "engine.ops.fp8_cast.compiled:cast"


def _kernel(fn, options: dict | None = None) -> CompiledKernel:
    return CompiledKernel(fn, "fp8_cast", "compiled", ENTRY, "use --op-fp8-cast baseline", options=options)


def _scaled(dtype: torch.dtype, transposed: bool, options: dict | None = None) -> CompiledKernel:
    """One tensorwise cast whole in one compiled call: the amax, the scale (the baseline's own scale_for, whose
    reciprocal in fp64 keeps a graph's scale the baseline's bit for bit) and the write (with `transposed`, the
    transpose's row-major copy too). One call instead of the eager amax and scale and a compiled write: ~60-75 us
    less host time a cast (bench/host_overhead.py), and the scale's small kernels inside the graph."""

    def cast(t: torch.Tensor):
        scale = scale_for(torch.linalg.vector_norm(t, ord=float("inf"), dtype=torch.float32), dtype)
        q = scaled_cast(t, scale, dtype).contiguous()
        return (q, scale, q.t().contiguous()) if transposed else (q, scale)
    return _kernel(cast, options)


def _writer(dtype: torch.dtype, transposed: bool = False) -> CompiledKernel:
    """The write alone, for a scale per row or rounded to a power of two (rowwise), or formed from a known amax: the
    scale stays eager; with `transposed` (one scale), the transpose's row-major copy too."""
    def write(t: torch.Tensor, scale: torch.Tensor):
        q = scaled_cast(t, scale, dtype).contiguous()
        return (q, q.t().contiguous()) if transposed else q
    return _kernel(write)


FORMATS = (E4M3, E5M2)
# tensorwise: (format, with the transpose's row-major copy) -> the whole cast compiled; rowwise: format -> the write
_COMPILED = {(dtype, transposed): _scaled(dtype, transposed) for dtype in FORMATS for transposed in (False, True)}
_WRITE = {(dtype, transposed): _writer(dtype, transposed) for dtype in FORMATS for transposed in (False, True)}

# From this many elements on, q^T is copied from q by a second kernel rather than written beside q by the first:
# there inductor's one tiled kernel writing both layouts moves ~1.8-2.3 TB/s and the two kernels ~2.4-2.9 TB/s
# (18-31 % less device time at 8192 x 16384, 8192 x 32768 and 32768 x 4096 on an H200; bench/compiled_shapes.py,
# `split cdt`: both with inductor's coordinate-descent tile tuning, as here). Below it a second call's host time
# (~90 us when measured, ~35 us since CompiledKernel calls inductor's code without dynamo) outweighs what it saves.
# The bytes are the same either way (a transpose of q is exact).
SPLIT_NUMEL = 1 << 27
_TUNED = {"coordinate_descent_tuning": True}
_SPLIT = {dtype: _scaled(dtype, False, _TUNED) for dtype in FORMATS}
_TRANSPOSE = _kernel(lambda q: q.t().contiguous(), _TUNED)


def cast(t: torch.Tensor, dtype: torch.dtype, dim: int | None, pow2: bool, transposed: bool = False,
         amax: torch.Tensor | None = None) -> tuple:
    """The fp8_cast contract (register.toml). One scale (tensorwise): amax, scale and write in one compiled call
    (with `transposed`, the transpose's row-major copy from the same read: (q, scale, q^T); from SPLIT_NUMEL elements
    on, copied from q by a second kernel). A scale per row or a power-of-two scale: the baseline's scale (eager),
    then the compiled write. A known `amax`: its scale (eager), then the compiled write of q (and q^T)."""
    if dtype not in FORMATS:
        raise KernelLoadError("fp8_cast", "compiled", ENTRY, f"no compiled cast to {dtype} (it has E4M3 and E5M2)",
                              "use --op-fp8-cast baseline")
    check_cast(transposed, dim, pow2, amax)
    if amax is not None:
        scale = scale_for(amax, dtype)
        if not transposed:
            return _WRITE[dtype, False](t, scale), scale
        q, qt = _WRITE[dtype, True](t, scale)
        return q, scale, qt
    if dim is not None or pow2:
        scale = amax_scale(t, dtype, dim, pow2)
        return _WRITE[dtype, False](t, scale), scale
    if transposed and t.numel() >= SPLIT_NUMEL:
        q, scale = _SPLIT[dtype](t)
        return q, scale, _TRANSPOSE(q)
    return _COMPILED[dtype, transposed](t)
