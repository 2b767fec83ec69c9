"""fp8_cast compiled: the baseline cast (engine/distributed/fp8.py `cast`) compiled by torch.compile.

Why: in eager torch a cast is five passes over the operand (amax, fp32 copy, multiply, clamp, cast) plus a bf16
transpose copy for dgrad / wgrad; inductor fuses it into an amax reduction and one pointwise kernel that writes the
FP8 copy row-major, transposing on the way. One compiled function per format the recipes use (tensorwise E4M3 and
E5M2, rowwise E4M3 with power-of-two scales), each with dynamic shapes and without duck shaping (an operand whose
two sizes happen to be equal, a square weight, would otherwise compile a graph of its own; weights are passed
detached and with dynamic shapes too), under a recompile limit
of 64 instead of dynamo's 8 (a run's operands, contiguous and transposed, take about ten graphs per format). Past
the limit, and on any compile failure (no Triton, no C++ compiler), the cast raises (fullgraph: dynamo's hard
failure; KernelLoadError at the first cast): never the eager cast in its place.
"""

import torch
import torch._dynamo.config
import torch.fx.experimental._config

from engine.distributed.fp8 import E4M3, E5M2, cast as eager_cast
from engine.errors import KernelLoadError

__all__ = ["cast"]


def _tensor_e4m3(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return eager_cast(t, E4M3, None, False)


def _tensor_e5m2(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return eager_cast(t, E5M2, None, False)


def _rows_e4m3_pow2(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return eager_cast(t, E4M3, -1, True)


_VARIANTS = {(E4M3, None, False): _tensor_e4m3, (E5M2, None, False): _tensor_e5m2, (E4M3, -1, True): _rows_e4m3_pow2}
_COMPILED = {key: torch.compile(fn, dynamic=True, fullgraph=True) for key, fn in _VARIANTS.items()}
_WORKS: set[tuple] = set()  # (variant, device type) pairs that compiled once
RECOMPILE_LIMIT = 64


def _run(key: tuple, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT, force_parameter_static_shapes=False), \
            torch.fx.experimental._config.patch(use_duck_shape=False):
        return _COMPILED[key](t.detach())  # a weight as a plain tensor: one graph for every shape


def cast(t: torch.Tensor, dtype: torch.dtype, dim: int | None, pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp8_cast contract (register.toml), compiled."""
    key = (dtype, dim, bool(pow2))
    if key not in _COMPILED:
        raise KernelLoadError("fp8_cast", "compiled", "engine.ops.fp8_cast.compiled:cast",
                              f"no compiled variant for format {dtype}, dim {dim}, pow2 {pow2} (it has the recipes': "
                              f"{', '.join(f'{d}/{m}/{p}' for d, m, p in _COMPILED)})",
                              "add the variant here or use --op-fp8-cast baseline")
    if (key, t.device.type) in _WORKS:
        return _run(key, t)
    try:
        out = _run(key, t)
    except Exception as err:  # re-raised with op and version: never the eager cast in its place
        raise KernelLoadError("fp8_cast", "compiled", "engine.ops.fp8_cast.compiled:cast",
                              f"torch.compile could not build the cast on {t.device.type}: {type(err).__name__}: "
                              f"{str(err)[:500]}",
                              "install what inductor needs there (Triton on CUDA, a C++ compiler on CPU) or use "
                              "--op-fp8-cast baseline") from err
    _WORKS.add((key, t.device.type))
    return out
