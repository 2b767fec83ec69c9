"""Flat, bucketed buffers for parameters and their fp32 gradients (Megatron's layout).

Why and how: docs/engine/optim.md, section `engine/optim/buffers.py`.
"""

from dataclasses import dataclass

import torch
from torch import nn

from engine.distributed import MainGrad, attach_main_grad

__all__ = ["Entry", "Bucket", "FlatBuffers"]

_ALIGN = 64  # elements; keeps every view 128/256-byte aligned for vectorised kernels


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


@dataclass(frozen=True)
class Entry:
    name: str
    param: nn.Parameter
    start: int  # offset in the flat buffers
    numel: int

    @property
    def end(self) -> int:
        return self.start + self.numel


@dataclass(frozen=True)
class Bucket:
    index: int
    start: int
    end: int  # padded end; (end - start) % dp_size == 0
    entries: tuple[Entry, ...]


class FlatBuffers:
    def __init__(self, model: nn.Module, *, dp_size: int = 1, bucket_numel: int = 40_000_000, fuse_wgrad: bool = False,
                 lazy_zero: bool = True):
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        assert named, "model has no trainable parameters"
        dtype, device = named[0][1].dtype, named[0][1].device
        self.dp_size = dp_size
        entries: list[Entry] = []
        buckets: list[Bucket] = []
        offset = bucket_start = 0
        current: list[Entry] = []
        for name, param in reversed(named):
            entry = Entry(name, param, offset, param.numel())
            entries.append(entry)
            current.append(entry)
            offset = _round_up(entry.end, _ALIGN)
            if offset - bucket_start >= bucket_numel:
                end = _round_up(offset, dp_size * _ALIGN)
                buckets.append(Bucket(len(buckets), bucket_start, end, tuple(current)))
                offset = bucket_start = end
                current = []
        if current:
            end = _round_up(offset, dp_size * _ALIGN)
            buckets.append(Bucket(len(buckets), bucket_start, end, tuple(current)))
            offset = end
        self.entries = tuple(entries)
        self.buckets = tuple(buckets)
        self.numel = offset
        self.params = torch.zeros(self.numel, dtype=dtype, device=device)
        self.grads = torch.zeros(self.numel, dtype=torch.float32, device=device)
        for e in self.entries:
            view = self.params[e.start:e.end].view_as(e.param)
            view.copy_(e.param.detach())
            e.param.data = view
        self._main_grads: list[MainGrad] = []  # the fused parameters' gradient views (fuse_wgrad)
        # Fused, every parameter's view is a MainGrad that a step's first contribution writes: zero_grads clears
        # nothing (--cuda-graphs too: engine/cuda_graph.py replays the captured writes as a step's first micro-batch).
        # lazy_zero False clears the buffer every step (tests/engine/always_add.py, the A/B against it).
        self.lazy_zero = lazy_zero and fuse_wgrad
        self._hooks = [e.param.register_post_accumulate_grad_hook(self._make_hook(e, fuse_wgrad)) for e in self.entries]

    def _make_hook(self, entry: Entry, fuse_wgrad: bool):
        main = self.grads[entry.start:entry.end].view_as(entry.param)
        fused = MainGrad(main) if fuse_wgrad else None
        if fused is not None:
            attach_main_grad(entry.param, fused)
            self._main_grads.append(fused)

        def hook(param: torch.Tensor) -> None:
            if fused is None:
                main.add_(param.grad)
            elif not fused.take():  # a fused backward already added it: the grad is a placeholder
                fused.add(param.grad)
            param.grad = None

        return hook

    def grad_view(self, entry: Entry) -> torch.Tensor:
        return self.grads[entry.start:entry.end].view_as(entry.param)

    def zero_grads(self) -> None:
        """Start a step's gradients. Lazily (fused): each view keeps the last step's values until its first
        contribution writes it (MainGrad) or `settle` zeroes it; the padding between views is zero from the start
        and stays so (the collectives sum and copy its zeros)."""
        if not self.lazy_zero:
            self.grads.zero_()
        for main in self._main_grads:
            main.reset(zeroed=not self.lazy_zero)

    def unwritten(self) -> list[MainGrad]:
        """The fused views no contribution has reached yet this step (engine/cuda_graph.py: those a captured first
        micro-batch writes are the ones this loses while it captures)."""
        return [main for main in self._main_grads if not main.written]

    def settle(self) -> None:
        """After a step's last backward, before its gradients are reduced or read: zero the views nothing wrote."""
        for main in self._main_grads:
            main.settle()

    def shard_ranges(self, dp_rank: int) -> list[tuple[int, int]]:
        """The [start, end) ranges of the flat buffers this DP rank's optimizer owns, one per bucket."""
        ranges = []
        for b in self.buckets:
            size = (b.end - b.start) // self.dp_size
            ranges.append((b.start + dp_rank * size, b.start + (dp_rank + 1) * size))
        return ranges
