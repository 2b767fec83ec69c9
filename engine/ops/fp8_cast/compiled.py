"""fp8_cast compiled: the baseline cast (engine/distributed/fp8.py `cast`) with its elementwise part (fp32 multiply,
clamp, round-to-nearest-even cast; with `transposed`, the transpose's row-major copy too) compiled by torch.compile
into one kernel that reads the operand once. The amax and the scale stay the baseline's eager code, so the result
equals the baseline bit for bit. One compiled function per format and layout set, dynamic shapes, no duck shaping,
a recompile limit of 64; any compile failure raises KernelLoadError, never the eager cast in its place.

Why each of these: docs/fp8.md, "Speed: the casts fused" and "the cast writes the layout backward takes".
"""

import torch
import torch._dynamo.config  # guard: allow public-surface -- dynamo's recompile limit and duck shaping have no public setting
import torch.fx.experimental._config  # guard: allow public-surface -- dynamo's recompile limit and duck shaping have no public setting

from engine.distributed.fp8 import E4M3, E5M2, amax_scale, check_transposed, scaled_cast
from engine.errors import KernelLoadError

__all__ = ["cast"]

RECOMPILE_LIMIT = 64
ENTRY = "engine.ops.fp8_cast.compiled:cast"


def _writer(dtype: torch.dtype, transposed: bool):
    def write(t: torch.Tensor, scale: torch.Tensor):
        q = scaled_cast(t, scale, dtype)
        return (q.contiguous(), q.t().contiguous()) if transposed else q.contiguous()
    return torch.compile(write, dynamic=True, fullgraph=True)


# (format, with the transpose's row-major copy) -> the compiled write: both layouts come from one read of t
_COMPILED = {(dtype, transposed): _writer(dtype, transposed) for dtype in (E4M3, E5M2) for transposed in (False, True)}
_WORKS: set[tuple] = set()  # (format, transposed, device type) that compiled once


def _write(t: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, transposed: bool):
    dynamo = torch._dynamo.config  # guard: allow public-surface -- see the imports
    shapes = torch.fx.experimental._config  # guard: allow public-surface -- see the imports
    with dynamo.patch(recompile_limit=RECOMPILE_LIMIT, force_parameter_static_shapes=False), \
            shapes.patch(use_duck_shape=False):
        return _COMPILED[dtype, transposed](t.detach(), scale)  # a weight as a plain tensor: one graph for every shape


def cast(t: torch.Tensor, dtype: torch.dtype, dim: int | None, pow2: bool, transposed: bool = False) -> tuple:
    """The fp8_cast contract (register.toml): the baseline's scale, the compiled scaled cast (with `transposed`, the
    transpose's row-major copy written from the same read: (q, scale, q^T))."""
    if (dtype, transposed) not in _COMPILED:
        raise KernelLoadError("fp8_cast", "compiled", ENTRY, f"no compiled cast to {dtype} (it has E4M3 and E5M2)",
                              "use --op-fp8-cast baseline")
    check_transposed(transposed, dim)
    scale = amax_scale(t, dtype, dim, pow2)
    key = (dtype, transposed, t.device.type)
    try:
        out = _write(t, scale, dtype, transposed)
    except Exception as err:  # re-raised with op and version: never the eager cast in its place
        if key in _WORKS:  # it compiled before: this failure is the call's own
            raise
        raise KernelLoadError("fp8_cast", "compiled", ENTRY,
                              f"torch.compile could not build the cast on {t.device.type}: {type(err).__name__}: "
                              f"{str(err)[:500]}",
                              "install what inductor needs there (Triton on CUDA, a C++ compiler on CPU) or use "
                              "--op-fp8-cast baseline") from err
    _WORKS.add(key)
    return (out[0], scale, out[1]) if transposed else (out, scale)
