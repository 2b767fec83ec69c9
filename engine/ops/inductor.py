"""torch.compile as the ops' `compiled` versions use it: one compiled function per kernel.

`dynamic`: one graph for every shape (without duck shaping: a weight and an activation of equal sizes are not
assumed equal), or (False) a graph per shape, whose index arithmetic divides by constants and whose loads the
compiler can vectorise: a run has a handful of shapes, and a dynamic kernel that splits or concatenates along a
dimension runs at a fraction of the bandwidth (bench/compiled_shapes.py). Either way a recompile limit of 64, so a
run never silently drops to eager because it met more shapes than dynamo's default of 8. A failure the first time a
kernel builds on a device type
raises KernelLoadError naming the op and version (never the eager code in its place); once it has built there,
a failure is the call's own and is raised as it is.
"""

from collections.abc import Callable

import torch
import torch._dynamo.config  # guard: allow public-surface -- dynamo's recompile limit and duck shaping have no public setting
import torch.fx.experimental._config  # guard: allow public-surface -- dynamo's recompile limit and duck shaping have no public setting

from engine.errors import KernelLoadError

__all__ = ["RECOMPILE_LIMIT", "CompiledKernel"]

RECOMPILE_LIMIT = 64


class CompiledKernel:
    """fn compiled (fullgraph; `dynamic` shapes or a graph per shape) for the op version at `entry`; call it like fn.
    `fix` ends the KernelLoadError of a first failure (which version to use instead)."""

    def __init__(self, fn: Callable, op: str, version: str, entry: str, fix: str, dynamic: bool = True):
        self._fn = torch.compile(fn, dynamic=dynamic, fullgraph=True)
        self.op, self.version, self.entry, self.fix = op, version, entry, fix
        self._built: set[str] = set()  # device types it compiled for once

    def __call__(self, *args: torch.Tensor):
        device = args[0].device.type
        dynamo = torch._dynamo.config  # guard: allow public-surface -- see the imports
        shapes = torch.fx.experimental._config  # guard: allow public-surface -- see the imports
        try:
            with dynamo.patch(recompile_limit=RECOMPILE_LIMIT, force_parameter_static_shapes=False), \
                    shapes.patch(use_duck_shape=False):
                out = self._fn(*(a.detach() for a in args))  # a weight as a plain tensor: one graph for every shape
        except Exception as err:
            if device in self._built:  # it compiled before: this failure is the call's own
                raise
            raise KernelLoadError(self.op, self.version, self.entry,
                                  f"torch.compile could not build it on {device}: {type(err).__name__}: "
                                  f"{str(err)[:500]}",
                                  f"install what inductor needs there (Triton on CUDA, a C++ compiler on CPU) or "
                                  f"{self.fix}") from err
        self._built.add(device)
        return out
