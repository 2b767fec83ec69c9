"""Inductor as the ops' `compiled` versions use it: a kernel compiled once per input layout, then called directly.

The first call with inputs of a layout (shapes, strides, storage offsets, dtypes, device, and torch's deterministic
flag, which inductor reads) traces the function with those inputs to an aten graph (make_fx) and compiles it with
inductor (torch._inductor.compile: Triton on CUDA, C++ on CPU); later calls of that layout run the compiled code
directly. The graph is static: its index arithmetic divides by constants and its loads vectorise, and a run has a
handful of shapes (bench/compiled_shapes.py). There is no dynamo in the call: torch.compile's frame hook, guards and
wrappers took ~100 us of host time a call on a 2-core Xeon against ~30 us for the compiled code itself
(bench/host_overhead.py), and an FP8 step makes hundreds of these calls (docs/fp8.md, "Host time of a compiled
call"). What dynamo's guards would check, the layout key holds: the functions are pure tensor code of their inputs.

A failure the first time a kernel builds on a device type raises KernelLoadError naming the op and version (never
the eager code in its place); once it has built there, a failure is the call's own and is raised as it is.
"""

from collections.abc import Callable

import torch
import torch._inductor  # guard: allow public-surface -- torch._inductor.compile: inductor on an FX graph, without dynamo
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import _disable_current_modes  # guard: allow public-surface -- no public way to step out of the caller's dispatch modes

from engine.errors import KernelLoadError

__all__ = ["CompiledKernel", "layout"]


def layout(args: tuple[torch.Tensor, ...]) -> tuple:
    """What a compiled graph is specialised to: each input's shape, strides, storage offset, dtype, device and
    inference-ness, and the deterministic flag."""
    return (torch.are_deterministic_algorithms_enabled(),
            *((a.shape, a.stride(), a.storage_offset(), a.dtype, a.device, a.is_inference()) for a in args))


class CompiledKernel:
    """fn compiled by inductor per input layout (inductor `options`, e.g. its tile tuning) for the op version at
    `entry`; call it like fn (tensors in; a tensor or a tuple of tensors out). `fix` ends the KernelLoadError of a
    first failure (which version to use instead)."""

    def __init__(self, fn: Callable, op: str, version: str, entry: str, fix: str, options: dict | None = None):
        self.fn, self.options = fn, options
        self.op, self.version, self.entry, self.fix = op, version, entry, fix
        self._built: set[str] = set()  # device types it compiled for once
        self._compiled: dict[tuple, Callable] = {}  # layout -> the compiled graph

    def __call__(self, *args: torch.Tensor):
        args = tuple(a.detach() for a in args)  # a weight as a plain tensor: no autograd in the graph
        key = layout(args)
        run = self._compiled.get(key)
        if run is None:
            run = self._compiled[key] = self._compile(args)
        out = run(*args)
        return tuple(out) if isinstance(out, list) else out

    def _compile(self, args: tuple[torch.Tensor, ...]) -> Callable:
        device = args[0].device.type
        try:
            # outside any dispatch mode the caller runs under (selective activation checkpointing's): tracing and
            # inductor's own passes run their modes, and the graph is the function's alone
            with _disable_current_modes():
                graph = make_fx(self.fn)(*args)
                compiled = torch._inductor.compile(graph, list(args), options=self.options)  # guard: allow public-surface -- see the import
        except Exception as err:
            if device in self._built:  # it compiled before: this failure is the call's own
                raise
            raise KernelLoadError(self.op, self.version, self.entry,
                                  f"inductor could not build it on {device}: {type(err).__name__}: {str(err)[:500]}",
                                  f"install what inductor needs there (Triton on CUDA, a C++ compiler on CPU) or "
                                  f"{self.fix}") from err
        self._built.add(device)
        return compiled
