"""torch.compile as the ops' `compiled` versions use it: one compiled function per kernel.

`dynamic`: one graph for every shape (without duck shaping: a weight and an activation of equal sizes are not
assumed equal), or (False) a graph per shape, whose index arithmetic divides by constants and whose loads the
compiler can vectorise: a run has a handful of shapes, and a dynamic kernel that splits or concatenates along a
dimension runs at a fraction of the bandwidth (bench/compiled_shapes.py). Either way a recompile limit of 64, so a
run does not stop at dynamo's default of 8 shapes (past a limit a fullgraph function raises, it never runs eagerly).

The limit and the shape settings are patched around a call only when dynamo may compile in it: the first call with
inputs of a shape, stride, dtype and device in a global state (grad mode, autocast, ...) not met before. Any config
patch makes dynamo re-check its cache: 154 us of host time a call against 83 us without on a 2-core Xeon (docs/fp8.md,
"Host time of a compiled call"), and an FP8 step makes hundreds of these calls; a call like one before finds its
graph and compiles nothing, so it needs no patch. (After torch._dynamo.reset() such a call compiles again under dynamo's
own settings: fine for a static graph, and loud past dynamo's default limit.)

A failure the first time a kernel builds on a device type raises KernelLoadError naming the op and version (never
the eager code in its place); once it has built there, a failure is the call's own and is raised as it is.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch._dynamo.config  # guard: allow public-surface -- dynamo's recompile limit and duck shaping have no public setting
import torch.fx.experimental._config  # guard: allow public-surface -- dynamo's recompile limit and duck shaping have no public setting

from engine.errors import KernelLoadError

__all__ = ["RECOMPILE_LIMIT", "CompiledKernel", "compile_settings"]

RECOMPILE_LIMIT = 64


@contextmanager
def compile_settings() -> Iterator[None]:
    """Dynamo's settings while a kernel may compile: the recompile limit of 64, no duck shaping (module doc)."""
    dynamo = torch._dynamo.config  # guard: allow public-surface -- see the imports
    shapes = torch.fx.experimental._config  # guard: allow public-surface -- see the imports
    with dynamo.patch(recompile_limit=RECOMPILE_LIMIT, force_parameter_static_shapes=False), \
            shapes.patch(use_duck_shape=False):
        yield


def _inputs(args: tuple[torch.Tensor, ...]) -> tuple:
    """What dynamo's tensor guards check of each input (shape, strides, dtype, device, inference-ness), and its
    storage offset: a key finer than the guards costs only a patched call more, a coarser one a recompile unpatched."""
    return tuple((a.shape, a.stride(), a.storage_offset(), a.dtype, a.device, a.is_inference()) for a in args)


class CompiledKernel:
    """fn compiled (fullgraph; `dynamic` shapes or a graph per shape; inductor `options`, e.g. its tile tuning) for
    the op version at `entry`; call it like fn. `fix` ends the KernelLoadError of a first failure (which version to
    use instead)."""

    def __init__(self, fn: Callable, op: str, version: str, entry: str, fix: str, dynamic: bool = True,
                 options: dict | None = None):
        self._fn = torch.compile(fn, dynamic=dynamic, fullgraph=True, options=options)
        self.op, self.version, self.entry, self.fix = op, version, entry, fix
        self._built: set[str] = set()  # device types it compiled for once
        self._met: dict[tuple, list] = {}  # inputs (_inputs) -> the global states they were called in

    def __call__(self, *args: torch.Tensor):
        device = args[0].device.type
        args = tuple(a.detach() for a in args)  # a weight as a plain tensor: one graph for every shape
        states = self._met.setdefault(_inputs(args), [])
        if any(state.check() for state in states):  # met before in this global state: its graph is there
            return self._fn(*args)
        try:
            with compile_settings():
                out = self._fn(*args)
        except Exception as err:
            if device in self._built:  # it compiled before: this failure is the call's own
                raise
            raise KernelLoadError(self.op, self.version, self.entry,
                                  f"torch.compile could not build it on {device}: {type(err).__name__}: "
                                  f"{str(err)[:500]}",
                                  f"install what inductor needs there (Triton on CUDA, a C++ compiler on CPU) or "
                                  f"{self.fix}") from err
        self._built.add(device)
        states.append(torch._C._dynamo.guards.GlobalStateGuard())  # guard: allow public-surface -- dynamo's own record of the global state its guards check
        return out
