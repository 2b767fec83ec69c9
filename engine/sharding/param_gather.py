"""Re-assembling the parameters after a ZeRO-1 optimizer step, overlapped with the next forward.

Each DP rank's optimizer updated only its shard of every bucket. `start()` launches one async
all-gather per bucket, in the order the forward will need them, and returns at once. A forward
pre-hook on the first module that uses a parameter of a bucket waits for that bucket (on NCCL a
stream wait, not a host sync), so the embedding can run while later layers' buckets are still on
the wire. Use points of the decoder: the embedding, each decoder layer (its norms, attention and
MLP), and, for the parameters used after the last layer (final norm, LM head), a forward hook at
the end of the last layer. With overlap off, `start()` waits before it returns.
"""

import torch
from torch import nn

from engine.distributed import ParallelState
from engine.distributed.collectives import all_gather_flat
from engine.optim.buffers import FlatBuffers

__all__ = ["ParamGather", "use_points"]


def use_points(model: nn.Module) -> list[tuple[str, nn.Module, list[nn.Parameter]]]:
    """(hook kind, module, parameters first used there), in forward order, covering every parameter."""
    points: list[tuple[str, nn.Module, list[nn.Parameter]]] = [("pre", model.embed, list(model.embed.parameters()))]
    for layer in model.layers:
        points.append(("pre", layer, list(layer.parameters())))
    seen = {id(p) for _, _, params in points for p in params}
    rest = [p for p in model.parameters() if id(p) not in seen]
    if rest:
        points.append(("post", model.layers[-1], rest))
    return points


class ParamGather:
    def __init__(self, buffers: FlatBuffers, par: ParallelState, model: nn.Module, *, overlap: bool):
        self.buffers, self.par, self.overlap = buffers, par, overlap
        self.active = par.dp_size > 1
        self._pending: dict[int, object] = {}
        bucket_of = {id(e.param): b.index for b in buffers.buckets for e in b.entries}
        order: list[int] = []
        self._hooks = []
        for kind, module, params in use_points(model):
            needed = sorted({bucket_of[id(p)] for p in params if id(p) in bucket_of} - set(order))
            order.extend(needed)
            if self.active and overlap and needed:
                wait = self._waiter(needed)
                if kind == "pre":
                    self._hooks.append(module.register_forward_pre_hook(lambda m, args, w=wait: w()))
                else:
                    self._hooks.append(module.register_forward_hook(lambda m, args, out, w=wait: w()))
        assert sorted(order) == list(range(len(buffers.buckets))), "a bucket has no use point"
        self.order = order  # buckets in the order the forward first needs them

    @property
    def in_flight(self) -> int:
        """Buckets whose all-gather has been launched and not yet waited for."""
        return len(self._pending)

    def _waiter(self, buckets: list[int]):
        def wait() -> None:
            for b in buckets:
                work = self._pending.pop(b, None)
                if work is not None:
                    work.wait()

        return wait

    @torch.no_grad()
    def start(self) -> None:
        """After optimizer.step(): all-gather every bucket's shards (async when overlapping)."""
        if not self.active:
            return
        for index in self.order:
            b = self.buffers.buckets[index]
            work = all_gather_flat(self.buffers.params[b.start:b.end], self.par.dp_rank, self.par.dp_group,
                                   self.par.dp_size, async_op=self.overlap)
            if self.overlap:
                self._pending[index] = work

    def wait_all(self) -> None:
        """Before anything reads the parameters outside a forward (end of run, export)."""
        for index in list(self._pending):
            self._pending.pop(index).wait()
