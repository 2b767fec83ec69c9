"""fp8_cast compiled: the baseline cast (engine/distributed/fp8.py `cast`) with its elementwise part (fp32 multiply,
clamp, round-to-nearest-even cast; with `transposed`, the transpose's row-major copy too) compiled by torch.compile
(engine/ops/inductor.py). The amax and the scale stay the baseline's eager code, so the result equals the baseline
bit for bit. A graph per shape (a run casts a dozen shapes): inductor then writes q and its transpose's row-major
copy in one tiled kernel, 1.4-1.7x faster than the dynamic-shape graph's two (bench/compiled_shapes.py on an H200);
from 2^27 elements on two kernels are faster still (q, then q^T from q: SPLIT_NUMEL).

Why each of these: docs/fp8.md, "Speed: the casts fused" and "the cast writes the layout backward takes".
"""

import torch

from engine.distributed.fp8 import E4M3, E5M2, amax_scale, check_transposed, scaled_cast
from engine.errors import KernelLoadError
from engine.ops.inductor import CompiledKernel

__all__ = ["cast"]

ENTRY = "engine.ops.fp8_cast.compiled:cast"


def _kernel(fn, options: dict | None = None) -> CompiledKernel:
    return CompiledKernel(fn, "fp8_cast", "compiled", ENTRY, "use --op-fp8-cast baseline", dynamic=False,
                          options=options)


def _writer(dtype: torch.dtype, transposed: bool, options: dict | None = None) -> CompiledKernel:
    def write(t: torch.Tensor, scale: torch.Tensor):
        q = scaled_cast(t, scale, dtype).contiguous()
        return (q, q.t().contiguous()) if transposed else q
    return _kernel(write, options)


# (format, with the transpose's row-major copy) -> the compiled write
_COMPILED = {(dtype, transposed): _writer(dtype, transposed) for dtype in (E4M3, E5M2) for transposed in (False, True)}

# From this many elements on, q^T is copied from q by a second kernel rather than written beside q by the first:
# there inductor's one tiled kernel writing both layouts moves ~1.8-2.3 TB/s and the two kernels ~2.4-2.9 TB/s
# (18-31 % less device time at 8192 x 16384, 8192 x 32768 and 32768 x 4096 on an H200; bench/compiled_shapes.py,
# `split cdt`: both with inductor's coordinate-descent tile tuning, as here). Below it a second call's host time
# (~90 us) outweighs what it saves. The bytes are the same either way (a transpose of q is exact).
SPLIT_NUMEL = 1 << 27
_TUNED = {"coordinate_descent_tuning": True}
_SPLIT = {dtype: _writer(dtype, False, _TUNED) for dtype in (E4M3, E5M2)}
_TRANSPOSE = _kernel(lambda q: q.t().contiguous(), _TUNED)


def cast(t: torch.Tensor, dtype: torch.dtype, dim: int | None, pow2: bool, transposed: bool = False) -> tuple:
    """The fp8_cast contract (register.toml): the baseline's scale, the compiled scaled cast (with `transposed`, the
    transpose's row-major copy from the same read: (q, scale, q^T); from SPLIT_NUMEL elements on, copied from q by a
    second kernel)."""
    if (dtype, transposed) not in _COMPILED:
        raise KernelLoadError("fp8_cast", "compiled", ENTRY, f"no compiled cast to {dtype} (it has E4M3 and E5M2)",
                              "use --op-fp8-cast baseline")
    check_transposed(transposed, dim)
    scale = amax_scale(t, dtype, dim, pow2)
    if transposed and t.numel() >= SPLIT_NUMEL:
        q = _SPLIT[dtype](t, scale)
        return q, scale, _TRANSPOSE(q)
    out = _COMPILED[dtype, transposed](t, scale)
    return (out[0], scale, out[1]) if transposed else (out, scale)
